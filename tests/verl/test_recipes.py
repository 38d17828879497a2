"""The paper recipes reach verl as written: the dry run of `suite sweep experiments/paper_tables.yaml
backend=verl recipe=NAME launcher=slurm cluster=...` is parsed, composed against verl's own
``ppo_trainer`` config, and every value of the recipe's table (suite.recipes) is found at its verl
key, so the table and the command cannot drift. Plus the refusals around recipes and clusters."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from suite.recipes import RECIPES, recipe_rows, resolved_values

pytestmark = pytest.mark.verl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAPER = [n for n in RECIPES if n != "laptop"]
AR = "actor_rollout_ref"
# run-config key -> verl key holding the same value
SAME = {
    "rollout.prompts_per_step": "data.train_batch_size",
    "algo.group_size": f"{AR}.rollout.n",
    "train.epochs": f"{AR}.actor.ppo_epochs",
    "backend.micro_batch_size_per_gpu": f"{AR}.actor.ppo_micro_batch_size_per_gpu",
    "backend.max_prompt_length": "data.max_prompt_length",
    "rollout.max_new_tokens": "data.max_response_length",
    "train.lr": f"{AR}.actor.optim.lr",
    "algo.critic_lr": "critic.optim.lr",
    "backend.lr_warmup_steps": f"{AR}.actor.optim.lr_warmup_steps",
    "train.weight_decay": f"{AR}.actor.optim.weight_decay",
    "train.grad_clip": f"{AR}.actor.optim.clip_grad",
    "algo.clip_low": f"{AR}.actor.clip_ratio_low",
    "algo.clip_high": f"{AR}.actor.clip_ratio_high",
    "algo.dual_clip": f"{AR}.actor.clip_ratio_c",
    "algo.agg": f"{AR}.actor.loss_agg_mode",
    "algo.overlong_buffer": "reward.reward_kwargs.overlong_buffer_cfg.len",
    "algo.overlong_penalty": "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor",
    "algo.dynamic_sampling": "algorithm.filter_groups.enable",
    "rollout.temperature": f"{AR}.rollout.temperature",
    "rollout.top_p": f"{AR}.rollout.top_p",
    "rollout.eval_temperature": f"{AR}.rollout.val_kwargs.temperature",
    "backend.val_n": f"{AR}.rollout.val_kwargs.n",
    "backend.val_top_p": f"{AR}.rollout.val_kwargs.top_p",
    "backend.tensor_parallel_size": f"{AR}.rollout.tensor_model_parallel_size",
    "backend.gpu_memory_utilization": f"{AR}.rollout.gpu_memory_utilization",
    "backend.max_num_batched_tokens": f"{AR}.rollout.max_num_batched_tokens",
    "backend.use_dynamic_bsz": f"{AR}.actor.use_dynamic_bsz",
    "backend.ppo_max_token_len_per_gpu": f"{AR}.actor.ppo_max_token_len_per_gpu",
    "backend.log_prob_max_token_len_per_gpu": f"{AR}.rollout.log_prob_max_token_len_per_gpu",
    "backend.gradient_checkpointing": f"{AR}.model.enable_gradient_checkpointing",
    "backend.remove_padding": f"{AR}.model.use_remove_padding",
    "steps": "trainer.total_training_steps",
    "ckpt_every": "trainer.save_freq",
    "eval_every": "trainer.test_freq",
    "backend.max_ckpt_to_keep": "trainer.max_actor_ckpt_to_keep",
}


def _dry_run(tmp_path, recipe: str, cluster: str = "h100x8", *extra: str, model: str = "/models/m"):
    return subprocess.run(
        [sys.executable, "-c", "import sys; from suite.cli import main; sys.argv[0] = 'suite'; main()", "sweep",
         os.path.join(ROOT, "experiments", "paper_tables.yaml"), "backend=verl", f"recipe={recipe}",
         "launcher=slurm", f"cluster={cluster}", f"backend.model_path={model}", "backend.train_files=/data/t.parquet",
         "backend.val_files=/data/v.parquet", f"out_dir={tmp_path / 'runs'}", *extra, "--dry-run"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)


def _cells(stdout: str, tmp_path) -> list[tuple[list[str], list[str]]]:
    """(table row, verl argv) per cell of a SLURM dry run: the rows it prints, the commands its
    preview file holds (`dry-run/commands.sh`, in the cells' order)."""
    rows = [line.split() for line in stdout.splitlines() if line[:1].isdigit()]
    preview = tmp_path / "runs" / "_sweeps" / "paper_tables" / "dry-run" / "commands.sh"
    commands = [shlex.split(line) for line in preview.read_text().splitlines() if line and not line.startswith("#")]
    assert len(rows) == len(commands), (len(rows), len(commands))
    return list(zip(rows, commands))


@pytest.fixture(scope="module")
def composer():
    from suite.verl.translate import VerlConfigComposer

    return VerlConfigComposer()  # verl's defaults composed once; equal to a full compose (tests/verl/test_translate.py)


@pytest.mark.parametrize("name", PAPER)
@pytest.mark.slow
def test_the_dry_run_runs_every_value_of_the_recipe(tmp_path, tiny_qwen2, composer, name):
    from omegaconf import OmegaConf

    from suite.verl.translate import validate_verl_config

    proc = _dry_run(tmp_path, name, "h100x8x4", model=str(tiny_qwen2))
    assert proc.returncode == 0, proc.stderr
    recipe = RECIPES[name]
    values = {k: v.value for k, v in resolved_values(name).items()}
    cells = _cells(proc.stdout, tmp_path)
    assert len(cells) == 33
    header = next(line for line in proc.stdout.splitlines() if line.startswith("cell ")).split()
    # how suite eval will score the cells, each value with its source, before the table
    shown = proc.stdout.split("\ncell ")[0]
    assert f"eval protocol of recipe {name} (suite eval, per benchmark): " in shown
    budget = values.get("backend.val_max_new_tokens") or values["rollout.max_new_tokens"]
    assert f"<= {budget} new tokens" in shown
    for key in ("backend.val_n", "rollout.eval_temperature", "backend.val_top_p"):
        assert f"    {key}={values[key]}  <- {resolved_values(name)[key].source}" in shown, key
    seen_corrections = set()
    for row, argv in cells:
        axes = dict(zip(header, row))
        overrides = argv[3:]
        v = composer.compose(overrides)  # verl's own config: an unknown key fails here
        if axes["uaq.s"] == "1.0":  # verl's check loads the model (the UAQ copy is made at launch)
            validate_verl_config(v)
        for key, verl_key in SAME.items():
            if key in values and not (key.startswith("algo.overlong") and not values["algo.overlong_buffer"]):
                assert OmegaConf.select(v, verl_key) == values[key], (name, key, verl_key)
        mini = values["rollout.prompts_per_step"] // values["train.minibatches"]
        assert v[AR].actor.ppo_mini_batch_size == mini
        assert v[AR].actor.use_kl_loss == (values["algo.kl_coef"] > 0)
        if values["algo.kl_coef"] > 0:
            assert v[AR].actor.kl_loss_coef == values["algo.kl_coef"]
        if values.get("algo.dynamic_sampling"):
            assert v.algorithm.filter_groups.metric == "acc"
            assert v.trainer.use_v1 is True  # the trainer that filters groups
        # the cluster profile's shape, not the backend's defaults
        assert (v.trainer.nnodes, v.trainer.n_gpus_per_node) == (4, 8)
        assert v.algorithm.adv_estimator == ("gae" if recipe.groups["algo"] == "ppo" else "grpo")
        assert bool(v.critic.get("enable")) == (recipe.groups["algo"] == "ppo")
        # the label names the recipe's dataset, not the embedded task
        assert f"-{values['backend.dataset']}-" in row[-1], row
        env = OmegaConf.select(v, "ray_kwargs.ray_init.runtime_env.env_vars", default={}) or {}
        params = json.loads(env.get("SUITE_LOSS_PARAMS", "{}"))
        if axes["correction"] == "tis":
            assert v.algorithm.rollout_correction.rollout_is_threshold == values.get("correction.tis_cap", 2.0)
        elif axes["correction"] in ("acr", "tbpo"):
            for k, val in params.items():
                assert val == values.get(f"correction.{k}", val), (name, k)
            if "correction.tis_cap" in values:
                assert params["tis_cap"] == values["correction.tis_cap"]
        seen_corrections.add(axes["correction"])
        if axes["quant"] in ("int8", "w4a16") and "quant.group_size" in values:
            assert env["SUITE_W4_GROUP_SIZE"] == str(values["quant.group_size"])
    assert seen_corrections == {"naive", "bypass", "tis", "acr"}
    # the recipe's SLURM resources over the profile's; the sweep file has none of its own
    slurm = {k: v.value for k, v in recipe.slurm.items()}
    line = next(x for x in proc.stdout.splitlines() if x.startswith("resources:"))
    assert f"recipe {name}" in line
    for k, val in slurm.items():
        assert f"{k}={val}" in line, line


@pytest.mark.parametrize("name", PAPER)
def test_the_recipe_sets_its_own_values_where_no_axis_does(name):
    """Composed alone (no sweep matrix), every value of the table is the run's, the recipe's
    group choices included, and the label is the recipe's."""
    from omegaconf import OmegaConf

    from suite.config import compose_config

    cfg = compose_config([f"recipe={name}", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v"])
    for key, value, _source in recipe_rows(name):
        if key.startswith("resources."):
            continue
        if key in RECIPES[name].groups:  # a group choice
            got = {"backend": cfg.backend.name, "algo": cfg.algo.name, "quant": cfg.quant.precision,
                   "correction": cfg.correction.mode}[key]
        else:
            got = OmegaConf.select(cfg, key)
        assert got == value, (name, key)
    assert cfg.backend.recipe == name


def test_every_value_has_a_source_and_the_laptop_recipe_changes_no_run():
    from suite.config import compose_config, run_id

    for name in PAPER:
        for key, _value, source in recipe_rows(name):
            assert source.strip(), (name, key)
    assert RECIPES["laptop"].values == {} and not RECIPES["laptop"].groups
    assert run_id(compose_config(["recipe=laptop"])) == run_id(compose_config([]))
    # a recipe's values given by hand make the same run (the recipe name is a label)
    by_recipe = compose_config(["recipe=qurl-gsm8k", "backend.model_path=/m", "backend.train_files=/t",
                                "backend.val_files=/v"])
    by_hand = ["backend=verl", "algo=ppo", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v"]
    by_hand += [f"{k}={v.value}" for k, v in resolved_values("qurl-gsm8k").items()]
    assert run_id(compose_config(by_hand)) == run_id(by_recipe)


@pytest.mark.slow
def test_recipe_refusals_name_the_key_and_the_allowed_values(tmp_path):
    proc = _dry_run(tmp_path, "qurl-nope")
    assert proc.returncode == 2 and "qurl-nope" in proc.stderr
    for name in RECIPES:
        assert name in proc.stderr
    # an algorithm axis that contradicts the recipe's experiment
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from suite.cli import main; sys.argv[0] = 'suite'; main()", "sweep",
         os.path.join(ROOT, "experiments", "main_table.yaml"), "backend=verl", "recipe=qurl-dapo", "launcher=slurm",
         "cluster=h100x8", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v",
         f"out_dir={tmp_path / 'runs'}", "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "recipe=qurl-dapo is an algo=dapo experiment" in proc.stderr, proc.stderr
    # nodes given by hand that contradict the cluster profile
    proc = _dry_run(tmp_path, "qurl-gsm8k", "h100x8x4", "backend.nnodes=2")
    assert proc.returncode == 2 and "backend.nnodes=2 contradicts cluster=h100x8x4 (4)" in proc.stderr, proc.stderr
    # a GPU run on a CPU profile
    proc = _dry_run(tmp_path, "qurl-gsm8k", "cpu")
    assert proc.returncode == 2 and "cluster=cpu has no GPUs" in proc.stderr, proc.stderr
    # nothing was created by any of them
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_dynamic_sampling_runs_on_the_trainer_that_filters_groups():
    """verl 0.9.1 filters DAPO groups in its v1 trainer only: a DAPO run on CPU (whose other runs use
    the legacy trainer) is switched to it, and an override back to the legacy trainer is refused."""
    from suite.config import ConfigError, compose_config
    from suite.verl.translate import compose_verl_config, verl_overrides

    base = ["backend=verl", "algo=dapo", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v",
            "backend.device=cpu", "quant=bf16"]
    with pytest.raises(ConfigError, match="backend.extra_overrides.*trainer.use_v1=false"):
        compose_config([*base, "backend.extra_overrides=[trainer.use_v1=false]"])
    dapo = compose_verl_config(verl_overrides(compose_config(base), "/tmp/r"))
    assert dapo.trainer.use_v1 is True and dapo.algorithm.filter_groups.enable is True
    assert dapo.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    plain = compose_verl_config(verl_overrides(compose_config([*base, "algo.dynamic_sampling=false"]), "/tmp/r"))
    assert plain.trainer.use_v1 is False and plain.algorithm.filter_groups.enable is False


def test_dynamic_batches_must_hold_one_whole_sequence():
    from suite.config import ConfigError, compose_config

    with pytest.raises(ConfigError, match=r"backend.ppo_max_token_len_per_gpu: must hold one whole sequence.*= 10240"):
        compose_config(["recipe=qurl-dapo", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v",
                        "backend.ppo_max_token_len_per_gpu=8192"])


def test_a_missing_path_names_what_the_recipe_needs():
    from suite.config import ConfigError, compose_config

    with pytest.raises(ConfigError, match=r"backend.train_files.*suite data prepare dapo-math-17k"):
        compose_config(["recipe=qurl-dapo", "backend.model_path=/m", "backend.val_files=/v"])
    with pytest.raises(ConfigError, match=r"backend.model_path.*Qwen2.5-0.5B-Instruct"):
        compose_config(["recipe=qurl-gsm8k", "backend.train_files=/t", "backend.val_files=/v"])


def test_docs_recipes_md_is_the_recipes_table():
    from suite.recipes import recipes_markdown

    with open(os.path.join(ROOT, "docs", "recipes.md"), encoding="utf-8") as fh:
        assert fh.read() == recipes_markdown(), "regenerate: python -m suite.recipes > docs/recipes.md"


# Keys a paper recipe leaves to others: the sweep's axes, and what the user gives (paths, cluster shape).
AXIS_PREFIXES = ("quant.", "correction.", "uaq.", "seed")
USER_KEYS = ("backend.model_path", "backend.train_files", "backend.val_files", "backend.nnodes",
             "backend.n_gpus_per_node")
GROUP_KEYS = {"backend": "backend.name", "algo": "algo.name", "quant": "quant.precision",
              "correction": "correction.mode"}


def _leaves(node, prefix: str = "") -> dict:
    """Dotted key -> value of every leaf (an empty mapping has none)."""
    out = {}
    for k, v in node.items():
        if isinstance(v, dict):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _resolved(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)


def _differing(composer, overrides: list[str]) -> dict:
    """verl key -> (translated value, verl's default) for every key on which the translated config
    differs from verl 0.9.1's own defaults. A key verl defines as an interpolation of another, left as
    verl wrote it, follows its source and is not listed; the others are compared resolved."""
    from omegaconf import OmegaConf

    translated = composer.compose(overrides)
    base_raw = _leaves(OmegaConf.to_container(composer.base, resolve=False))
    got_raw = _leaves(OmegaConf.to_container(translated, resolve=False))
    base, got = _leaves(_resolved(composer.base)), _leaves(_resolved(translated))
    out = {}
    for k in set(base) | set(got):
        if isinstance(base_raw.get(k), str) and base_raw[k].startswith("${") and got_raw.get(k) == base_raw[k]:
            continue
        if got.get(k, "<absent>") != base.get(k, "<absent>"):
            out[k] = (got.get(k, "<absent>"), base.get(k, "<absent>"))
    return out


def _suite_choice(verl_key: str) -> bool:
    from suite.verl.translate import SUITE_CHOICES

    return any(verl_key == c or verl_key.startswith(c + ".") for c in SUITE_CHOICES)


@pytest.mark.parametrize("name", PAPER)
def test_what_a_recipe_leaves_open_is_verls_default(composer, name):
    """Composed alone, each paper recipe's verl command differs from verl 0.9.1's own config only
    where the recipe sets a value (or the run's axes, the user's paths and cluster, or one of the
    suite's named choices do): everything the recipe leaves open is verl's default, never the
    embedded backend's (AdamW betas (0.9, 0.99) and GAE lambda 0.95 were)."""
    from suite.config import compose_config
    from suite.verl.translate import verl_key_sources, verl_overrides

    recipe = RECIPES[name]
    cfg = compose_config([f"recipe={name}", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v"])
    set_here = set(recipe.values) | {GROUP_KEYS[g] for g in recipe.groups} | set(USER_KEYS)
    unexplained = []
    for key, (value, default) in sorted(_differing(composer, verl_overrides(cfg, "/tmp/r")).items()):
        if _suite_choice(key):
            continue
        sources = verl_key_sources(key)
        if sources is None or not any(s in set_here or s.startswith(AXIS_PREFIXES) for s in sources):
            unexplained.append(f"{key}={value} (verl: {default}; from {sources})")
    assert not unexplained, f"{name}: values no source chose:\n" + "\n".join(unexplained)
    assert list(cfg.train.betas) == [0.9, 0.999] and (cfg.algo.lam == 1.0)


def test_the_verl_defaults_table_is_verls_own(composer):
    """suite.recipes.VERL_DEFAULTS, given as a run's values, translate to verl's own defaults: every
    key on which the command differs is fed by a key outside the table (or is a suite choice)."""
    from suite.config import compose_config
    from suite.recipes import VERL_DEFAULTS
    from suite.verl.translate import verl_key_sources, verl_overrides

    def hydra(v):
        return "[" + ",".join(map(str, v)) + "]" if isinstance(v, list) else str(v).lower() if isinstance(v, bool) \
            else str(v)

    overrides = ["backend=verl", "algo=ppo", "algo.group_size=1", "backend.model_path=/m", "backend.train_files=/t",
                 "backend.val_files=/v", "quant=bf16", "correction=naive", "uaq.s=1.0",
                 "backend.tensor_parallel_size=2"]
    overrides += [f"{k}={hydra(v)}" for k, (v, _) in VERL_DEFAULTS.items()]
    cfg = compose_config(overrides)
    wrong = []
    for key, (value, default) in sorted(_differing(composer, verl_overrides(cfg, "/tmp/r")).items()):
        sources = verl_key_sources(key)
        if sources is not None and sources and all(s in VERL_DEFAULTS for s in sources):
            wrong.append(f"{key}={value} (verl: {default})")
    assert not wrong, "VERL_DEFAULTS entries that are not verl's defaults:\n" + "\n".join(wrong)


def test_an_axis_that_departs_from_its_recipe_is_run_and_said_everywhere():
    """The rule for a sweep axis over a value the recipe sets (paper_tables.yaml's uaq.s on qurl-gsm8k,
    whose UAQ is off): allowed, and written into the run's name and its tags (its report row:
    tests/report/test_pooling.py)."""
    from suite.config import compose_config
    from suite.identity import identity_tags, recipe_deviations, run_name

    paths = ["backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v"]
    on = compose_config(["recipe=qurl-gsm8k", *paths])
    off = compose_config(["recipe=qurl-gsm8k", *paths, "uaq.s=1.5", "quant=fp8", "quant.fp8_granularity=block"])
    assert recipe_deviations(on) == [] and identity_tags(on)["recipe_deviations"] == ""
    assert recipe_deviations(off) == ["uaq.s=1.5 (recipe: 1.0)"]  # the quant axis is not the recipe's
    assert run_name(off).endswith("off-recipe qurl-gsm8k: uaq.s=1.5") and "off-recipe" not in run_name(on)
    tags = identity_tags(off)
    assert (tags["recipe"], tags["recipe_deviations"]) == ("qurl-gsm8k", "uaq.s=1.5 (recipe: 1.0)")
    qarl = compose_config(["recipe=qarl-math", *paths, "quant=int8"])
    assert recipe_deviations(qarl) == ["quant=int8 (recipe: w4a16)"]
