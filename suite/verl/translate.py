"""Translate a suite run config into verl 0.9.1 ``main_ppo`` Hydra overrides (docs/verl.md).

    verl_overrides(cfg) -> ["algorithm.adv_estimator=grpo", ...]
    verl_command(cfg)   -> ["python3", "-m", "verl.trainer.main_ppo", *verl_overrides(cfg)]

Every key is one of verl's own ``ppo_trainer.yaml`` (tests compose the overrides against it and
run verl's ``validate_config``); keys verl does not declare carry Hydra's ``+`` prefix. The
mapping, axis by axis:

- algo: ppo -> ``adv_estimator=gae`` + critic; grpo -> ``grpo``, ``rollout.n`` = G, KL loss when
  ``algo.kl_coef > 0``; dapo -> ``grpo`` with clip-higher, ``algorithm.filter_groups`` (run by verl's
  v1 trainer only) and verl's ``dapo`` reward manager with the overlong buffer.
- precision: the overrides and worker environment of its entry of suite.verl.rollout_quant
  ``quant_rollout`` (bf16: nothing; fp8 block: verl's native FP8; int8 / fp8 per_channel / w4a16: our vLLM worker
  extension, suite.verl.int8_hook, re-quantizing every weight sync).
  ``rollout.calculate_log_probs=true`` always, so verl logs the ``rollout_corr/`` mismatch.
- correction (``Correction.verl`` in suite.core.losses): naive -> verl's stock pipeline (vanilla
  loss, old log-probs recomputed, no rollout correction); bypass -> verl's rollout-correction
  bypass mode (``bypass_mode=true, loss_type=ppo_clip``); tis -> verl's token-level rollout IS,
  threshold C; acr / tbpo -> our registered loss modes (suite.verl.plugin), which recover
  ``r = pi_prox / pi_behav`` from verl's ``rollout_is_weights`` computed with a threshold that
  never truncates.
- correction.aligned_forward: ``SUITE_ALIGNED_FORWARD`` = the rollout quantizer's spec in every
  Ray worker; the plugin then swaps verl's FSDP actor engine for one whose block linears
  fake-quantize their weights with that quantizer (suite.verl.aligned).
"""

from __future__ import annotations

import json
import os
import re

from omegaconf import DictConfig

from suite.config import run_id
from suite.core.advantages import ALGORITHMS
from suite.core.losses import CORRECTIONS
from suite.verl import LOSS_PARAMS_ENV
from suite.verl.aligned import ALIGNED_ENV
from suite.verl.cpu_workarounds import CPU_ENV, VERL_CPU_OVERRIDES, VERL_CPU_V1_OVERRIDES
from suite.verl.rollout_quant import (  # noqa: F401
    EXTENSION_OVERRIDES,
    VERL_ROLLOUTS,
    W8A8_QUANT_CONFIG,
    WORKER_EXTENSION,
    quant_rollout,
    scheme_spec,
)

# rollout_is_threshold for the modes that need the raw r: verl clamps log r to +-20 before exp
# (rollout_corr_helper.SAFETY_BOUND), so a weight never exceeds exp(20) ~ 4.85e8 < 1e9.
NEVER_TRUNCATE = 1e9
# verl always applies the dual clip (clip_ratio_c); with algo.dual_clip = null we set a bound no
# ratio reaches (ratios are exp(clamp(., +-20)) <= 4.85e8), which is the same as "off".
DUAL_CLIP_OFF = 1e9
# the precision, where the worker extension re-quantizes each sync: read by suite.verl.int8_hook in the vLLM workers
ROLLOUT_QUANT_ENV = "SUITE_ROLLOUT_QUANT"
KL_TYPES = {"k1": "k1", "k2": "k2", "k3": "low_var_kl"}  # suite algo.kl_estimator -> verl kl_loss_type

