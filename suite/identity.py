"""What identifies a run: its id, its group key, its axes and identity tags, its hardware pins.

A run id is a hash of the resolved, semantic configuration (docs/architecture.md, "Hardware
choices: one run id, one numerics"): re-running the same command finds the same run directory,
sweeps skip finished cells, reports average only runs that differ by their seed. Everything
here reads a composed config (suite.config ``compose_config``), re-exported from suite.config.
"""

from __future__ import annotations

import hashlib
import os
import json

from omegaconf import DictConfig, OmegaConf

# Keys that change where results go or how fast they arrive, not what is computed: left out of
# the run id's hash and of the MLflow params (docs/architecture.md, "MLflow experiments and runs").
NON_SEMANTIC = ("tracking", "out_dir", "threads", "warm_start.cache_dir", "backend.recipe", "backend.dataset",
                "backend.eval_after_train", "backend.val_max_new_tokens")
# Keys added after runs were recorded, with the value that computes what those runs computed: left
# out of the hash and the params while they hold it, so a config composed before they existed keeps
# its run id (and a report matches its params). A new key whose default changes no numerics goes here.
OMITTED_AT_DEFAULT = {
    "quant.weight_bits": 4,
    "quant.lm_head": False,
    "quant.outlier_alpha": 1.0,
    "quant.outlier_channels": 4,
    "task.eval_rollout_copy": False,
    "train.grad_probe_every": 0,
    "train.lr_factor": 1.0,
    "correction.tbpo_seq_weight": "geomean",
    # the verl backend's recipe settings (suite.verl.config): verl's own behaviour without them
    "backend.val_n": 1,
    "backend.val_top_p": 1.0,
    "backend.lr_warmup_steps": -1,
    "backend.use_dynamic_bsz": False,
    "backend.ppo_max_token_len_per_gpu": 16384,
    "backend.log_prob_max_token_len_per_gpu": 16384,
    "backend.gradient_checkpointing": True,
    "backend.remove_padding": True,
    "backend.max_ckpt_to_keep": 0,
    "backend.param_dtype": "bf16",
    "backend.sequence_parallel_size": 1,
    "backend.param_offload": False,
    "backend.optimizer_offload": False,
    "backend.ref_param_offload": False,
    "backend.fsdp_size": -1,
    "backend.max_position_embeddings": 0,
    "backend.entropy_coeff": 0.0,
}
# What every run, tag and report row of a verl W4A16 rollout on quant.w4a16_kernels=emulated says.
W4A16_EMULATED_NOTE = "W4A16 numerics on bf16 kernels"


def emulated_w4a16(cfg: DictConfig) -> bool:
    """A verl W4A16 run on bf16 kernels (fake-quantized weights), not vLLM's int4 kernel."""
    return (cfg.backend.name == "verl" and cfg.quant.precision == "w4a16"
            and cfg.quant.get("w4a16_kernels", "int4") == "emulated")


# Keys that mean something only for some runs: left out of the hash and the params elsewhere.
# quant.w4a16_kernels is in the id of every verl W4A16 run (int4 and emulated compute differently,
# and runs recorded before int4 kernels existed were emulated ones: their ids must not be reused).
CONDITIONAL = {"quant.w4a16_kernels": lambda data: data.get("backend", {}).get("name") == "verl"
               and data.get("quant", {}).get("precision") == "w4a16"}


def resolve_hardware(cfg: DictConfig) -> None:
    """Replace every machine-dependent ``auto`` (``train.autocast``, ``quant.kernels``,
    ``quant.bf16_kernels``) by the concrete choice for this machine, in place (suite.hardware).

    Runs at compose time, so the resolved values are in the printed config, the params and the
    run id. The verl backend keeps them as written: its numerics are verl's and vLLM's."""
    if cfg.backend.name != "embedded":
        return
    from suite import hardware

    q = cfg.quant
    cfg.train.autocast = hardware.resolve_autocast(cfg.train.autocast)
    q.kernels = hardware.resolve_kernels(q.kernels, q.precision, q.fp8_granularity)
    q.bf16_kernels = hardware.resolve_bf16_kernels(q.bf16_kernels, q.precision)


