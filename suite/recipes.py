"""Recipes: one named config per paper experiment, with the model, the data and every
hyper-parameter that experiment ran with, each value with its source (docs/verl.md, "Running the
papers on a cluster"; the sources are discussed in docs/recipes_sources.md).

    suite sweep experiments/paper_tables.yaml backend=verl recipe=qurl-gsm8k launcher=slurm cluster=h100x8 \\
        backend.model_path=... backend.train_files=... backend.val_files=...

A recipe is stored like a regime (suite.regimes): a `_global_` config chosen with `recipe=NAME`
that sets group choices and values. Everything on the command line and in a sweep's matrix still
wins, and the composed config holds the resolved values only, so a run composed through a recipe
has the same run id as one given the same values by hand. `laptop` (the default) sets nothing:
today's defaults, so no run id changes. Every paper recipe runs on the verl backend.

Where the paper states a value, the paper is the source; else the verl / FlashRL / DeepScaleR
script the paper builds on; else verl's own default. The papers' full texts were not readable
where these were written, so "(2nd-hand)" marks a paper value known from notes that quote it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

# The sources cited below, with the commit each was read at (docs/recipes_sources.md says how);
# `at(SCRIPT, line)` cites lines of a script.
QURL = "QuRL arXiv 2602.13953"
QARL = "QaRL arXiv 2604.07853"
FLASHRL_GSM8K = "FlashRL yaof20/verl@4e22f4d recipe/flash_rl/gsm8k_qwen0_5b_int8.sh"
FLASHRL_README = "FlashRL yaof20/Flash-RL@7c82823 README (Examples: flash-int8-TIS-2, flash-int8-TIS-8)"
VERL_DAPO_7B = "verl@3592251 recipe/dapo/test_dapo_7b_math.sh"
VERL_DAPO_32B = "verl v0.5.0 recipe/dapo/run_dapo_qwen2.5_32b.sh"
DEEPSCALER = "rllm scripts/deepscaler/train/deepscaler_1.5b_8k.sh (read at uiuc-kang-lab/deepscaler@f8b91f5)"
VERL_DEFAULT = "verl 0.9.1 default"
DEEPSCALER_VERL = ("DeepScaleR's verl copy verl/verl/trainer/config/ppo_trainer.yaml (read at "
                   "uiuc-kang-lab/deepscaler@60c8939)")
DEEPSCALER_EVAL = "rllm scripts/eval/eval_model.sh (read at insop/rllm@3aa428e, a fork of agentica-project/rllm)"
OURS = "ours"


def at(script: str, *lines: int) -> str:
    """Lines of a script as a source: 'verl@3592251 recipe/dapo/test_dapo_7b_math.sh:49,93'."""
    return f"{script}:{','.join(map(str, lines))}"


@dataclass(frozen=True)
class Value:
    """One setting of a recipe: the value and where it comes from."""

    value: Any
    source: str


@dataclass(frozen=True)
class Recipe:
    description: str
    model: str = ""  # the checkpoint the paper trained (the user passes a local copy as backend.model_path)
    train_data: str = ""  # `suite data prepare` name of the training set
    val_data: tuple[str, ...] = ()  # `suite data prepare` names of the held-out sets
    gpus: str = ""  # what the paper (or its recipe) trained on
    gpu_hours: str = ""  # expected cost of one run on H100s, and how it was estimated
    # the same as a (low, high) range of H100-hours for one run of the recipe's steps: the dry run's
    # estimate (suite.sweep.estimate); () = none
    h100_hours: tuple[float, float] = ()
    groups: dict[str, str] = field(default_factory=dict)  # group choices (backend, algo, quant, correction)
    values: dict[str, Value] = field(default_factory=dict)  # dotted run-config key -> value
    # per-node SLURM resources for this model size: timeout_min, cpus_per_task, mem_gb
    slurm: dict[str, Value] = field(default_factory=dict)


# What verl 0.9.1 does with a key no recipe sets (its trainer/config, composed with no override; a
# test compares each entry with verl's own config): every verl recipe gets these for the keys it
# leaves open, so a value the paper and its script never chose is verl's, never the embedded
# backend's (the laptop's AdamW betas (0.9, 0.99) and GAE lambda 0.95 were). key -> (value, verl key).
VERL_DEFAULTS: dict[str, tuple[Any, str]] = {
    "train.lr": (1e-6, "actor.optim.lr"),
    "train.weight_decay": (0.01, "actor.optim.weight_decay"),
    "train.betas": ([0.9, 0.999], "actor.optim.betas"),
    "train.grad_clip": (1.0, "actor.optim.clip_grad"),
    "train.epochs": (1, "actor.ppo_epochs"),
    "algo.gamma": (1.0, "algorithm.gamma"),
    "algo.lam": (1.0, "algorithm.lam"),
    "algo.norm_adv_by_std": (True, "algorithm.norm_adv_by_std_in_grpo"),
    "algo.clip_low": (0.2, "actor.clip_ratio_low"),
    "algo.clip_high": (0.2, "actor.clip_ratio_high"),
    "algo.dual_clip": (3.0, "actor.clip_ratio_c"),
    "algo.agg": ("token-mean", "actor.loss_agg_mode"),
    "algo.kl_coef": (0.0, "actor.use_kl_loss=false"),
    "algo.kl_estimator": ("k3", "actor.kl_loss_type=low_var_kl"),
    "algo.critic_lr": (1e-5, "critic.optim.lr"),
    "algo.value_clip": (0.5, "critic.cliprange_value"),
    "algo.dynamic_sampling": (False, "algorithm.filter_groups.enable"),
    "algo.overlong_buffer": (0, "no overlong_buffer_cfg"),
    "rollout.temperature": (1.0, "rollout.temperature"),
    "rollout.top_p": (1.0, "rollout.top_p"),
    "rollout.eval_temperature": (0.0, "rollout.val_kwargs.temperature"),
    "backend.val_n": (1, "rollout.val_kwargs.n"),
    "backend.val_top_p": (1.0, "rollout.val_kwargs.top_p"),
    "backend.lr_warmup_steps": (-1, "actor.optim.lr_warmup_steps"),
    "backend.use_dynamic_bsz": (False, "actor.use_dynamic_bsz"),
    "backend.ppo_max_token_len_per_gpu": (16384, "actor.ppo_max_token_len_per_gpu"),
    "backend.log_prob_max_token_len_per_gpu": (16384, "rollout.log_prob_max_token_len_per_gpu"),
    "backend.gradient_checkpointing": (True, "model.enable_gradient_checkpointing"),
    "backend.remove_padding": (True, "model.use_remove_padding"),
    "backend.gpu_memory_utilization": (0.5, "rollout.gpu_memory_utilization"),
    "backend.max_num_batched_tokens": (8192, "rollout.max_num_batched_tokens"),
    "backend.sequence_parallel_size": (1, "actor.ulysses_sequence_parallel_size"),
    "backend.param_offload": (False, "actor.fsdp_config.param_offload"),
    "backend.ref_param_offload": (False, "ref.fsdp_config.param_offload"),
    "backend.optimizer_offload": (False, "actor.fsdp_config.optimizer_offload"),
    "backend.fsdp_size": (-1, "actor.fsdp_config.fsdp_size"),
    "backend.entropy_coeff": (0.0, "actor.entropy_coeff"),
    "correction.tis_cap": (2.0, "algorithm.rollout_correction.rollout_is_threshold"),
}

RECIPES: dict[str, Recipe] = {
    "laptop": Recipe(description="today's defaults: the embedded backend's tiny model on the synthetic tasks"),
    "qurl-gsm8k": Recipe(
        description="QuRL's PPO on GSM8K (Table 1), FlashRL's setup",
        model="Qwen/Qwen2.5-0.5B-Instruct (" + at(FLASHRL_GSM8K, 24) + ")",
        train_data="gsm8k",
        val_data=("gsm8k",),
        gpus="1 node x 4 GPUs (" + at(FLASHRL_GSM8K, 50, 52) + ")",
        gpu_hours="~10-20 H100-hours per run: our rough estimate (435 steps of a 0.5B model on 4 GPUs), not measured",
        h100_hours=(10, 20),
        groups={"backend": "verl", "algo": "ppo"},
        values={
            "backend.dataset": Value("gsm8k", QURL + " Table 1 (2nd-hand)"),
            "rollout.prompts_per_step": Value(256, at(FLASHRL_GSM8K, 19)),
            "algo.group_size": Value(1, VERL_DEFAULT + " rollout.n (PPO with a critic)"),
            "train.minibatches": Value(4, at(FLASHRL_GSM8K, 27) + " ppo_mini_batch_size=64 of 256"),
            "backend.micro_batch_size_per_gpu": Value(4, at(FLASHRL_GSM8K, 28, 33, 42)),
            "backend.max_prompt_length": Value(1024, at(FLASHRL_GSM8K, 20)),
            "rollout.max_new_tokens": Value(512, at(FLASHRL_GSM8K, 21)),
            # the paper's 1e-5 (2nd-hand); FlashRL's script has actor 1e-6 (line 25), critic 1e-5
            "train.lr": Value(1e-5, QURL + " (2nd-hand): 'GSM8K uses 1e-5, UAQ disabled'"),
            "algo.critic_lr": Value(1e-5, at(FLASHRL_GSM8K, 38)),
            "algo.kl_coef": Value(0.0, at(FLASHRL_GSM8K, 31) + " use_kl_loss=False"),
            "rollout.eval_temperature": Value(0.0, QURL + " (2nd-hand): greedy decoding"),
            "backend.val_n": Value(1, QURL + " (2nd-hand): greedy decoding"),
            "backend.tensor_parallel_size": Value(1, at(FLASHRL_GSM8K, 34)),
            "backend.gpu_memory_utilization": Value(0.4, at(FLASHRL_GSM8K, 36)),
            "backend.param_offload": Value(False, at(FLASHRL_GSM8K, 29)),
            "backend.optimizer_offload": Value(False, at(FLASHRL_GSM8K, 30)),
            # the script turns the critic's checkpointing off (line 41), the actor's stays verl's (on);
            # the suite has one switch for both: the actor's
            "backend.gradient_checkpointing": Value(True, VERL_DEFAULT + " (actor; the critic's is off at "
                                                    + at(FLASHRL_GSM8K, 41) + ")"),
            "backend.remove_padding": Value(False, at(FLASHRL_GSM8K, 26, 39)),
            "steps": Value(435, at(FLASHRL_GSM8K, 55) + " total_epochs=15 x 29 steps (7,473 / 256)"),
            "ckpt_every": Value(20, at(FLASHRL_GSM8K, 53)),
            "eval_every": Value(10, at(FLASHRL_GSM8K, 54)),
            "backend.max_ckpt_to_keep": Value(2, OURS + ": the latest and one before it"),
            "correction.tis_cap": Value(2.0, FLASHRL_README + " (QuRL: 'C follows FlashRL')"),
            "uaq.s": Value(1.0, QURL + " (2nd-hand): UAQ disabled for GSM8K"),
        },
        slurm={"timeout_min": Value(720, OURS + ": a 12 h job, requeued from its checkpoint"),
               "cpus_per_task": Value(32, OURS + ": Ray workers + data loaders of a 0.5B model"),
               "mem_gb": Value(256, OURS)},
    ),
    "qurl-dapo": Recipe(
        description="QuRL's DAPO on DAPO-Math-17k, AIME 2024 Avg@32 (Table 2), 7B",
        model="Qwen/Qwen2.5-Math-7B (" + at(VERL_DAPO_7B, 37) + "; its 4,096-token context is widened by "
              "backend.max_position_embeddings)",
        train_data="dapo-math-17k",
        val_data=("aime24-dapo",),
        gpus="8 nodes x 8 GPUs (" + at(VERL_DAPO_7B, 33, 34) + ")",
        gpu_hours=("~5,000 H100-hours per 1,000 steps: our rough estimate (8,192 responses of ~3K tokens a step at "
                   "~2.5K tokens/s per GPU, rollout about half the step, 64 GPUs), not measured"),
        h100_hours=(5000, 5000),
        groups={"backend": "verl", "algo": "dapo"},
        values={
            "backend.dataset": Value("dapo-math-17k", QURL + " Table 2 (2nd-hand)"),
            "rollout.prompts_per_step": Value(512, at(VERL_DAPO_7B, 25) + " train_prompt_bsz"),
            "algo.group_size": Value(16, at(VERL_DAPO_7B, 26) + " n_resp_per_prompt"),
            "train.minibatches": Value(16, at(VERL_DAPO_7B, 27) + " train_prompt_mini_bsz=32 of 512"),
            "backend.micro_batch_size_per_gpu": Value(4, OURS + ": unused with dynamic batches"),
            "backend.use_dynamic_bsz": Value(True, at(VERL_DAPO_7B, 50)),
            "backend.ppo_max_token_len_per_gpu": Value(20480, at(VERL_DAPO_7B, 51) + " (prompt + response) x 2"),
            "backend.log_prob_max_token_len_per_gpu": Value(30720, at(VERL_DAPO_7B, 52) + " (prompt + response) x 3"),
            "backend.max_prompt_length": Value(2048, at(VERL_DAPO_7B, 17)),
            "rollout.max_new_tokens": Value(8192, at(VERL_DAPO_7B, 18) + " (the 32B recipes use 20480)"),
            "train.lr": Value(1e-6, QURL + " (2nd-hand) ablation table: s=1.5 at lr 1e-6; " + at(VERL_DAPO_7B, 84)),
            "backend.lr_warmup_steps": Value(10, at(VERL_DAPO_7B, 85)),
            "train.weight_decay": Value(0.1, at(VERL_DAPO_7B, 86)),
            "train.grad_clip": Value(1.0, at(VERL_DAPO_7B, 91)),
            "algo.clip_low": Value(0.2, at(VERL_DAPO_7B, 14)),
            "algo.clip_high": Value(0.28, at(VERL_DAPO_7B, 15)),
            "algo.dual_clip": Value(10.0, at(VERL_DAPO_7B, 73) + " clip_ratio_c"),
            "algo.agg": Value("token-mean", at(VERL_DAPO_7B, 23)),
            "algo.overlong_buffer": Value(4096, at(VERL_DAPO_7B, 20)),
            "algo.overlong_penalty": Value(1.0, at(VERL_DAPO_7B, 21)),
            "algo.dynamic_sampling": Value(True, VERL_DAPO_32B + " filter_groups (the 7B script runs without)"),
            # embedded only: verl's v1 trainer refills the batch without a bound on generation rounds
            "algo.max_resample_rounds": Value(9, VERL_DAPO_32B + " max_num_gen_batches=10 (embedded runs only)"),
            "algo.kl_coef": Value(0.0, at(VERL_DAPO_7B, 11, 12) + " use_kl_loss=False"),
            "rollout.temperature": Value(1.0, at(VERL_DAPO_7B, 43)),
            "rollout.top_p": Value(1.0, at(VERL_DAPO_7B, 44)),
            "rollout.eval_temperature": Value(1.0, at(VERL_DAPO_7B, 101) + " val_kwargs.temperature"),
            "backend.val_top_p": Value(0.7, at(VERL_DAPO_7B, 46)),
            "backend.val_n": Value(32, QURL + " Table 2 (2nd-hand): AIME 2024 Avg@32"),
            "backend.tensor_parallel_size": Value(4, at(VERL_DAPO_7B, 54) + " gen_tp"),
            "backend.gpu_memory_utilization": Value(0.8, at(VERL_DAPO_7B, 94)),
            "backend.max_num_batched_tokens": Value(10240, at(VERL_DAPO_7B, 97) + " prompt + response"),
            "backend.gradient_checkpointing": Value(True, at(VERL_DAPO_7B, 83)),
            "backend.remove_padding": Value(True, at(VERL_DAPO_7B, 74)),
            # the 7B script's memory layout: Ulysses SP 4 (actor and reference), parameters, optimizer and
            # reference offloaded, and the context window widened to 32K tokens
            "backend.sequence_parallel_size": Value(4, at(VERL_DAPO_7B, 49, 93, 107)),
            "backend.param_offload": Value(True, at(VERL_DAPO_7B, 53, 88)),
            "backend.optimizer_offload": Value(True, at(VERL_DAPO_7B, 53, 89)),
            "backend.ref_param_offload": Value(True, at(VERL_DAPO_7B, 53, 106)),
            "backend.max_position_embeddings": Value(32768, at(VERL_DAPO_7B, 75)),
            # the script's fsdp_size=32 (line 55) shards over 32 of its 64 GPUs: a cluster-shape choice that must
            # divide the GPUs a run has, so the recipe leaves it to verl (all GPUs); set it with the profile
            "backend.fsdp_size": Value(-1, OURS + ": " + at(VERL_DAPO_7B, 55) + "'s 32 assumes 8 x 8 GPUs; -1 = "
                                       "shard over all of the run's GPUs"),
            "steps": Value(1000, QURL + " (2nd-hand): the KL drift plotted over 1,000 steps"),
            "ckpt_every": Value(10, at(VERL_DAPO_7B, 122)),
            "eval_every": Value(10, at(VERL_DAPO_7B, 121)),
            "backend.max_ckpt_to_keep": Value(2, OURS + ": the latest and one before it (~90 GB each at 7B)"),
            "correction.tis_cap": Value(8.0, FLASHRL_README + " (QuRL: 'C follows FlashRL')"),
            "uaq.s": Value(1.5, QURL + " (2nd-hand): s=1.5 best, 2.0 worse"),
        },
        slurm={"timeout_min": Value(2880, OURS + ": a 48 h job, requeued from its checkpoint"),
               "cpus_per_task": Value(96, OURS + ": a whole 8-GPU node for Ray's workers"),
               "mem_gb": Value(1024, OURS + ": FSDP offload of a 7B actor + optimizer")},
    ),
    "qurl-deepscaler": Recipe(
        description=("QuRL's GRPO on DeepScaleR data, five benchmarks Avg@32 (Table 3), DeepScaleR's 8K stage; "
                     "the 7B trained rows, the 1.5B base row"),
        model=("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B for the trained rows (QuRL's text: '7B + DeepScaleR'), "
               "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B for the Base (SFT) row, whose published scores are the "
               "1.5B distill's (score it with `suite eval --model`; DeepScaleR's own script trains the 1.5B): each "
               "pairs only with the rows of its own size (analysis/paper_main.csv model_id; "
               "docs/recipes_sources.md)"),
        train_data="deepscaler",
        val_data=("aime24", "amc", "math500", "minerva", "olympiadbench"),
        gpus="1 node x 8 GPUs (" + at(DEEPSCALER, 62, 63) + ", for the 1.5B model)",
        gpu_hours=("DeepScaleR reports ~3,800 A100-hours for its three 1.5B stages (8K, 16K, 24K); a 7B 8K stage of "
                   "1,040 steps: our rough estimate ~4x the 1.5B's 8K stage, not measured"),
        # the 8K stage as a quarter to a half of the 3,800 A100-hours, x4 for 7B, A100 ~ H100 / 2..3
        h100_hours=(2000, 4000),
        groups={"backend": "verl", "algo": "grpo"},
        values={
            "backend.dataset": Value("deepscaler", QURL + " Table 3 (2nd-hand)"),
            "rollout.prompts_per_step": Value(128, at(DEEPSCALER, 31)),
            "algo.group_size": Value(8, at(DEEPSCALER, 53)),
            "train.minibatches": Value(2, at(DEEPSCALER, 38) + " ppo_mini_batch_size=64 of 128"),
            "backend.micro_batch_size_per_gpu": Value(4, OURS + ": unused with dynamic batches"),
            "backend.use_dynamic_bsz": Value(True, at(DEEPSCALER, 39)),
            "backend.ppo_max_token_len_per_gpu": Value(32768, at(DEEPSCALER, 40)),
            "backend.log_prob_max_token_len_per_gpu": Value(32768, VERL_DEFAULT + " = actor.ppo_max_token_len_per_gpu ("
                                                            + at(DEEPSCALER, 40) + ")"),
            "backend.max_prompt_length": Value(1024, at(DEEPSCALER, 33)),
            "rollout.max_new_tokens": Value(8192, at(DEEPSCALER, 34)),
            "train.lr": Value(1e-6, at(DEEPSCALER, 36)),
            "algo.kl_coef": Value(0.001, QURL + " (2nd-hand): k3 KL, coefficient 1e-3; " + at(DEEPSCALER, 41, 42)),
            "algo.kl_estimator": Value("k3", QURL + " (2nd-hand): k3 KL; " + at(DEEPSCALER, 43)),
            "rollout.temperature": Value(0.6, at(DEEPSCALER, 50)),
            "rollout.eval_temperature": Value(0.6, at(DEEPSCALER, 51) + "; " + DEEPSCALER_EVAL + " temperature=0.6"),
            "backend.val_top_p": Value(0.95, DEEPSCALER_EVAL + " top_p=0.95"),
            # the eval script scores with 32K-token responses, while the 8K stage trains (and validates) at 8K
            "backend.val_max_new_tokens": Value(32768, DEEPSCALER_EVAL + " MAX_LENGTH=32768 (rollout.response_length)"),
            # the script leaves actor.entropy_coeff at its verl copy's default
            "backend.entropy_coeff": Value(0.001, DEEPSCALER_VERL + " actor.entropy_coeff: 0.001; " + DEEPSCALER
                                           + " does not set it"),
            "backend.val_n": Value(32, QURL + " Table 3 (2nd-hand): Avg@32"),
            "backend.tensor_parallel_size": Value(1, at(DEEPSCALER, 48)),
            "backend.gpu_memory_utilization": Value(0.85, at(DEEPSCALER, 52)),
            "backend.gradient_checkpointing": Value(True, at(DEEPSCALER, 45)),
            "backend.remove_padding": Value(True, at(DEEPSCALER, 37)),
            "backend.sequence_parallel_size": Value(1, at(DEEPSCALER, 44)),
            "backend.param_offload": Value(False, at(DEEPSCALER, 46)),
            "backend.optimizer_offload": Value(False, at(DEEPSCALER, 47)),
            "backend.ref_param_offload": Value(True, at(DEEPSCALER, 55)),
            "steps": Value(1040, "rllm README: the 8K stage ran 1,040 steps"),
            "ckpt_every": Value(20, at(DEEPSCALER, 64)),
            "eval_every": Value(20, at(DEEPSCALER, 65)),
            "backend.max_ckpt_to_keep": Value(2, OURS + ": the latest and one before it"),
            "correction.tis_cap": Value(2.0, OURS + ": FlashRL's C for GSM8K (" + FLASHRL_README + "); not stated for "
                                        "this task"),
            "uaq.s": Value(1.5, QURL + " (2nd-hand): the 'w/ UAQ' row"),
        },
        slurm={"timeout_min": Value(2880, OURS + ": a 48 h job, requeued from its checkpoint"),
               "cpus_per_task": Value(96, OURS + ": a whole 8-GPU node for Ray's workers"),
               "mem_gb": Value(512, OURS)},
    ),
    "qarl-math": Recipe(
        description="QaRL's GRPO with W4A16 rollouts on Qwen2.5-Math, 16K-token responses (Tables 1-2)",
        model="Qwen/Qwen2.5-Math-1.5B or -7B (" + QARL + " Table 1; backend.max_position_embeddings widens their "
              "4,096-token context to 2K + 16K tokens)",
        train_data="openr1-math",
        val_data=("aime24", "aime25", "amc", "math500", "minerva", "olympiadbench"),
        gpus="1 node x 8 H800 (" + QARL + " Table 2)",
        gpu_hours="not stated by the paper; ~1,000 H100-hours for 300 steps of 1.5B: our rough estimate, not measured",
        h100_hours=(1000, 1000),
        groups={"backend": "verl", "algo": "grpo", "quant": "w4a16", "correction": "tbpo"},
        values={
            "backend.dataset": Value("openr1-math-46k", QARL + " (2nd-hand): OpenR1-Math-46K"),
            "rollout.prompts_per_step": Value(512, QARL + " Table 2 data.train_batch_size"),
            "algo.group_size": Value(8, QARL + " Table 2 rollout.n"),
            "train.minibatches": Value(16, OURS + ": " + at(VERL_DAPO_7B, 27) + "'s mini-batch of 32 prompts (not "
                                       "stated)"),
            "backend.micro_batch_size_per_gpu": Value(4, OURS + ": unused with dynamic batches"),
            "backend.use_dynamic_bsz": Value(True, OURS + ": " + at(VERL_DAPO_7B, 50) + " (not stated)"),
            "backend.ppo_max_token_len_per_gpu": Value(36864, OURS + ": (prompt + response) x 2 as "
                                                       + at(VERL_DAPO_7B, 51)),
            "backend.log_prob_max_token_len_per_gpu": Value(55296, OURS + ": (prompt + response) x 3 as "
                                                            + at(VERL_DAPO_7B, 52)),
            "backend.max_prompt_length": Value(2048, QARL + " Table 2"),
            "rollout.max_new_tokens": Value(16384, QARL + " Table 2"),
            "backend.max_position_embeddings": Value(32768, OURS + ": 2K + 16K tokens need more than the models' "
                                                     "4,096, as " + at(VERL_DAPO_7B, 75)),
            # QaRL trains with Muon (2nd-hand); verl's actor has AdamW only: lr, betas, decay are verl's
            "correction.tbpo_delta_pos": Value(4e-4, QARL + " (2nd-hand): seq_clip_ratio_high"),
            "correction.tbpo_delta_neg_low": Value(3e-4, QARL + " (2nd-hand): neg_seq_clip_ratio_low"),
            "correction.tbpo_delta_neg_high": Value(7e-4, QARL + " (2nd-hand): neg_seq_clip_ratio_high"),
            "correction.tbpo_seq_cap": Value(2.0, QARL + " (2nd-hand): seq_tis_imp_ratio_cap"),
            # QaRL's sequence ratio is length-normalised (2nd-hand) and its deltas are GSPO's, which only bind
            # on a geometric mean; verl's sequence IS weight (a product) is `correction.tbpo_seq_weight=product`
            "correction.tbpo_seq_weight": Value("geomean", QARL + " (2nd-hand): length-normalised sequence ratio "
                                                "(GSPO's, whose clip values its deltas are)"),
            "correction.aligned_forward": Value(True, QARL + ": the rollout-aligned training forward"),
            "quant.group_size": Value(128, OURS + ": W4A16's usual group (QaRL does not state it)"),
            "backend.tensor_parallel_size": Value(1, OURS + ": one GPU per rollout replica of a 1.5B / 7B model "
                                                  "(verl's default is 2; not stated)"),
            "steps": Value(300, OURS + " (not stated)"),
            "ckpt_every": Value(20, OURS + " (not stated)"),
            "eval_every": Value(20, OURS + " (not stated)"),
            "backend.max_ckpt_to_keep": Value(2, OURS + ": the latest and one before it"),
            "uaq.s": Value(1.0, QARL + ": no UAQ"),
        },
        slurm={"timeout_min": Value(2880, OURS + ": a 48 h job, requeued from its checkpoint"),
               "cpus_per_task": Value(96, OURS + ": a whole 8-GPU node for Ray's workers"),
               "mem_gb": Value(1024, OURS)},
    ),
}
DEFAULT_RECIPE = "laptop"


def _nested(values: dict[str, Value]) -> dict:
    out: dict = {}
    for key, v in values.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v.value
    return out


def resolved_values(name: str) -> dict[str, Value]:
    """Every value recipe ``name`` sets: its own, then verl's default (VERL_DEFAULTS) for each key it
    leaves open, in that order. The laptop recipe sets nothing."""
    r = RECIPES[name]
    if r.groups.get("backend") != "verl":
        return dict(r.values)
    values = dict(r.values)
    for key, (value, verl_key) in VERL_DEFAULTS.items():
        values.setdefault(key, Value(value, f"{VERL_DEFAULT} ({verl_key}); the paper and its script leave it open"))
    # the papers' accuracies are of the trained policy in bf16, per benchmark (suite.evaluation)
    values.setdefault("backend.eval_after_train", Value(True, OURS + ": `suite eval` of the last checkpoint in bf16 "
                                                        "and by the rollout engine, as the papers score"))
    return values


# the values that make a recipe's eval protocol (`suite eval`: samples, temperature, top_p, response budget)
EVAL_KEYS = ("backend.val_n", "rollout.eval_temperature", "backend.val_top_p", "backend.val_max_new_tokens",
             "rollout.max_new_tokens")


def eval_sources(name: str) -> list[tuple[str, Any, str]]:
    """(key, value, source) of each value recipe ``name`` sets for its eval protocol."""
    values = resolved_values(name)
    return [(k, values[k].value, values[k].source) for k in EVAL_KEYS if k in values]


def register(cs: ConfigStore) -> None:
    """Store each recipe as `recipe/<name>` in the ConfigStore (package `_global_`)."""
    for name, r in RECIPES.items():
        values = resolved_values(name)
        if r.groups.get("backend") == "verl":
            values["backend.recipe"] = Value(name, OURS)
        defaults = [{f"override /{g}": choice} for g, choice in r.groups.items()] + ["_self_"]
        cs.store(group="recipe", name=name, package="_global_", node={"defaults": defaults, **_nested(values)})


def recipe_slurm(name: str) -> dict[str, Any]:
    """The recipe's per-node SLURM resources (empty for the laptop recipe)."""
    return {k: v.value for k, v in RECIPES[name].slurm.items()}