AR = "actor_rollout_ref"
# Where each verl key the translator sets comes from: verl key (or a prefix of keys) -> the suite
# keys its value is computed from. With SUITE_CHOICES it covers every key on which a translated
# config differs from verl's own defaults; tests/verl/test_recipes.py checks that each such key
# of a paper recipe is fed by a key the recipe (or the run's axes, or the user's paths) sets.
VERL_SOURCES: dict[str, tuple[str, ...]] = {
    "algorithm.adv_estimator": ("algo.name",),
    "algorithm.norm_adv_by_std_in_grpo": ("algo.norm_adv_by_std",),
    "algorithm.gamma": ("algo.gamma",),
    "algorithm.lam": ("algo.lam", "algo.name"),
    "algorithm.filter_groups": ("algo.dynamic_sampling",),
    "algorithm.rollout_correction": ("correction.mode", "correction.tis_cap"),
    "data.train_files": ("backend.train_files",),
    "data.val_files": ("backend.val_files",),
    "data.train_batch_size": ("rollout.prompts_per_step",),
    "data.max_prompt_length": ("backend.max_prompt_length",),
    "data.max_response_length": ("rollout.max_new_tokens",),
    "data.seed": ("seed",),
    f"{AR}.model.path": ("backend.model_path", "uaq.s"),
    f"{AR}.model.enable_gradient_checkpointing": ("backend.gradient_checkpointing",),
    f"{AR}.model.use_remove_padding": ("backend.remove_padding",),
    f"{AR}.model.override_config.max_position_embeddings": ("backend.max_position_embeddings",),
    f"{AR}.actor.optim.lr": ("train.lr", "train.lr_factor"),
    f"{AR}.actor.optim.weight_decay": ("train.weight_decay",),
    f"{AR}.actor.optim.betas": ("train.betas",),
    f"{AR}.actor.optim.clip_grad": ("train.grad_clip",),
    f"{AR}.actor.optim.lr_warmup_steps": ("backend.lr_warmup_steps",),
    f"{AR}.actor.ppo_epochs": ("train.epochs",),
    f"{AR}.actor.ppo_mini_batch_size": ("rollout.prompts_per_step", "train.minibatches"),
    f"{AR}.actor.ppo_micro_batch_size_per_gpu": ("backend.micro_batch_size_per_gpu",),
    f"{AR}.actor.use_dynamic_bsz": ("backend.use_dynamic_bsz",),
    f"{AR}.actor.ppo_max_token_len_per_gpu": ("backend.ppo_max_token_len_per_gpu",),
    f"{AR}.actor.clip_ratio_low": ("algo.clip_low",),
    f"{AR}.actor.clip_ratio_high": ("algo.clip_high",),
    f"{AR}.actor.clip_ratio_c": ("algo.dual_clip",),
    f"{AR}.actor.loss_agg_mode": ("algo.agg",),
    f"{AR}.actor.use_kl_loss": ("algo.kl_coef",),
    f"{AR}.actor.kl_loss_coef": ("algo.kl_coef",),
    f"{AR}.actor.kl_loss_type": ("algo.kl_estimator",),
    f"{AR}.actor.data_loader_seed": ("seed",),
    f"{AR}.actor.policy_loss.loss_mode": ("correction.mode",),
    f"{AR}.actor.ulysses_sequence_parallel_size": ("backend.sequence_parallel_size",),
    f"{AR}.actor.fsdp_config.param_offload": ("backend.param_offload",),
    f"{AR}.actor.fsdp_config.optimizer_offload": ("backend.optimizer_offload",),
    f"{AR}.actor.fsdp_config.fsdp_size": ("backend.fsdp_size",),
    f"{AR}.ref.ulysses_sequence_parallel_size": ("backend.sequence_parallel_size",),
    f"{AR}.ref.fsdp_config.param_offload": ("backend.ref_param_offload",),
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu": ("backend.micro_batch_size_per_gpu",),
    f"{AR}.ref.log_prob_max_token_len_per_gpu": ("backend.log_prob_max_token_len_per_gpu",),
    f"{AR}.rollout.n": ("algo.group_size",),
    f"{AR}.rollout.temperature": ("rollout.temperature",),
    f"{AR}.rollout.top_p": ("rollout.top_p",),
    f"{AR}.rollout.seed": ("seed",),
    f"{AR}.rollout.tensor_model_parallel_size": ("backend.tensor_parallel_size",),
    f"{AR}.rollout.gpu_memory_utilization": ("backend.gpu_memory_utilization",),
    f"{AR}.rollout.max_num_batched_tokens": ("backend.max_num_batched_tokens",),
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu": ("backend.micro_batch_size_per_gpu",),
    f"{AR}.rollout.log_prob_max_token_len_per_gpu": ("backend.log_prob_max_token_len_per_gpu",),
    f"{AR}.rollout.val_kwargs.temperature": ("rollout.eval_temperature",),
    f"{AR}.rollout.val_kwargs.do_sample": ("rollout.eval_temperature",),
    f"{AR}.rollout.val_kwargs.n": ("backend.val_n",),
    f"{AR}.rollout.val_kwargs.top_p": ("backend.val_top_p",),
    f"{AR}.actor.entropy_coeff": ("backend.entropy_coeff",),
    f"{AR}.rollout.engine_kwargs.vllm": ("quant.precision", "quant.fp8_granularity"),  # suite.verl.rollout_quant
    "critic.enable": ("algo.name",),
    "critic.model.path": ("backend.model_path", "uaq.s"),
    "critic.optim.lr": ("algo.critic_lr",),
    "critic.cliprange_value": ("algo.value_clip",),
    "critic.ppo_micro_batch_size_per_gpu": ("backend.micro_batch_size_per_gpu",),
    "critic.ppo_max_token_len_per_gpu": ("backend.ppo_max_token_len_per_gpu",),
    "critic.model.enable_gradient_checkpointing": ("backend.gradient_checkpointing",),
    "critic.model.use_remove_padding": ("backend.remove_padding",),
    "reward.reward_manager.name": ("algo.name",),
    "reward.reward_kwargs": ("algo.overlong_buffer", "algo.overlong_penalty", "rollout.max_new_tokens"),
    "ray_kwargs.ray_init.runtime_env.env_vars": ("correction.mode", "quant.precision", "quant.group_size",
                                                 "correction.aligned_forward"),
    "trainer.total_training_steps": ("steps",),
    "trainer.test_freq": ("eval_every",),
    "trainer.save_freq": ("ckpt_every",),
    "trainer.max_actor_ckpt_to_keep": ("backend.max_ckpt_to_keep",),
    "trainer.max_critic_ckpt_to_keep": ("backend.max_ckpt_to_keep",),
    "trainer.nnodes": ("backend.nnodes",),
    "trainer.n_gpus_per_node": ("backend.n_gpus_per_node",),
}
# verl keys the suite sets whatever the run, each with the reason (the rest of a translated config is verl's).
SUITE_CHOICES: dict[str, str] = {
    "algorithm.use_kl_in_reward": "KL, when on, is a loss term (actor.use_kl_loss), as in the scripts the recipes cite",
    "data.filter_overlong_prompts": "a prompt over the budget is dropped, never cut (FlashRL's GSM8K script)",
    "data.truncation": "with overlong prompts filtered, truncation never happens; 'error' says so if it did",
    f"{AR}.rollout.name": "vLLM serves every rollout",
    f"{AR}.rollout.calculate_log_probs": "pi_behav from the rollout engine: the rollout_corr/ mismatch metrics",
    "trainer.val_before_train": "the held-out accuracy at step 0, before training",
    "trainer.resume_mode": "a requeued SLURM job resumes from the run's last checkpoint",
    "trainer.logger": "metrics go to the suite's MLflow run (and the console)",
    "trainer.project_name": "the MLflow experiment (tracking.experiment)",
    "trainer.experiment_name": "the MLflow run name (suite.identity.run_name)",
    "trainer.default_local_dir": "checkpoints inside the run's own directory",
    "reward.custom_reward_function": "the run's reward file, else suite.verl.reward (verl's scorers for their "
                                     "data sources, the suite's for Minerva, OlympiadBench, OpenR1-Math)",
}