def hardware_pins(cfg: DictConfig) -> list[str]:
    """Overrides that fix a composed config's resolved hardware choices wherever it is composed
    again (a sweep cell re-composed on a compute node of another type)."""
    if cfg.backend.name != "embedded":
        return []
    return [f"train.autocast={cfg.train.autocast}", f"quant.kernels={cfg.quant.kernels}",
            f"quant.bf16_kernels={cfg.quant.bf16_kernels}"]


def semantic_config(cfg: DictConfig, drop: tuple[str, ...] = ()) -> dict:
    """The resolved config without its non-semantic keys (and ``drop``): what the run id hashes
    and what a run logs as its MLflow params."""
    data = OmegaConf.to_container(cfg, resolve=True)
    for key in NON_SEMANTIC + drop + tuple(OMITTED_AT_DEFAULT):
        node, leaf = _parent(data, key)
        if key not in OMITTED_AT_DEFAULT or (leaf in node and _same(node[leaf], OMITTED_AT_DEFAULT[key])):
            node.pop(leaf, None)
    for key, applies in CONDITIONAL.items():
        if not applies(data):
            node, leaf = _parent(data, key)
            node.pop(leaf, None)
    return data


def _parent(data: dict, key: str) -> tuple[dict, str]:
    """(the dict that holds dotted ``key``'s leaf, the leaf); an absent section is an empty dict."""
    *parents, leaf = key.split(".")
    node = data
    for p in parents:
        node = node.get(p, {})
    return node, leaf


def _same(value, default) -> bool:
    return type(value) is type(default) and value == default if isinstance(default, bool) else value == default


def _semantic_digest(cfg: DictConfig, drop: tuple[str, ...] = ()) -> str:
    """sha256 prefix of the resolved config without its non-semantic keys (and ``drop``)."""
    data = semantic_config(cfg, drop)
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def run_id(cfg: DictConfig) -> str:
    """Deterministic id of a run: a hash of its resolved, semantic configuration.

    Re-running the same command finds the same run directory and resumes it; sweeps use it to
    skip finished cells. Resolved hardware choices (`resolve_hardware`) are part of it.
    """
    return f"{axes_label(cfg)}-{_semantic_digest(cfg)}"


def group_key(cfg: DictConfig) -> str:
    """The run id's hash without the seed: runs with equal keys differ only by their seed, so
    a report may average them (and only them) as repeats of one cell."""
    return _semantic_digest(cfg, drop=("seed",))


def recipe_deviations(cfg: DictConfig) -> list[str]:
    """The values of a run composed with a paper recipe (``backend.recipe``) that differ from the
    recipe's, as ``key=value (recipe: value)``: a sweep axis over a key the recipe sets (``uaq.s`` on
    qurl-gsm8k, ``quant`` on qarl-math) is allowed, and said in the run's name, tags and report row."""
    from suite.recipes import RECIPES, resolved_values

    name = cfg.backend.get("recipe", "") if cfg.backend.name != "embedded" else ""
    if name not in RECIPES:
        return []
    recipe = RECIPES[name]
    chosen = {"backend": cfg.backend.name, "algo": cfg.algo.name, "quant": cfg.quant.precision,
              "correction": cfg.correction.mode}
    out = [f"{g}={chosen[g]} (recipe: {v})" for g, v in recipe.groups.items() if chosen.get(g) != v]
    for key, v in resolved_values(name).items():
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        if not _equal(got, v.value):
            out.append(f"{key}={got} (recipe: {v.value})")
    return out


