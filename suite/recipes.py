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

# Short names of the sources cited below (docs/recipes_sources.md has their commits and files).
QURL = "QuRL arXiv 2602.13953"
QARL = "QaRL arXiv 2604.07853"
FLASHRL_GSM8K = "FlashRL recipe/flash_rl/gsm8k_qwen0_5b_int8.sh"
FLASHRL_DAPO = "FlashRL recipe/flash_rl/dapo_qwen32b_int8.sh"
VERL_DAPO_7B = "verl v0.5.0 recipe/dapo/test_dapo_7b_math.sh"
VERL_DAPO_32B = "verl v0.5.0 recipe/dapo/run_dapo_qwen2.5_32b.sh"
DEEPSCALER = "rllm scripts/deepscaler/train/deepscaler_1.5b_8k.sh"
VERL_DEFAULT = "verl 0.9.1 default (trainer/config)"
OURS = "ours"


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
    groups: dict[str, str] = field(default_factory=dict)  # group choices (backend, algo, quant, correction)
    values: dict[str, Value] = field(default_factory=dict)  # dotted run-config key -> value
    # per-node SLURM resources for this model size: timeout_min, cpus_per_task, mem_gb
    slurm: dict[str, Value] = field(default_factory=dict)


RECIPES: dict[str, Recipe] = {
    "laptop": Recipe(description="today's defaults: the embedded backend's tiny model on the synthetic tasks"),
    "qurl-gsm8k": Recipe(
        description="QuRL's PPO on GSM8K (Table 1), FlashRL's setup",
        model="Qwen/Qwen2.5-0.5B-Instruct",
        train_data="gsm8k",
        val_data=("gsm8k",),
        gpus="1 node x 4 GPUs (" + FLASHRL_GSM8K + ")",
        gpu_hours="~10-20 H100-hours per run: our rough estimate (435 steps of a 0.5B model on 4 GPUs), not measured",
        groups={"backend": "verl", "algo": "ppo"},
        values={
            "backend.dataset": Value("gsm8k", QURL + " Table 1 (2nd-hand)"),
            "rollout.prompts_per_step": Value(256, FLASHRL_GSM8K),
            "algo.group_size": Value(1, VERL_DEFAULT + " rollout.n (PPO with a critic)"),
            "train.minibatches": Value(4, FLASHRL_GSM8K + " ppo_mini_batch_size=64"),
            "train.epochs": Value(1, VERL_DEFAULT + " ppo_epochs"),
            "backend.micro_batch_size_per_gpu": Value(4, FLASHRL_GSM8K),
            "backend.max_prompt_length": Value(1024, FLASHRL_GSM8K),
            "rollout.max_new_tokens": Value(512, FLASHRL_GSM8K),
            # the paper's 1e-5 (2nd-hand); FlashRL's script has actor 1e-6, critic 1e-5
            "train.lr": Value(1e-5, QURL + " (2nd-hand): 'GSM8K uses 1e-5, UAQ disabled'"),
            "algo.critic_lr": Value(1e-5, FLASHRL_GSM8K),
            "backend.lr_warmup_steps": Value(-1, VERL_DEFAULT + " (no warm-up)"),
            "train.weight_decay": Value(0.01, VERL_DEFAULT),
            "algo.clip_low": Value(0.2, VERL_DEFAULT),
            "algo.clip_high": Value(0.2, VERL_DEFAULT),
            "algo.dual_clip": Value(3.0, VERL_DEFAULT + " clip_ratio_c"),
            "algo.kl_coef": Value(0.0, FLASHRL_GSM8K + " use_kl_loss=False"),
            "rollout.temperature": Value(1.0, VERL_DEFAULT),
            "rollout.top_p": Value(1.0, VERL_DEFAULT),
            "rollout.eval_temperature": Value(0.0, QURL + " (2nd-hand): greedy decoding"),
            "backend.val_n": Value(1, QURL + " (2nd-hand): greedy decoding"),
            "backend.val_top_p": Value(1.0, VERL_DEFAULT),
            "backend.tensor_parallel_size": Value(1, FLASHRL_GSM8K),
            "backend.gpu_memory_utilization": Value(0.4, FLASHRL_GSM8K),
            "backend.use_dynamic_bsz": Value(False, FLASHRL_GSM8K),
            "backend.gradient_checkpointing": Value(True, VERL_DEFAULT),
            "backend.remove_padding": Value(False, FLASHRL_GSM8K),
            "steps": Value(435, FLASHRL_GSM8K + " total_epochs=15 x 29 steps"),
            "ckpt_every": Value(20, FLASHRL_GSM8K),
            "eval_every": Value(10, FLASHRL_GSM8K),
            "backend.max_ckpt_to_keep": Value(2, OURS + ": the latest and one before it"),
            "correction.tis_cap": Value(2.0, FLASHRL_GSM8K + " (QuRL: 'C follows FlashRL')"),
            "uaq.s": Value(1.0, QURL + " (2nd-hand): UAQ disabled for GSM8K"),
        },
        slurm={"timeout_min": Value(720, OURS + ": a 12 h job, requeued from its checkpoint"),
               "cpus_per_task": Value(32, OURS + ": Ray workers + data loaders of a 0.5B model"),
               "mem_gb": Value(256, OURS)},
    ),
    "qurl-dapo": Recipe(
        description="QuRL's DAPO on DAPO-Math-17k, AIME 2024 Avg@32 (Table 2), 7B",
        model="Qwen/Qwen2.5-Math-7B (set max_position_embeddings=32768 in its config.json, as the verl recipe says)",
        train_data="dapo-math-17k",
        val_data=("aime24",),
        gpus="8 nodes x 8 GPUs (" + VERL_DAPO_7B + ")",
        gpu_hours=("~5,000 H100-hours per 1,000 steps: our rough estimate (8,192 responses of ~3K tokens a step at "
                   "~2.5K tokens/s per GPU, rollout about half the step, 64 GPUs), not measured"),
        groups={"backend": "verl", "algo": "dapo"},
        values={
            "backend.dataset": Value("dapo-math-17k", QURL + " Table 2 (2nd-hand)"),
            "rollout.prompts_per_step": Value(512, VERL_DAPO_7B + " train_prompt_bsz"),
            "algo.group_size": Value(16, VERL_DAPO_7B + " n_resp_per_prompt"),
            "train.minibatches": Value(16, VERL_DAPO_7B + " train_prompt_mini_bsz=32"),
            "train.epochs": Value(1, VERL_DEFAULT + " ppo_epochs"),
            "backend.micro_batch_size_per_gpu": Value(4, VERL_DEFAULT + " (unused with dynamic batches)"),
            "backend.use_dynamic_bsz": Value(True, VERL_DAPO_7B),
            "backend.ppo_max_token_len_per_gpu": Value(20480, VERL_DAPO_7B + " (prompt + response) x 2"),
            "backend.log_prob_max_token_len_per_gpu": Value(30720, VERL_DAPO_7B + " (prompt + response) x 3"),
            "backend.max_prompt_length": Value(2048, VERL_DAPO_7B),
            "rollout.max_new_tokens": Value(8192, VERL_DAPO_7B + " (the 32B recipes use 20480)"),
            "train.lr": Value(1e-6, QURL + " (2nd-hand) ablation table: s=1.5 at lr 1e-6"),
            "backend.lr_warmup_steps": Value(10, VERL_DAPO_7B),
            "train.weight_decay": Value(0.1, VERL_DAPO_7B),
            "train.grad_clip": Value(1.0, VERL_DAPO_7B),
            "algo.clip_low": Value(0.2, VERL_DAPO_7B),
            "algo.clip_high": Value(0.28, VERL_DAPO_7B),
            "algo.dual_clip": Value(10.0, VERL_DAPO_7B + " clip_ratio_c"),
            "algo.agg": Value("token-mean", VERL_DAPO_7B),
            "algo.overlong_buffer": Value(4096, VERL_DAPO_7B),
            "algo.overlong_penalty": Value(1.0, VERL_DAPO_7B),
            "algo.dynamic_sampling": Value(True, VERL_DAPO_32B + " filter_groups (the 7B script runs without)"),
            # embedded only: verl's v1 trainer refills the batch without a bound on generation rounds
            "algo.max_resample_rounds": Value(9, VERL_DAPO_32B + " max_num_gen_batches=10 (embedded runs only)"),
            "algo.kl_coef": Value(0.0, VERL_DAPO_7B + " use_kl_loss=False"),
            "rollout.temperature": Value(1.0, VERL_DAPO_7B),
            "rollout.top_p": Value(1.0, VERL_DAPO_7B),
            "rollout.eval_temperature": Value(1.0, VERL_DAPO_7B + " val_kwargs"),
            "backend.val_top_p": Value(0.7, VERL_DAPO_7B + " val_kwargs"),
            "backend.val_n": Value(32, QURL + " Table 2 (2nd-hand): AIME 2024 Avg@32"),
            "backend.tensor_parallel_size": Value(4, VERL_DAPO_7B + " gen_tp"),
            "backend.gpu_memory_utilization": Value(0.8, VERL_DAPO_7B),
            "backend.max_num_batched_tokens": Value(10240, VERL_DAPO_7B + " prompt + response"),
            "backend.gradient_checkpointing": Value(True, VERL_DAPO_7B),
            "backend.remove_padding": Value(True, VERL_DAPO_7B),
            "steps": Value(1000, QURL + " (2nd-hand): the KL drift plotted over 1,000 steps"),
            "ckpt_every": Value(10, VERL_DAPO_7B),
            "eval_every": Value(10, VERL_DAPO_7B),
            "backend.max_ckpt_to_keep": Value(2, OURS + ": the latest and one before it (~90 GB each at 7B)"),
            "correction.tis_cap": Value(8.0, FLASHRL_DAPO + " (QuRL: 'C follows FlashRL')"),
            "uaq.s": Value(1.5, QURL + " (2nd-hand): s=1.5 best, 2.0 worse"),
        },
        slurm={"timeout_min": Value(2880, OURS + ": a 48 h job, requeued from its checkpoint"),
               "cpus_per_task": Value(96, OURS + ": a whole 8-GPU node for Ray's workers"),
               "mem_gb": Value(1024, OURS + ": FSDP offload of a 7B actor + optimizer")},
    ),
    "qurl-deepscaler": Recipe(
        description="QuRL's GRPO on DeepScaleR data, five benchmarks Avg@32 (Table 3), DeepScaleR's 8K stage",
        model="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B (inferred from the base row: docs/recipes_sources.md)",
        train_data="deepscaler",
        val_data=("aime24", "amc", "math"),  # + Minerva and OlympiadBench, which `suite data prepare` does not read
        gpus="1 node x 8 GPUs (" + DEEPSCALER + ")",
        gpu_hours=("DeepScaleR reports ~3,800 A100-hours for its three stages (8K, 16K, 24K); this 8K stage is "
                   "a part of that; not measured here"),
        groups={"backend": "verl", "algo": "grpo"},
        values={
            "backend.dataset": Value("deepscaler", QURL + " Table 3 (2nd-hand)"),
            "rollout.prompts_per_step": Value(128, DEEPSCALER),
            "algo.group_size": Value(8, DEEPSCALER),
            "train.minibatches": Value(2, DEEPSCALER + " ppo_mini_batch_size=64"),
            "train.epochs": Value(1, DEEPSCALER),
            "backend.micro_batch_size_per_gpu": Value(4, VERL_DEFAULT + " (unused with dynamic batches)"),
            "backend.use_dynamic_bsz": Value(True, DEEPSCALER),
            "backend.ppo_max_token_len_per_gpu": Value(32768, DEEPSCALER),
            "backend.log_prob_max_token_len_per_gpu": Value(32768, DEEPSCALER),
            "backend.max_prompt_length": Value(1024, DEEPSCALER),
            "rollout.max_new_tokens": Value(8192, DEEPSCALER),
            "train.lr": Value(1e-6, DEEPSCALER),
            "backend.lr_warmup_steps": Value(-1, VERL_DEFAULT + " (no warm-up)"),
            "train.weight_decay": Value(0.01, VERL_DEFAULT),
            "algo.clip_low": Value(0.2, VERL_DEFAULT),
            "algo.clip_high": Value(0.2, VERL_DEFAULT),
            "algo.dual_clip": Value(3.0, VERL_DEFAULT + " clip_ratio_c"),
            "algo.kl_coef": Value(0.001, QURL + " (2nd-hand): k3 KL, coefficient 1e-3"),
            "algo.kl_estimator": Value("k3", QURL + " (2nd-hand): k3 KL"),
            "rollout.temperature": Value(0.6, DEEPSCALER),
            "rollout.top_p": Value(1.0, DEEPSCALER),
            "rollout.eval_temperature": Value(0.6, DEEPSCALER),
            "backend.val_top_p": Value(0.95, "rllm scripts/eval/eval_model.sh"),
            "backend.val_n": Value(32, QURL + " Table 3 (2nd-hand): Avg@32"),
            "backend.tensor_parallel_size": Value(1, DEEPSCALER),
            "backend.gpu_memory_utilization": Value(0.85, DEEPSCALER),
            "backend.gradient_checkpointing": Value(True, DEEPSCALER),
            "backend.remove_padding": Value(True, DEEPSCALER),
            "steps": Value(1040, "rllm README: the 8K stage ran 1,040 steps"),
            "ckpt_every": Value(20, DEEPSCALER),
            "eval_every": Value(20, DEEPSCALER),
            "backend.max_ckpt_to_keep": Value(2, OURS + ": the latest and one before it"),
            "correction.tis_cap": Value(2.0, OURS + ": FlashRL's C for a small model (not stated for this task)"),
            "uaq.s": Value(1.5, QURL + " (2nd-hand): the 'w/ UAQ' row"),
        },
        slurm={"timeout_min": Value(2880, OURS + ": a 48 h job, requeued from its checkpoint"),
               "cpus_per_task": Value(96, OURS + ": a whole 8-GPU node for Ray's workers"),
               "mem_gb": Value(512, OURS)},
    ),
    "qarl-math": Recipe(
        description="QaRL's GRPO with W4A16 rollouts on Qwen2.5-Math, 16K-token responses (Tables 1-2)",
        model="Qwen/Qwen2.5-Math-1.5B or -7B (set max_position_embeddings=32768 in config.json for 2K+16K tokens)",
        train_data="",  # OpenR1-Math-46K (2nd-hand), which `suite data prepare` does not read
        val_data=("aime24", "aime25", "amc", "math"),
        gpus="1 node x 8 H800 (" + QARL + " Table 2)",
        gpu_hours="not stated by the paper; ~1,000 H100-hours for 300 steps of 1.5B: our rough estimate, not measured",
        groups={"backend": "verl", "algo": "grpo", "quant": "w4a16", "correction": "tbpo"},
        values={
            "backend.dataset": Value("openr1-math-46k", QARL + " (2nd-hand): OpenR1-Math-46K"),
            "rollout.prompts_per_step": Value(512, QARL + " Table 2 data.train_batch_size"),
            "algo.group_size": Value(8, QARL + " Table 2 rollout.n"),
            "train.minibatches": Value(16, VERL_DAPO_7B + " mini-batch of 32 prompts (not stated)"),
            "train.epochs": Value(1, VERL_DEFAULT + " ppo_epochs"),
            "backend.micro_batch_size_per_gpu": Value(4, VERL_DEFAULT + " (unused with dynamic batches)"),
            "backend.use_dynamic_bsz": Value(True, VERL_DAPO_7B),
            "backend.ppo_max_token_len_per_gpu": Value(36864, VERL_DAPO_7B + " (prompt + response) x 2"),
            "backend.log_prob_max_token_len_per_gpu": Value(55296, VERL_DAPO_7B + " (prompt + response) x 3"),
            "backend.max_prompt_length": Value(2048, QARL + " Table 2"),
            "rollout.max_new_tokens": Value(16384, QARL + " Table 2"),
            # QaRL trains with Muon (2nd-hand); verl's actor has AdamW only
            "train.lr": Value(1e-6, VERL_DEFAULT + " (QaRL's Muon is not in verl; lr not stated)"),
            "backend.lr_warmup_steps": Value(-1, VERL_DEFAULT + " (no warm-up)"),
            "train.weight_decay": Value(0.01, VERL_DEFAULT),
            "algo.clip_low": Value(0.2, VERL_DEFAULT),
            "algo.clip_high": Value(0.2, VERL_DEFAULT),
            "algo.dual_clip": Value(3.0, VERL_DEFAULT + " clip_ratio_c"),
            "algo.kl_coef": Value(0.0, VERL_DEFAULT + " use_kl_loss=false"),
            "correction.tbpo_delta_pos": Value(4e-4, QARL + " (2nd-hand): seq_clip_ratio_high"),
            "correction.tbpo_delta_neg_low": Value(3e-4, QARL + " (2nd-hand): neg_seq_clip_ratio_low"),
            "correction.tbpo_delta_neg_high": Value(7e-4, QARL + " (2nd-hand): neg_seq_clip_ratio_high"),
            "correction.tbpo_seq_cap": Value(2.0, QARL + " (2nd-hand): seq_tis_imp_ratio_cap"),
            "correction.aligned_forward": Value(True, QARL + ": the rollout-aligned training forward"),
            "quant.group_size": Value(128, OURS + ": W4A16's usual group (QaRL does not state it)"),
            "rollout.temperature": Value(1.0, VERL_DEFAULT),
            "rollout.top_p": Value(1.0, VERL_DEFAULT),
            "rollout.eval_temperature": Value(0.0, VERL_DEFAULT + " val_kwargs (QaRL: pass@1, n not stated)"),
            "backend.val_n": Value(1, VERL_DEFAULT + " val_kwargs"),
            "backend.val_top_p": Value(1.0, VERL_DEFAULT + " val_kwargs"),
            "backend.tensor_parallel_size": Value(1, VERL_DEFAULT),
            "backend.gpu_memory_utilization": Value(0.5, VERL_DEFAULT),
            "backend.gradient_checkpointing": Value(True, VERL_DEFAULT),
            "backend.remove_padding": Value(True, VERL_DEFAULT),
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


def register(cs: ConfigStore) -> None:
    """Store each recipe as `recipe/<name>` in the ConfigStore (package `_global_`)."""
    for name, r in RECIPES.items():
        values = dict(r.values)
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
    rows += [(k, v.value, v.source) for k, v in r.values.items()]
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
