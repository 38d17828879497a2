"""Typed run configuration: every default in one place, registered in Hydra's ConfigStore.

Swappable parts are config groups (``backend``, ``model``, ``task``, ``quant``,
``correction``, ``algo``); YAML presets and command-line overrides only override. A mistyped
key fails at compose time (Hydra struct mode); a bad value or an impossible combination
fails in :func:`validate`, before anything runs, naming the full key and the allowed values.

    cfg = compose_config(["quant=fp8", "uaq.s=1.0", "algo=dapo"])
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Dict, List, Optional

from hydra import compose, initialize
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from suite import recipes, regimes
from suite.backend import BACKENDS as _BACKEND_PACKAGES

# the backends' sections and the shared value checks (re-exported: the config's API)
from suite.backend_config import (  # noqa: F401
    BACKEND_CHECKS,
    BACKEND_PATHS,
    BackendConfig,
    absolute_paths,
    check_choice,
    check_number,
    check_text,
    register_backend,
)
# overrides: parsed and type-checked before and after composing (re-exported: the config's API)
from suite.overrides import ConfigError, apply_value_overrides, check_override_types, parse_overrides  # noqa: F401
from suite.overrides import check as _check
from suite.core.advantages import ALGORITHMS
from suite.core.losses import CORRECTIONS as _LOSS_REGISTRY
from suite.core.losses import (TBPO_DELTA_NEG_HIGH, TBPO_DELTA_NEG_LOW, TBPO_DELTA_POS, TBPO_SEQ_CAP,
                               TBPO_SEQ_WEIGHT, TBPO_SEQ_WEIGHTS)
from suite.core.quant import FP8_GRANULARITIES, PRECISIONS  # noqa: F401  (PRECISIONS: the quantizer registry)
from suite.core.quant import LOW_BIT_PRECISIONS, WINT_BITS, WINT_GROUP_SIZES
from suite.tracking.mlflow_logger import tracking_uri_problem
# re-exported: a run's identity is part of its config's API
from suite.identity import axes, axes_label, group_key, hardware_pins, identity_tags, resolve_hardware, run_id  # noqa: F401

CORRECTIONS = tuple(_LOSS_REGISTRY)  # suite.core.losses: naive | bypass | tis | acr | tbpo
ALGOS = tuple(ALGORITHMS)  # suite.core.advantages: ppo | grpo | dapo
AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("k1", "k2", "k3")
AUTOCASTS = ("auto", "bf16", "fp32")
KERNEL_CHOICES = ("auto", "native", "emulated")  # quant.kernels, quant.bf16_kernels (suite.hardware)
W4A16_KERNELS = ("int4", "emulated")  # quant.w4a16_kernels (backend=verl; suite.verl.rollout_quant)
TASKS = ("arith", "word")
BACKENDS = tuple(_BACKEND_PACKAGES)  # backend=...: the backends suite.backend lists
# warm_start.flaw_op: auto, none, or the operator of the tasks' traces the flawed teacher skips
# (suite.embedded.tasks.flawed_response; those a task's traces end with: suite.embedded.tasks.flaw_ops)
FLAW_OPS: tuple[str, ...] = ("auto", "none", "+", "-", "*", "/")
MODEL_PRESETS = ("tiny", "small", "base", "large", "wide")


@dataclass
class ModelConfig:
    # tiny (~0.9M params, default and tests) | small (~3M) | base (~12M) | large (~50M) | wide (d_model 512)
    preset: str = "tiny"


@dataclass
class TaskConfig:
    name: str = "arith"  # arith (multi-step arithmetic) | word (GSM8K-style templated problems)
    difficulty: int = 2  # 1 (easiest) .. 4 (word: .. 3); number of reasoning steps and operand range
    n_eval: int = 256  # held-out prompts scored every `eval_every` steps
    # avg@k (QuRL reports AIME avg@32): k samples per held-out prompt at rollout.temperature / top_p,
    # logged as val-core/<task>/acc/mean@k next to the greedy mean@1; 0 = off, else >= 2 (embedded only)
    eval_samples: int = 0
    # also score the quantized rollout copy (greedy, same prompts) at every evaluation, logged as
    # val-aux/<task>/rollout_acc/mean@1 (embedded only; the training trajectory is unchanged)
    eval_rollout_copy: bool = False


@dataclass
class QuantConfig:
    # rollout actor precision: fp32 | bf16 | int8 (W8A8) | fp8 (E4M3) | w4a16 | wa16 (W{weight_bits}A16)
    precision: str = "int8"
    fp8_granularity: str = "per_channel"  # FP8 weight scales: per_tensor | per_channel | block
    block_size: int = 128  # FP8 block edge (entries) when fp8_granularity=block
    # W4A16 / wa16 group size (input entries per scale); clipped to the layer width. wa16: 8 | 16 | 32 | 64 | 128 | 256
    group_size: int = 128
    symmetric: bool = True  # W4A16 / wa16: symmetric (no zero point) or asymmetric
    weight_bits: int = 4  # wa16 weight width in bits: 2 | 3 | 4 | 6 | 8 (the weight-only dose axis); others: 4
    # quantize lm_head like the block linears (vLLM keeps it 16-bit); low-bit precisions, embedded
    lm_head: bool = False
    # Activation-outlier transform (suite.core.outliers, the inverse of SmoothQuant; embedded): outlier_channels
    # channels of each block norm's gain times outlier_alpha, the fed q/k/v/gate/up input columns divided by it,
    # at every use of the weights by the rollout (and the aligned forward). The same function in full precision;
    # per-token W8A8 activations get coarse: the INT8 dose axis. 1.0 = off; powers of two are bit-exact.
    outlier_alpha: float = 1.0
    outlier_channels: int = 4  # channels per norm that carry the outliers, evenly spaced over d_model
    # Embedded engine kernels (suite.hardware): auto resolves at compose time, on the machine that
    # composes, to native (low-precision kernels) or emulated (float32 GEMMs, same numerics; int8
    # bit-identical); the resolved value is part of the run id. Ignored by backend=verl (vLLM's kernels).
    kernels: str = "auto"  # the quantized GEMMs: auto | native | emulated
    bf16_kernels: str = "auto"  # the bf16 matmuls outside them (attention, lm_head): auto | native | emulated
    # backend=verl, quant=w4a16: int4 (vLLM's int4 kernel on a packed compressed-tensors checkpoint: Marlin /
    # Machete on a GPU) | emulated (bf16 kernels on 4-bit-rounded weights: W4A16 numerics, none of its speed)
    w4a16_kernels: str = "int4"


@dataclass
class UAQConfig:
    s: float = 1.5  # UAQ invariant scale (QuRL §4.2); 1.0 disables it. Paper default 1.5, 2.0 unstable
    # The control that separates UAQ from a learning-rate change: no rescaling, but the per-group
    # AdamW learning rates UAQ with this scale implies (fed q/k/v/gate/up weights x s, norm gains
    # / s; suite.core.uaq.uaq_param_groups). 1.0 = off; only with uaq.s=1.0 (embedded backend).
    group_lr_s: float = 1.0


@dataclass
class CorrectionConfig:
    # naive (the papers' uncorrected baseline) | bypass (verl's bypass mode) | tis (FlashRL) | acr (QuRL)
    # | tbpo (QaRL, sequence level); docs/math.md says which paper / implementation each reproduces
    mode: str = "acr"
    tis_cap: float = 2.0  # C: truncation of the IS weight pi_prox / pi_behav (FlashRL used 2 and 8)
    # TBPO bands act on a geometric-mean sequence ratio, which sits near 1: GSPO-sized defaults
    # (suite.core.losses explains the choice; QaRL does not state its values).
    tbpo_delta_pos: float = TBPO_DELTA_POS  # TBPO: positive-advantage sequences clipped above at 1 + delta_pos
    tbpo_delta_neg_low: float = TBPO_DELTA_NEG_LOW  # TBPO: negative-advantage band lower edge 1 - delta_neg_low
    tbpo_delta_neg_high: float = TBPO_DELTA_NEG_HIGH  # TBPO: negative-advantage band upper edge 1 + delta_neg_high
    tbpo_seq_cap: float = TBPO_SEQ_CAP  # TBPO: cap of the sequence-level IS weight w_seq
    # TBPO: w_seq as QaRL's length-normalised geometric mean (geomean) or verl's sequence IS product (product)
    tbpo_seq_weight: str = TBPO_SEQ_WEIGHT
    # QaRL: trainer forward uses the rollout quantizer (fake-quant, STE; W8A8 for int8/fp8)
    aligned_forward: bool = False


@dataclass
class AlgoConfig:
    name: str = "grpo"  # ppo (GAE + critic) | grpo (group-normalised) | dapo
    group_size: int = 8  # G: responses sampled per prompt (1 for ppo is allowed)
    clip_low: float = 0.2  # epsilon_low: ratio clipped below at 1 - clip_low
    clip_high: float = 0.2  # epsilon_high: ratio clipped above at 1 + clip_high (DAPO clip-higher: 0.28)
    dual_clip: Optional[float] = None  # verl clip_ratio_c for negative advantages (e.g. 3.0); null = off
    agg: str = "token-mean"  # loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum
    norm_adv_by_std: bool = True  # GRPO: divide group-centred rewards by the group std (Dr. GRPO: false)
    kl_coef: float = 0.0  # KL-to-reference loss coefficient (0 = no reference model)
    kl_estimator: str = "k3"  # k1 | k2 | k3 (k3 = verl low_var_kl)
    gamma: float = 1.0  # PPO discount
    lam: float = 0.95  # PPO GAE lambda
    critic_lr: float = 1e-3  # PPO critic learning rate
    value_clip: float = 0.5  # PPO value-function clip range
    dynamic_sampling: bool = False  # DAPO: keep groups with 0 < #correct < G, resample to fill the batch
    max_resample_rounds: int = 4  # DAPO: extra generation rounds allowed to fill the batch
    overlong_buffer: int = 0  # DAPO L_cache (tokens) inside max_new_tokens; 0 = no overlong shaping
    overlong_penalty: float = 1.0  # DAPO overlong penalty factor


@dataclass
class RolloutConfig:
    prompts_per_step: int = 8  # prompts per RL step; rollouts per step = prompts_per_step * group_size
    max_new_tokens: int = 32  # response budget (tokens)
    temperature: float = 1.0  # sampling temperature (log-probs are of the tempered distribution)
    top_p: float = 1.0  # nucleus sampling mass
    eval_temperature: float = 0.0  # held-out evaluation decoding (0 = greedy)


@dataclass
class TrainConfig:
    lr: float = 3e-5  # actor AdamW learning rate (5e-4 collapsed, 1e-4 degraded held-out accuracy: README)
    # a learning-rate control's multiplier: the actor trains at lr x lr_factor, and a run with lr_factor != 1 is the
    # control of the same run at 1 (QuRL's "LR x1.5" / "LR x2"); the report pairs runs by it, never by counting LRs
    lr_factor: float = 1.0
    weight_decay: float = 0.0  # AdamW weight decay
    betas: List[float] = field(default_factory=lambda: [0.9, 0.99])  # AdamW betas
    grad_clip: float = 1.0  # max global gradient norm
    epochs: int = 1  # passes over each step's rollouts (ppo_epochs)
    minibatches: int = 2  # optimizer steps per epoch (ppo_mini_batch = rollouts / minibatches)
    # every k steps (0 = never): the naive and TIS policy gradients on the step's whole batch before
    # its first update, compared (actor/grad_probe_cos, actor/grad_probe_norm_ratio); two extra
    # backward passes, the update itself unchanged (embedded only)
    grad_probe_every: int = 0
    # Trainer forward/backward precision (master weights stay fp32). fp32 on every machine by
    # default: an fp32 pi_prox isolates the rollout's quantization mismatch (docs/math.md, "Trainer
    # precision"); bf16 is verl's FSDP mixed precision, the papers' setting; auto = bf16 where the
    # CPU computes bf16 natively (AVX512-BF16 / AMX) or on CUDA, else fp32, resolved at compose time
    # into the run id. On AVX2-only CPUs bf16 runs far slower than fp32 for the backward
    # (docs/bench.md, "Measurements behind the code").
    autocast: str = "fp32"  # fp32 | bf16 | auto (embedded backend)


@dataclass
class WarmStartConfig:
    steps: int = 600  # supervised steps on task traces before RL (0 = RL from scratch)
    batch_size: int = 64  # sequences per supervised step
    lr: float = 3e-3  # supervised learning rate (linear warm-up, cosine to 10%)
    seed: int = 0  # warm-start seed; not the run seed, so seeds of a sweep share one warm start
    # Flawed teacher (suite.embedded.tasks.flawed_response): with probability flaw_prob, a trace whose
    # last step applies flaw_op stops one step short, so RL starts from a policy with a systematic,
    # correctable blind spot, as the papers' pretrained models have. auto = arith "-", word "+".
    # On by default: the default run's RL then raises held-out accuracy clearly (README; docs/bench.md,
    # "Measurements behind the code"); with a clean warm start the errors left are arithmetic facts,
    # which RL at lr 3e-5 barely moves.
    flaw_op: str = "auto"  # none | auto | + | - | * | /
    flaw_prob: float = 0.7  # probability that the flawed teacher writes such a trace (0 = clean warm start)
    cache_dir: str = "${oc.env:SUITE_CACHE,'~/.cache/suite'}/warmstart"  # keyed by everything it depends on


@dataclass
class TrackingConfig:
    tracking_uri: str = "${oc.env:MLFLOW_TRACKING_URI,'sqlite:///mlflow.db'}"  # MLflow store / server
    experiment: str = "suite"  # MLflow experiment name
    run_name: str = ""  # MLflow run name; empty = derived from the axes
    console_every: int = 10  # print a metrics line every N steps (0 = never)
    parent_run_id: str = ""  # MLflow parent run (a sweep's or a study's); set by `suite sweep` / `suite tune`
    tags: Dict[str, str] = field(default_factory=dict)  # extra MLflow tags (e.g. sweep name, trial number)
    # resume even if metrics.jsonl has unreadable lines before its last (they are then deleted); off:
    # the run refuses to start, naming the file and lines
    drop_corrupt_metrics: bool = False


@dataclass
class Config:
    defaults: List[Any] = field(
        # _self_ first: the chosen group options override the dataclass defaults below.
        default_factory=lambda: [
            "_self_",
            {"backend": "embedded"},
            {"model": "tiny"},
            {"task": "arith"},
            {"quant": "int8"},
            {"correction": "acr"},
            {"algo": "grpo"},
            # a paper experiment's model, data and hyper-parameters (suite.recipes); laptop = the above
            {"recipe": "laptop"},
            # optional preset over the choices above (suite.regimes); none by default
            {"regime": None},
        ]
    )
    backend: BackendConfig = field(default_factory=BackendConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    uaq: UAQConfig = field(default_factory=UAQConfig)
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    seed: int = 0  # seeds data, init, sampling; part of the run id
    # RL steps: the default run's gain is in well before the last step (docs/bench.md, "Measurements behind
    # the code"); 150 keeps a fresh run under 5 min
    steps: int = 150
    eval_every: int = 25  # held-out evaluation every N steps (and at the first and last step)
    ckpt_every: int = 20  # checkpoint (and MLflow commit) every N steps
    out_dir: str = "runs"  # run directories live in out_dir/<run_id>
    threads: int = 0  # torch intra-op threads (0 = torch's default)


def _register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="config", node=Config)
    for preset in MODEL_PRESETS:
        cs.store(group="model", name=preset, node=ModelConfig(preset=preset))
    for task in TASKS:
        cs.store(group="task", name=task, node=TaskConfig(name=task))
    for precision in PRECISIONS:
        cs.store(group="quant", name=precision, node=QuantConfig(precision=precision))
    for mode in CORRECTIONS:
        cs.store(group="correction", name=mode, node=CorrectionConfig(mode=mode))
    regimes.register(cs)
    recipes.register(cs)
    for name, algorithm in ALGORITHMS.items():  # suite.core.advantages: each algorithm and its values
        cs.store(group="algo", name=name, node=AlgoConfig(name=name, **algorithm.config))


_register()

_SEED_LIMIT = 2**32  # numpy-compatible seeds; torch's derived seeds (seed * 1_000_003 + k) stay in range


def _check_known_keys(cfg: DictConfig, node: Any = None, prefix: str = "") -> None:
    """Every key of a typed section is a field of its dataclass: Hydra's ``+key=value`` adds keys
    even to struct configs, and an unknown key would only change the run id."""
    node = cfg if node is None else node
    kind = OmegaConf.get_type(node)
    if not (isinstance(kind, type) and is_dataclass(kind)):
        return  # a free dict (tracking.tags): its keys are data
    allowed = {f.name for f in fields(kind)}
    for key in node:
        full = f"{prefix}{key}"
        if key not in allowed:  # the closest keys cost a compose: only for a key that is refused
            _check(False, full, f"unknown key (added with `+`?);{_closest(full, known_keys())} the keys of "
                   f"{prefix.rstrip('.') or 'the config'} are: {', '.join(sorted(allowed - {'defaults'}))}")
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            _check_known_keys(cfg, child, f"{full}.")


def validate(cfg: DictConfig) -> None:
    """Reject bad values and impossible combinations, naming the full key and allowed values."""
    _check_known_keys(cfg)
    check_choice(cfg, "backend.name", BACKENDS)
    check_choice(cfg, "model.preset", MODEL_PRESETS)
    check_choice(cfg, "task.name", TASKS)
    check_choice(cfg, "quant.precision", PRECISIONS)
    check_choice(cfg, "quant.fp8_granularity", FP8_GRANULARITIES)
    check_choice(cfg, "correction.mode", CORRECTIONS)
    check_choice(cfg, "algo.name", ALGOS)
    check_choice(cfg, "algo.agg", AGGS)
    check_choice(cfg, "algo.kl_estimator", KL_ESTIMATORS)
    check_choice(cfg, "train.autocast", AUTOCASTS)
    check_choice(cfg, "quant.kernels", KERNEL_CHOICES)
    check_choice(cfg, "quant.bf16_kernels", KERNEL_CHOICES)
    check_choice(cfg, "quant.w4a16_kernels", W4A16_KERNELS)
    _check(cfg.quant.w4a16_kernels == "int4" or (cfg.backend.name == "verl" and cfg.quant.precision == "w4a16"),
           "quant.w4a16_kernels", "chooses the kernels of backend=verl's W4A16 rollout; with "
           f"backend={cfg.backend.name} quant.precision={cfg.quant.precision} it means nothing (the embedded "
           "engine's are quant.kernels). allowed: int4")
    check_number(cfg, "uaq.s", 0, lo_open=True)
    check_number(cfg, "uaq.group_lr_s", 0, lo_open=True)
    s, gs = cfg.uaq.s, cfg.uaq.group_lr_s
    _check(gs == 1.0 or s == 1.0, "uaq.group_lr_s",
           f"is the per-group-learning-rate control for UAQ (uaq.s=1.0 with the rates uaq.s={gs:g} implies); "
           f"with uaq.s={s:g} set one of them to 1.0")
    check_number(cfg, "task.difficulty", 1, 4)
    check_number(cfg, "task.n_eval", 1)
    _check(cfg.task.eval_samples == 0 or cfg.task.eval_samples >= 2, "task.eval_samples",
           f"must be 0 (off) or >= 2 (mean@1 is the rollout.eval_temperature accuracy), got {cfg.task.eval_samples}")
    check_number(cfg, "quant.block_size", 1)
    check_number(cfg, "quant.group_size", 2)
    q = cfg.quant
    if q.precision == "wa16":
        check_choice(cfg, "quant.weight_bits", WINT_BITS)
        check_choice(cfg, "quant.group_size", WINT_GROUP_SIZES)
    else:
        _check(q.weight_bits == 4, "quant.weight_bits",
               f"is the width of quant=wa16 ({'|'.join(map(str, WINT_BITS))}); quant.precision={q.precision} "
               f"has its own. allowed: 4 (or quant=wa16)")
    _check(not q.lm_head or q.precision in LOW_BIT_PRECISIONS, "quant.lm_head",
           f"quantizes lm_head with a low-bit rollout ({'|'.join(LOW_BIT_PRECISIONS)}); "
           f"quant.precision={q.precision} has none. allowed: false")
    check_number(cfg, "quant.outlier_alpha", 0, lo_open=True)
    check_number(cfg, "quant.outlier_channels", 1)
    check_number(cfg, "algo.group_size", 1)
    check_number(cfg, "algo.clip_low", 0, 1, lo_open=True, hi_open=True)
    check_number(cfg, "algo.clip_high", 0, lo_open=True)
    if cfg.algo.dual_clip is not None:
        check_number(cfg, "algo.dual_clip", 1, lo_open=True)  # verl clip_ratio_c, or null
    check_number(cfg, "algo.kl_coef", 0)
    check_number(cfg, "algo.gamma", 0, 1)
    check_number(cfg, "algo.lam", 0, 1)
    check_number(cfg, "algo.critic_lr", 0, lo_open=True)
    check_number(cfg, "algo.value_clip", 0, lo_open=True)
    check_number(cfg, "algo.max_resample_rounds", 0)
    check_number(cfg, "algo.overlong_buffer", 0)
    check_number(cfg, "algo.overlong_penalty", 0)
    check_number(cfg, "correction.tis_cap", 1)
    check_number(cfg, "correction.tbpo_seq_cap", 1)
    check_choice(cfg, "correction.tbpo_seq_weight", TBPO_SEQ_WEIGHTS)
    for k in ("tbpo_delta_pos", "tbpo_delta_neg_high"):
        check_number(cfg, f"correction.{k}", 0, lo_open=True)
    check_number(cfg, "correction.tbpo_delta_neg_low", 0, 1, lo_open=True, hi_open=True)
    check_number(cfg, "rollout.prompts_per_step", 1)
    check_number(cfg, "rollout.max_new_tokens", 1)
    # > 0: RL log-probs need a proper (tempered) distribution
    check_number(cfg, "rollout.temperature", 0, lo_open=True)
    check_number(cfg, "rollout.top_p", 0, 1, lo_open=True)
    check_number(cfg, "rollout.eval_temperature", 0)
    check_number(cfg, "train.lr", 0, lo_open=True)
    check_number(cfg, "train.lr_factor", 0, lo_open=True)
    check_number(cfg, "train.weight_decay", 0)
    betas = cfg.train.betas
    _check(betas is not None and len(betas) == 2, "train.betas", f"must be a list of two numbers [beta1, beta2], got "
           f"{OmegaConf.to_container(betas) if betas is not None else None}")
    for i in range(2):
        check_number(cfg, f"train.betas.{i}", 0, 1, hi_open=True)  # torch.optim.AdamW: 0 <= beta < 1
    # > 0: torch's clip_grad_norm_ with a negative max norm flips every gradient (gradient ascent)
    check_number(cfg, "train.grad_clip", 0, lo_open=True)
    check_number(cfg, "train.epochs", 1)
    check_number(cfg, "train.grad_probe_every", 0)
    check_number(cfg, "train.minibatches", 1)
    check_number(cfg, "seed", 0, _SEED_LIMIT, hi_open=True)
    check_number(cfg, "steps", 1)
    check_number(cfg, "eval_every", 1)
    check_number(cfg, "ckpt_every", 1)
    check_number(cfg, "threads", 0)
    check_text(cfg, "out_dir")
    check_number(cfg, "warm_start.steps", 0)
    check_number(cfg, "warm_start.batch_size", 1)
    check_number(cfg, "warm_start.lr", 0, lo_open=True)
    check_number(cfg, "warm_start.seed", 0, _SEED_LIMIT, hi_open=True)
    check_choice(cfg, "warm_start.flaw_op", FLAW_OPS)
    check_number(cfg, "warm_start.flaw_prob", 0, 1)
    check_text(cfg, "warm_start.cache_dir")
    check_text(cfg, "tracking.experiment")
    check_text(cfg, "tracking.tracking_uri")
    uri_problem = tracking_uri_problem(cfg.tracking.tracking_uri)
    _check(uri_problem is None, "tracking.tracking_uri", uri_problem or "")
    check_number(cfg, "tracking.console_every", 0)

    algo = cfg.algo.name
    critic = ALGORITHMS[algo].critic  # token-level advantages against a value model (ppo)
    if not critic:
        _check(cfg.algo.group_size >= 2, "algo.group_size", f"{algo} normalises rewards within a group: needs >= 2")
    rollouts = cfg.rollout.prompts_per_step * cfg.algo.group_size
    _check(
        rollouts % cfg.train.minibatches == 0,
        "train.minibatches",
        f"must divide rollout.prompts_per_step * algo.group_size = {rollouts}",
    )
    if cfg.correction.mode == "tbpo":
        _check(
            not critic,
            "correction.mode",
            f"tbpo is a sequence-level objective over outcome advantages; algo={algo} gives token-level "
            f"GAE advantages. Use algo={' or algo='.join(a for a in ALGOS if not ALGORITHMS[a].critic)} with "
            "correction=tbpo",
        )
    if cfg.correction.aligned_forward:
        _check(
            cfg.quant.precision != "fp32",
            "correction.aligned_forward",
            "aligns the trainer with a low-bit rollout; quant.precision=fp32 has nothing to align. "
            f"Choose quant={'|'.join(p for p in PRECISIONS if p != 'fp32')} or set correction.aligned_forward=false",
        )
    if cfg.algo.dynamic_sampling:
        _check(not critic, "algo.dynamic_sampling", f"filters groups of G responses; not available with algo={algo}")
    _check(
        cfg.algo.overlong_buffer < cfg.rollout.max_new_tokens,
        "algo.overlong_buffer",
        f"must be < rollout.max_new_tokens ({cfg.rollout.max_new_tokens})",
    )
    check = BACKEND_CHECKS.get(cfg.backend.name)
    if check is not None:
        check(cfg)


def finalize(cfg: DictConfig) -> DictConfig:
    """The post-processing every composed config gets: paths expanded, hardware choices
    resolved, values validated (`compose_config` and the sweep's fast composer share it)."""
    cfg.warm_start.cache_dir = os.path.expanduser(OmegaConf.select(cfg, "warm_start.cache_dir"))
    for key in BACKEND_PATHS.get(cfg.backend.name, ()):
        if isinstance(cfg.backend.get(key), str):
            cfg.backend[key] = absolute_paths(cfg.backend[key])
    validate(cfg)
    resolve_hardware(cfg)
    return cfg


def _check_recipe_backend(parsed) -> None:
    """A paper recipe sets the verl backend's keys (model, data, its hyper-parameters); on
    another backend Hydra would answer with a key missing from that backend's section."""
    chosen = {o.key_or_group: o.value() for o in parsed if o.key_or_group in ("recipe", "backend")
              and not o.is_sweep_override()}
    recipe, backend = chosen.get("recipe"), chosen.get("backend")
    if recipe in recipes.RECIPES and recipes.RECIPES[recipe].groups.get("backend") not in (None, backend) \
            and backend is not None:
        needs = recipes.RECIPES[recipe].groups["backend"]
        raise ConfigError(f"recipe={recipe} runs on backend={needs} (it sets that backend's model, data and "
                          f"hyper-parameters), not backend={backend}: drop backend={backend}, or use recipe=laptop "
                          "for the embedded backend")


def compose_config(overrides: list[str] | tuple[str, ...] = (), *, fast: bool = True) -> DictConfig:
    """Compose the run config from the structured defaults plus Hydra overrides, then validate.

    Hydra's own errors (unknown key, unknown group option) name the key and list the options.
    Hydra composes in two phases: the group overrides (``quant=fp8``) choose and merge the defaults
    list, then every other override is applied in order. The first phase runs through Hydra once
    per distinct set of group overrides in a process (a sweep's cells and a test module's configs
    share few; ~0.2 s each), kept pickled; the second with OmegaConf's public API
    (`suite.overrides.apply_value_overrides`). Anything else (a delete ``~key``, sweep syntax
    ``a=1,2``, a package, an override OmegaConf refuses, ``+key`` over an existing key) and every
    error go through Hydra's whole compose, so its result and messages are Hydra's; ``fast=False``
    always does (tests/sweep/test_compose.py checks the two agree on every form).
    """
    parsed = parse_overrides(overrides)
    _check_recipe_backend(parsed)
    cfg = _compose_by_groups(parsed) if fast else None
    if cfg is None:
        cfg = _hydra_compose(list(overrides))
    check_override_types(cfg, parsed)
    return finalize(cfg)


def _hydra_compose(overrides: list[str]) -> DictConfig:
    """Hydra's whole compose (both phases), its errors in the suite's words where it has them."""
    GlobalHydra.instance().clear()
    # No config directory: every node comes from the ConfigStore registered above.
    try:
        with initialize(version_base="1.3", config_path=None, job_name="suite"):
            return compose(config_name="config", overrides=overrides)
    except HydraException as exc:
        if (hint := _typo_hint(str(exc))) is not None:
            # the suite's line alone: Hydra's text goes on to advise `+key=value`, which the suite refuses
            raise ConfigError(hint) from exc
        raise
    finally:
        GlobalHydra.instance().clear()


# Hydra's first phase per tuple of group overrides, pickled (unpickling a DictConfig, types and
# struct flag and all, is faster than copy.deepcopy of it); the ConfigStore is fixed in a process
GROUP_BASES: dict[tuple[str, ...], bytes] = {}


def _compose_by_groups(parsed: list) -> DictConfig | None:
    """`compose_config`'s config from the cached first phase plus OmegaConf's second; None where
    Hydra must compose it itself."""
    import pickle

    from suite.hydra_compat import config_groups

    groups = config_groups()
    group_lines: list[str] = []
    values = []
    for o in parsed:
        if o.is_sweep_override() or o.is_delete() or o.package is not None:
            return None
        if o.key_or_group in groups and not isinstance(o.value(), dict):
            group_lines.append(o.input_line)
        else:
            values.append(o)
    key = tuple(group_lines)
    if key not in GROUP_BASES:
        try:
            GROUP_BASES[key] = pickle.dumps(_hydra_compose(group_lines))
        except (HydraException, ConfigError):  # an unknown option: the whole compose raises it, with the closest
            return None
    cfg = pickle.loads(GROUP_BASES[key])
    return cfg if apply_value_overrides(cfg, values) else None


def config_record(cfg: DictConfig) -> dict:
    """A composed config as plain data (JSON-ready), interpolations resolved: what a sweep's launch
    records of each cell in `matrix.json`, so the report reads the config the cell ran with
    instead of composing it again (`config_from_record`)."""
    return OmegaConf.to_container(cfg, resolve=True)


_RECORD_BASES: dict[str, bytes] = {}  # backend name -> its default config, composed once, pickled


def config_from_record(data: dict) -> DictConfig:
    """The typed config `config_record` recorded: each section of its dataclass (struct mode, the
    backend's own section type), the recorded values merged in; composed by Hydra once per
    backend, never validated or resolved again (it is what the launch composed and ran)."""
    import pickle

    name = data["backend"]["name"]
    if name not in _RECORD_BASES:
        GlobalHydra.instance().clear()
        try:
            with initialize(version_base="1.3", config_path=None, job_name="suite"):
                _RECORD_BASES[name] = pickle.dumps(compose(config_name="config", overrides=[f"backend={name}"]))
        finally:
            GlobalHydra.instance().clear()
    cfg = pickle.loads(_RECORD_BASES[name])
    data = {**data, "tracking": dict(data["tracking"])}
    tags = data["tracking"].pop("tags", {})
    cfg.merge_with(data)  # typed: a key no section has, or a value of the wrong type, is refused
    with open_dict(cfg.tracking.tags):  # a free Dict[str, str] (sweep, cell, trial tags), closed in struct mode
        cfg.tracking.tags.update(tags)
    return cfg


def load_run_config(path: str | os.PathLike) -> DictConfig:
    """A run's recorded config (`<run dir>/config.yaml`) read through the config's schema: the dataclasses
    above, merged typed as `config_from_record` does (a key no section has, or a value of the wrong type,
    is refused). ConfigError, one line naming the file, the key and what it must be."""
    from suite.launch.fileio import read_yaml
    from suite.overrides import first_line

    _, data = read_yaml(path, ConfigError)  # UTF-8 and YAML (duplicate keys refused), errors naming the file
    backend = data.get("backend") if isinstance(data, dict) else None
    name = backend.get("name") if isinstance(backend, dict) else None
    if name not in BACKENDS:
        raise ConfigError(f"{path}: backend.name is {name!r}, not one of {', '.join(BACKENDS)} (not a suite run "
                          "config, or a damaged one)")
    if not isinstance(data.get("tracking", {}), dict):
        raise ConfigError(f"{path}: tracking: must be a mapping, got {data['tracking']!r}")
    try:
        return config_from_record({**data, "tracking": data.get("tracking") or {}})
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"{path}: {first_line(exc)}") from None