def _equal(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def identity_tags(cfg: DictConfig) -> dict[str, str]:
    """MLflow tags beside the axes that say which numerics a run computed with (every backend);
    a run composed with a paper recipe also carries the recipe and where it departs from it."""
    embedded = cfg.backend.name == "embedded"
    recipe = {} if embedded or not cfg.backend.get("recipe", "") else {
        "recipe": str(cfg.backend.recipe), "recipe_deviations": "; ".join(recipe_deviations(cfg))}
    return {**recipe,
        # verl: FSDP's mixed-precision parameter dtype (backend.param_dtype; bf16 = verl's default)
        "trainer_dtype": cfg.train.autocast if embedded else cfg.backend.get("param_dtype", "bf16"),
        "kernels": cfg.quant.kernels if embedded else (W4A16_EMULATED_NOTE if emulated_w4a16(cfg) else "vllm"),
        "bf16_kernels": cfg.quant.bf16_kernels if embedded else "vllm",
        # verl runs per_channel (compressed-tensors FP8) and block (its native FP8) as asked (docs/verl.md)
        "fp8_granularity": cfg.quant.fp8_granularity if cfg.quant.precision == "fp8" else "",
        "uaq_group_lr_s": f"{cfg.uaq.group_lr_s:g}",
        "lr_factor": f"{cfg.train.lr_factor:g}",
        "group_key": group_key(cfg),
    }


def axes(cfg: DictConfig) -> dict[str, str]:
    """The experiment axes of a run, as MLflow tags and analysis columns. A verl run composed
    from a recipe names its dataset as the task and its checkpoint directory as the model (the
    embedded task and model presets do not run there)."""
    b = cfg.backend
    dataset = b.get("dataset", "") if b.name != "embedded" else ""
    model = os.path.basename(os.path.normpath(b.model_path)) if dataset and b.get("model_path") else ""
    return {
        "backend": b.name,
        "precision": cfg.quant.precision,
        "correction": cfg.correction.mode,
        "uaq_s": f"{cfg.uaq.s:g}",
        "algo": cfg.algo.name,
        "task": dataset or cfg.task.name,
        "model": model or cfg.model.preset,
        "aligned_forward": str(bool(cfg.correction.aligned_forward)).lower(),
        "seed": str(cfg.seed),
    }


def axes_label(cfg: DictConfig) -> str:
    a = axes(cfg)
    if a["precision"] == "wa16":  # the weight-only dose axis: its width in the label (w3a16)
        a["precision"] = f"w{cfg.quant.weight_bits}a16"
    return f"{a['algo']}-{a['precision']}-{a['correction']}-s{a['uaq_s']}-{a['task']}-seed{a['seed']}"


# Override keys whose value `run_name` always shows (so a sweep axis over them adds nothing).
_NAMED_KEYS = frozenset({"backend", "backend.name", "quant", "quant.precision", "correction", "correction.mode",
                         "correction.aligned_forward", "uaq.s", "algo", "algo.name", "task", "task.name", "model",
                         "model.preset", "steps", "train.lr", "train.lr_factor", "seed"})


def run_name(cfg: DictConfig, varying: dict[str, str] | None = None) -> str:
    """The MLflow run name (docs/sweeps.md, "What MLflow shows"): the axes, model, steps and
    learning rate, then `key=value` for each other axis in `varying` (a sweep's matrix values of
    this cell), so runs that differ read differently in the runs table. Not an id: the `run_id`
    tag is. `tracking.run_name` overrides it."""
    a = axes(cfg)
    parts = [] if a["backend"] == "embedded" else [a["backend"]]
    lr = cfg.train.lr * cfg.train.lr_factor  # the rate the actor trains at
    parts += [a["algo"], a["precision"], a["correction"] + ("+aligned" if a["aligned_forward"] == "true" else ""),
              f"s{a['uaq_s']}", a["task"], a["model"], f"{cfg.steps}steps", f"lr{lr:g}", f"seed{a['seed']}"]
    extra = [f"{k.lstrip('+')}={v}" for k, v in (varying or {}).items() if k.lstrip("+") not in _NAMED_KEYS]
    if emulated_w4a16(cfg):
        extra.append(f"({W4A16_EMULATED_NOTE})")
    off = recipe_deviations(cfg)
    if off:  # a cell that departs from its paper recipe says so in its name
        extra.append(f"off-recipe {cfg.backend.recipe}: " + ", ".join(d.split(" (")[0] for d in off))
    return " ".join(["-".join(parts), *extra])