def verl_key_sources(verl_key: str) -> tuple[str, ...] | None:
    """The suite keys a verl key's value is computed from (VERL_SOURCES, longest prefix first), or
    None when the suite sets it on its own (SUITE_CHOICES) or does not set it."""
    for prefix in sorted(VERL_SOURCES, key=len, reverse=True):
        if verl_key == prefix or verl_key.startswith(prefix + "."):
            return VERL_SOURCES[prefix]
    return None


_PLAIN = re.compile(r"^[A-Za-z0-9_./:@-]+$")


def _q(value: str) -> str:
    """A string as a Hydra override value: bare when safe, else single-quoted (escaped)."""
    if _PLAIN.match(value) and value not in ("null", "true", "false") and not re.match(r"^[-+.\d]", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _f(x: float) -> str:
    return repr(float(x))


def _b(x: bool) -> str:
    return str(bool(x)).lower()


def _files(value: str) -> str:
    paths = [p.strip() for p in value.split(",") if p.strip()]
    return "[" + ",".join(_q(p) for p in paths) + "]"


def uaq_model_dir(cfg: DictConfig, run_dir: str | None = None) -> str:
    """Where the UAQ-transformed model lives: ``<run_dir>/model-uaq-s<s>``, inside the run's own
    directory, so a read-only models directory works and removing a run removes its copy.

    With ``uaq.s == 1`` the original directory is used as is.
    """
    if cfg.uaq.s == 1.0:
        return os.path.normpath(cfg.backend.model_path)
    return os.path.join(os.path.abspath(run_dir or default_run_dir(cfg)), f"model-uaq-s{cfg.uaq.s:g}")


def reward_fn_file(cfg: DictConfig) -> str:
    """The python file whose ``compute_score`` grades this run's responses: ``backend.reward_fn_path``
    (e.g. an exported embedded task's), else suite.verl.reward."""
    if cfg.backend.reward_fn_path:
        return str(cfg.backend.reward_fn_path)
    from suite.verl import reward

    return os.path.abspath(reward.__file__)


def loss_env(cfg: DictConfig) -> dict[str, str]:
    """Parameters of the suite loss modes that verl's ActorConfig has no field for, the rollout
    quantizer for the vLLM worker extension and, with the aligned forward, its spec."""
    c = CORRECTIONS[cfg.correction.mode]
    env = {}
    if c.verl == "plugin":  # one JSON value: the parameters the registered loss reads (suite.verl.plugin)
        env[LOSS_PARAMS_ENV] = json.dumps({k: cfg.correction[k] if isinstance(cfg.correction[k], str)
                                           else float(cfg.correction[k]) for k in c.params}, sort_keys=True)
    q = cfg.quant
    name, rollout = quant_rollout(q)  # None: a precision verl has no rollout for
    if rollout is not None and rollout.weight_sync is not None:
        env[ROLLOUT_QUANT_ENV] = name
        env["SUITE_W4_GROUP_SIZE"] = str(cfg.quant.group_size)
        env["SUITE_W4_SYMMETRIC"] = "1" if cfg.quant.symmetric else "0"
    if cfg.backend.name == "verl" and cfg.backend.device == "cpu":  # suite.verl.cpu_workarounds
        env[CPU_ENV] = "1"
    if cfg.correction.aligned_forward:
        env[ALIGNED_ENV] = scheme_spec(q.precision, group_size=q.group_size, symmetric=q.symmetric,
                                       fp8_granularity=q.fp8_granularity)
    return env


def mlflow_names(cfg: DictConfig) -> tuple[str, str]:
    """(experiment, run name): verl's ``trainer.project_name`` / ``trainer.experiment_name``."""
    from suite.identity import run_name

    return cfg.tracking.experiment, (cfg.tracking.run_name or run_name(cfg))


def default_run_dir(cfg: DictConfig) -> str:
    """``<out_dir>/<run_id>``, absolute: where `suite run` and `suite sweep` put this run."""
    return os.path.abspath(os.path.join(os.path.expanduser(cfg.out_dir), run_id(cfg)))


def verl_overrides(cfg: DictConfig, run_dir: str | None = None) -> list[str]:
    """verl 0.9.1 ``main_ppo`` overrides that run ``cfg`` (a composed, validated suite config).

    verl checkpoints (and resumes from) ``<run_dir>/checkpoints``; ``run_dir`` defaults to
    :func:`default_run_dir`.
    """
    if cfg.backend.name != "verl":
        raise ValueError(f"backend.name={cfg.backend.name!r}: verl overrides need backend=verl")
    b, a, r, c, t = cfg.backend, cfg.algo, cfg.rollout, cfg.correction, cfg.train
    algo, mode = a.name, c.mode
    critic = ALGORITHMS[algo].critic  # suite.core.advantages: GAE with a value model (ppo)
    model = uaq_model_dir(cfg, run_dir)
    experiment, run_name = mlflow_names(cfg)
    ar = "actor_rollout_ref"
    o: list[str] = [
        # algorithm
        f"algorithm.adv_estimator={ALGORITHMS[algo].verl_estimator}",
        f"algorithm.norm_adv_by_std_in_grpo={_b(a.norm_adv_by_std)}",
        f"algorithm.gamma={_f(a.gamma)}",
        f"algorithm.lam={_f(a.lam if critic else 1.0)}",
        "algorithm.use_kl_in_reward=false",
        # data: local parquet, prompts per step, token budgets
        f"data.train_files={_files(b.train_files)}",
        f"data.val_files={_files(b.val_files)}",
        f"data.train_batch_size={r.prompts_per_step}",
        f"data.max_prompt_length={b.max_prompt_length}",
        f"data.max_response_length={r.max_new_tokens}",
        "data.filter_overlong_prompts=true",
        "data.truncation=error",
        f"data.seed={cfg.seed}",
        # model (UAQ-transformed copy when uaq.s != 1)
        f"{ar}.model.path={_q(model)}",
        f"{ar}.model.enable_gradient_checkpointing={_b(b.gradient_checkpointing)}",
        f"{ar}.model.use_remove_padding={_b(b.remove_padding)}",
        # actor
        f"{ar}.actor.optim.lr={_f(t.lr * t.lr_factor)}",
        f"{ar}.actor.optim.weight_decay={_f(t.weight_decay)}",
        f"{ar}.actor.optim.betas=[{_f(t.betas[0])},{_f(t.betas[1])}]",
        f"{ar}.actor.optim.clip_grad={_f(t.grad_clip)}",
        f"{ar}.actor.optim.lr_warmup_steps={b.lr_warmup_steps}",
        f"{ar}.actor.ppo_epochs={t.epochs}",
        f"{ar}.actor.ppo_mini_batch_size={r.prompts_per_step // t.minibatches}",
        f"{ar}.actor.ppo_micro_batch_size_per_gpu={b.micro_batch_size_per_gpu}",
        f"{ar}.actor.use_dynamic_bsz={_b(b.use_dynamic_bsz)}",
        f"{ar}.actor.ppo_max_token_len_per_gpu={b.ppo_max_token_len_per_gpu}",
        f"{ar}.actor.clip_ratio_low={_f(a.clip_low)}",
        f"{ar}.actor.clip_ratio_high={_f(a.clip_high)}",
        f"{ar}.actor.clip_ratio_c={_f(a.dual_clip if a.dual_clip is not None else DUAL_CLIP_OFF)}",
        f"{ar}.actor.loss_agg_mode={a.agg}",
        f"{ar}.actor.use_kl_loss={_b(a.kl_coef > 0)}",
        f"{ar}.actor.kl_loss_type={KL_TYPES[a.kl_estimator]}",
        f"{ar}.actor.entropy_coeff={_f(b.entropy_coeff)}",
        f"{ar}.actor.data_loader_seed={cfg.seed}",
        *([f"{ar}.actor.kl_loss_coef={_f(a.kl_coef)}"] if a.kl_coef > 0 else []),  # else verl's, unused
        f"{ar}.actor.policy_loss.loss_mode={mode if CORRECTIONS[mode].verl == 'plugin' else 'vanilla'}",
        # rollout: vLLM, G samples per prompt, rollout log-probs always (mismatch metrics)
        f"{ar}.rollout.name=vllm",
        f"{ar}.rollout.n={a.group_size}",
        f"{ar}.rollout.temperature={_f(r.temperature)}",
        f"{ar}.rollout.top_p={_f(r.top_p)}",
        f"{ar}.rollout.calculate_log_probs=true",
        f"{ar}.rollout.tensor_model_parallel_size={b.tensor_parallel_size}",
        f"{ar}.rollout.gpu_memory_utilization={_f(b.gpu_memory_utilization)}",
        f"{ar}.rollout.max_num_batched_tokens={b.max_num_batched_tokens}",
        f"{ar}.rollout.log_prob_micro_batch_size_per_gpu={b.micro_batch_size_per_gpu}",
        f"{ar}.rollout.log_prob_max_token_len_per_gpu={b.log_prob_max_token_len_per_gpu}",
        f"{ar}.rollout.val_kwargs.temperature={_f(r.eval_temperature)}",
        f"{ar}.rollout.val_kwargs.do_sample={_b(r.eval_temperature > 0)}",
        f"{ar}.rollout.val_kwargs.n={b.val_n}",
        f"{ar}.rollout.val_kwargs.top_p={_f(b.val_top_p)}",
        f"{ar}.rollout.seed={cfg.seed}",
        f"{ar}.ref.log_prob_micro_batch_size_per_gpu={b.micro_batch_size_per_gpu}",
        f"{ar}.ref.log_prob_max_token_len_per_gpu={b.log_prob_max_token_len_per_gpu}",
        # memory layout of the trained models
        f"{ar}.actor.ulysses_sequence_parallel_size={b.sequence_parallel_size}",
        f"{ar}.ref.ulysses_sequence_parallel_size={b.sequence_parallel_size}",
        f"{ar}.actor.fsdp_config.param_offload={_b(b.param_offload)}",
        f"{ar}.actor.fsdp_config.optimizer_offload={_b(b.optimizer_offload)}",
        f"{ar}.ref.fsdp_config.param_offload={_b(b.ref_param_offload)}",
        f"{ar}.actor.fsdp_config.fsdp_size={b.fsdp_size}",
    ]
    if b.max_position_embeddings:  # the trainer's and (through verl) vLLM's context window
        o.append(f"+{ar}.model.override_config.max_position_embeddings={b.max_position_embeddings}")
    # the trainer's compute dtype: FSDP mixed precision (verl: param_dtype bf16 when none is given)
    if b.param_dtype != "bf16":
        mp = f"{{param_dtype:{b.param_dtype},reduce_dtype:fp32,buffer_dtype:fp32}}"
        o += [f"+{ar}.actor.fsdp_config.mixed_precision={mp}", f"+{ar}.ref.fsdp_config.mixed_precision={mp}"]
        if critic:
            o.append(f"+critic.fsdp.mixed_precision={mp}")
    # precision (suite.verl.rollout_quant)
    q = cfg.quant
    rollout = quant_rollout(q)[1]
    for key, value in rollout.main_ppo_overrides(q.group_size, q.symmetric):
        o.append(f"{key}={value if isinstance(value, str) else _hydra_value(value)}")
    # correction: token-level rollout IS; TIS truncates at C, the suite modes need the raw r
    rc = "algorithm.rollout_correction"
    how = CORRECTIONS[mode].verl
    if how == "tis":
        o += [f"{rc}.rollout_is=token", f"{rc}.rollout_is_threshold={_f(c.tis_cap)}"]
    elif how == "plugin":
        o += [f"{rc}.rollout_is=token", f"{rc}.rollout_is_threshold={_f(NEVER_TRUNCATE)}"]
    else:  # naive (stock pipeline) and bypass: no IS weight
        o += [f"{rc}.rollout_is=null"]
    o += [f"{rc}.bypass_mode={_b(how == 'bypass')}", f"{rc}.rollout_is_batch_normalize=false"]
    if how == "bypass":
        o.append(f"{rc}.loss_type=ppo_clip")  # verl: PPO clip with pi_theta / pi_rollout
    # algorithm specifics
    if critic:
        o += [
            "critic.enable=true",
            f"critic.model.path={_q(model)}",
            f"critic.optim.lr={_f(a.critic_lr)}",
            f"critic.cliprange_value={_f(a.value_clip)}",
            f"critic.ppo_micro_batch_size_per_gpu={b.micro_batch_size_per_gpu}",
            f"critic.model.enable_gradient_checkpointing={_b(b.gradient_checkpointing)}",
            f"critic.model.use_remove_padding={_b(b.remove_padding)}",
        ]
    if a.dynamic_sampling:
        # verl's v1 trainer filters groups in its replay buffer and refills until the batch is full: it has
        # no bound on generation rounds (it ignores max_num_gen_batches), so algo.max_resample_rounds is the
        # embedded trainer's only
        o += ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"]
    if algo == "dapo":
        o.append("reward.reward_manager.name=dapo")
        if a.overlong_buffer > 0:
            o += [
                "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
                f"+reward.reward_kwargs.overlong_buffer_cfg.len={a.overlong_buffer}",
                f"+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor={_f(a.overlong_penalty)}",
                "+reward.reward_kwargs.overlong_buffer_cfg.log=true",
                f"+reward.reward_kwargs.max_resp_len={r.max_new_tokens}",
            ]
    # the scorer: the run's own reward file, else the suite's (verl's for its data sources, the suite's for
    # the held-out sets verl cannot grade); `suite eval` scores with the same function (reward_fn_file)
    o += [f"reward.custom_reward_function.path={_q(reward_fn_file(cfg))}",
          "reward.custom_reward_function.name=compute_score"]
    # loss parameters verl has no field for, and the rollout quantizer: env of every Ray worker
    for k, v in loss_env(cfg).items():
        o.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}={_q(v)}")
    # trainer: steps, cadence, cluster shape, logging to the same MLflow as embedded runs
    o += [
        f"trainer.total_training_steps={cfg.steps}",
        f"trainer.test_freq={cfg.eval_every}",
        f"trainer.save_freq={cfg.ckpt_every}",
        "trainer.val_before_train=true",
        "trainer.resume_mode=auto",
        f"trainer.max_actor_ckpt_to_keep={b.max_ckpt_to_keep or 'null'}",
        f"trainer.max_critic_ckpt_to_keep={b.max_ckpt_to_keep or 'null'}",
        f"trainer.nnodes={b.nnodes}",
        f"trainer.n_gpus_per_node={b.n_gpus_per_node}",
        "trainer.logger=[console,mlflow]",
        f"trainer.project_name={_q(experiment)}",
        f"trainer.experiment_name={_q(run_name)}",
        f"trainer.default_local_dir="
        f"{_q(os.path.join(os.path.abspath(run_dir or default_run_dir(cfg)), 'checkpoints'))}",
    ]
    if b.device == "cpu":  # vLLM's CPU build (suite.verl.cpu_workarounds)
        cpu = list(VERL_CPU_OVERRIDES)
        if rollout.vllm_scheme == "CompressedTensorsWNA16":
            # W4A16's parameters (weight_packed, ...) are not the HF checkpoint's, which vLLM cannot load
            # into them: dummy weights until verl's first sync, as verl starts its rollout on a GPU
            cpu = [f"{ar}.rollout.load_format=dummy" if x.startswith(f"{ar}.rollout.load_format=") else x
                   for x in cpu]
        o += cpu
        if rollout.weight_sync is None:  # the extension re-stages the linears vLLM CPU packed
            o += [f"{key}={value}" for key, value in EXTENSION_OVERRIDES]
        if a.dynamic_sampling:  # only verl's v1 trainer filters groups (TransferQueue, one storage actor)
            o += list(VERL_CPU_V1_OVERRIDES)
    return o + list(b.extra_overrides)