def known_keys() -> list[str]:
    """Every dotted key a config can have: the default config's and each backend section's. Only
    asked when an override names a key that does not exist (`_typo_hint`), so it composes freely."""
    def dotted(node: DictConfig, prefix: str):
        for key in node:
            yield f"{prefix}{key}"
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
                yield from dotted(child, f"{prefix}{key}.")

    GlobalHydra.instance().clear()
    try:
        with initialize(version_base="1.3", config_path=None, job_name="suite"):
            keys = set(dotted(compose(config_name="config"), ""))
    finally:
        GlobalHydra.instance().clear()
    for entry in ConfigStore.instance().repo.get("backend", {}).values():
        keys |= set(dotted(OmegaConf.structured(entry.node), "backend."))
    return sorted(k for k in keys if not k.endswith("defaults"))


def _closest(word: str, candidates: list[str]) -> str:
    """" did you mean X or Y?" for the candidates nearest to `word` (difflib), or "". A dotted key
    is compared whole with keys of its depth, and by its last part with every key's last part
    (`train.stepz` -> `steps`), so a key put in the wrong section is found too."""
    depth = word.count(".")
    near = difflib.get_close_matches(word, [c for c in candidates if c.count(".") == depth], n=3, cutoff=0.75)
    leaf = word.rpartition(".")[2]
    by_leaf: dict[str, list[str]] = {}
    for c in candidates:
        by_leaf.setdefault(c.rpartition(".")[2], []).append(c)
    for match in difflib.get_close_matches(leaf, list(by_leaf), n=3, cutoff=0.75):
        near += [c for c in by_leaf[match] if c not in near]
    return f" did you mean {' or '.join(near[:3])}?" if near else ""


def _typo_hint(hydra_message: str) -> str | None:
    """The closest valid keys or options for Hydra's "Could not override 'KEY'" (an unknown key,
    whose advice is Hydra's `+KEY=...`, which the suite refuses anyway) and "Could not find
    'GROUP/OPTION'"; None for any other error."""
    if m := re.search(r"Could not override '([^']+)'", hydra_message):
        key = m.group(1)
        return f"{key}: no such key;{_closest(key, known_keys()) or ' `suite run --cfg job` prints every key'}"
    if m := re.search(r"Could not find '([^'/]+)/([^']+)'", hydra_message):
        from suite.hydra_compat import config_groups

        group, option = m.groups()
        options = config_groups().get(group, [])
        if not options:
            return None
        return f"{group}={option}: no such option;{_closest(option, options)} the options are {', '.join(options)}"
    return None


# The backends' config sections: each `<package>.config` calls register_backend when imported.
# Imported last (they import this module's names), so this module imports no backend at its top.
BACKEND_MODULES = tuple(f"{package}.config" for package in _BACKEND_PACKAGES.values())
for _module in BACKEND_MODULES:
    importlib.import_module(_module)