def recipe_rows(name: str) -> list[tuple[str, Any, str]]:
    """(key, value, source) of every setting of recipe ``name``: group choices, values, SLURM."""
    r = RECIPES[name]
    rows = [(g, choice, "the experiment") for g, choice in r.groups.items()]
    rows += [(k, v.value, v.source) for k, v in resolved_values(name).items()]
    rows += [(f"resources.{k}", v.value, v.source) for k, v in r.slurm.items()]
    return rows


def recipes_markdown() -> str:
    """docs/recipes.md: every paper recipe's table (``python -m suite.recipes > docs/recipes.md``;
    a test keeps the file equal to this)."""
    out = ["# Paper recipes (`recipe=NAME`)", "",
           "Generated from suite/recipes.py by `python -m suite.recipes > docs/recipes.md`; a test keeps the two "
           "equal. How the sources were read, and where they disagree: docs/recipes_sources.md. Running them: "
           "docs/verl.md, \"Running the papers on a cluster\".", ""]
    for name, r in RECIPES.items():
        if name == DEFAULT_RECIPE:
            continue
        train = f"`{r.train_data}`" if r.train_data else "not prepared by `suite data prepare`"
        out += [f"## `{name}`", "", f"{r.description}.", "", f"- model: {r.model}",
                f"- data: train {train}; held-out {', '.join(f'`{v}`' for v in r.val_data)}",
                f"- trained on: {r.gpus}", f"- expected cost: {r.gpu_hours}", "",
                "| key | value | source |", "|---|---|---|"]
        out += [f"| `{k}` | {v} | {src} |" for k, v, src in recipe_rows(name)]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(recipes_markdown(), end="")