def verl_command(cfg: DictConfig, run_dir: str | None = None) -> list[str]:
    """argv that runs ``cfg`` with verl: ``python3 -m verl.trainer.main_ppo OVERRIDES...``."""
    return [cfg.backend.python, "-m", "verl.trainer.main_ppo", *verl_overrides(cfg, run_dir)]


def _hydra_value(obj) -> str:
    """A Python dict / list / scalar in Hydra's override grammar."""
    if isinstance(obj, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in obj) + "]"
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return str(obj).lower()
    if isinstance(obj, (int, float)):
        return repr(obj)
    return _q(str(obj))


def compose_verl_config(overrides: list[str]) -> DictConfig:
    """Compose verl's own ``ppo_trainer`` config with ``overrides`` (unknown keys fail)."""
    try:
        import verl
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the verl backend needs verl: pip install -e '.[verl]'") from exc
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return compose(config_name="ppo_trainer", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


class VerlConfigComposer:
    """Compose many override lists against verl's ``ppo_trainer`` quickly (dry runs, tests).

    verl's defaults list is composed once; each override list is then applied to a copy with
    OmegaConf's public API as ``compose`` applies value overrides after the defaults list
    (`suite.overrides.apply_value_overrides`); an override it leaves to Hydra composes in full.
    The translator emits no config-group overrides, so the result equals a full compose (tests
    check both on the same cells).
    """

    def __init__(self) -> None:
        self.base = compose_verl_config([])

    def compose(self, overrides: list[str]) -> DictConfig:
        import copy

        from suite.overrides import apply_value_overrides, parse_override

        parsed = [parse_override(line) for line in overrides]  # each distinct line parsed once
        cfg = copy.deepcopy(self.base)
        if any(o.is_delete() or o.is_sweep_override() for o in parsed) or not apply_value_overrides(cfg, parsed):
            return compose_verl_config(overrides)
        return cfg


def validate_verl_config(vcfg: DictConfig) -> None:
    """verl's own check (verl.utils.config.validate_config), as ``main_ppo.main`` calls it."""
    import warnings

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Disabled critic as adv_estimator != gae"
        validate_config(config=vcfg, use_reference_policy=need_reference_policy(vcfg), use_critic=need_critic(vcfg))


__all__ = [
    "NEVER_TRUNCATE",
    "SUITE_CHOICES",
    "VERL_SOURCES",
    "VerlConfigComposer",
    "W8A8_QUANT_CONFIG",
    "compose_verl_config",
    "default_run_dir",
    "loss_env",
    "mlflow_names",
    "uaq_model_dir",
    "reward_fn_file",
    "validate_verl_config",
    "verl_command",
    "verl_key_sources",
    "verl_overrides",
]
