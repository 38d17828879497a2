"""A real verl 0.9.1 GRPO run on vLLM's CPU build, through `suite run backend=verl backend.device=cpu`.

2 steps of a tiny random Llama (tests/vllm_cpu/vllm_tiny.py) on the suite's arith task (its
parquet written here from suite.embedded.tasks, scored by the task's own ``verify``), INT8
rollouts on vLLM CPU with the suite's weight-sync hook (bf16 where vLLM CPU does not serve INT8), the suite's
ACR loss from the plugin.
About 6 minutes on 2 cores; every verl process runs under the subprocess timeout below (a failing
verl run hangs rather than exits). The random model never answers right, so rewards are 0: the
run checks the mechanics and where the metrics land, not learning.
"""

from __future__ import annotations

import os
import subprocess
import sys

import mlflow
import pytest

from vllm_tiny import NUMBERS, save_hf, tiny_model

RUN_TIMEOUT_S = 840  # under the 900 s per-test limit of conftest.py


def _precision() -> str:
    """INT8 where vLLM's CPU build serves it on this CPU (a VNNI dot product or AMX), else bf16: on
    an AVX2-only CPU `quant=int8` is refused at compose (its oneDNN kernel saturates: docs/verl.md,
    "vLLM's CPU build on each CPU kind"; tests/verl/test_translate.py checks the refusal)."""
    from suite.hardware import cpu_features
    from suite.verl.rollout_quant import vllm_cpu_precisions

    return "int8" if "int8" in vllm_cpu_precisions(cpu_features()) else "bf16"


PRECISION = _precision()
# verl's workers are subprocesses, which an emulated CPU kind (conftest.py) does not reach
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(os.environ.get("SUITE_VLLM_CPU_EMULATE")), reason=(
    "SUITE_VLLM_CPU_EMULATE: verl's workers are subprocesses, which the emulation does not reach"))]

REWARD = '''
from suite.embedded.tasks import make_task
from suite.embedded.traces import Example

TASK = make_task("arith", 1)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(TASK.verify(solution_str, Example(prompt="", response="", answer=str(ground_truth))))
'''


def _data(tmp_path):
    import pandas as pd

    from suite.embedded.tasks import make_split, make_task

    task = make_task("arith", 1)
    paths = {}
    for split, n in (("train", 32), ("eval", 8)):
        # data_source "arith": held-out accuracy lands as val-core/arith/..., the embedded key
        rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": ex.prompt}],
                 "reward_model": {"style": "rule", "ground_truth": ex.answer}, "extra_info": {"index": i}}
                for i, ex in enumerate(make_split(task, n, seed=0, split=split))]
        paths[split] = tmp_path / f"{split}.parquet"
        pd.DataFrame(rows).to_parquet(paths[split])
    return paths, task


def run_verl(tmp_path, reward: str, *overrides: str, precision: str = PRECISION, steps: int = 2):
    """`suite run backend=verl backend.device=cpu` of the tiny model on the arith parquet, scored by
    ``reward`` (a python file's text), for ``steps`` RL steps, with ``overrides`` last; (the process,
    its MLflow store)."""
    model = save_hf(tiny_model(0), tmp_path / "model")  # its chat template writes the content alone
    paths, task = _data(tmp_path)
    (tmp_path / "reward.py").write_text(reward)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [
        "run", "backend=verl", "backend.device=cpu", f"backend.python={sys.executable}",
        f"backend.model_path={model}", f"backend.train_files={paths['train']}", f"backend.val_files={paths['eval']}",
        f"backend.reward_fn_path={tmp_path / 'reward.py'}", "backend.n_gpus_per_node=1",
        f"backend.max_prompt_length={task.max_prompt_chars + 2}", "backend.micro_batch_size_per_gpu=4",
        "backend.max_num_batched_tokens=512", f"quant={precision}", "correction=acr",
        "rollout.prompts_per_step=4", "algo.group_size=2", "rollout.max_new_tokens=8", "train.minibatches=1",
        f"steps={steps}", "eval_every=2", "ckpt_every=100", "uaq.s=1.0", f"out_dir={tmp_path / 'runs'}",
        f"tracking.tracking_uri={uri}", *overrides,
    ]
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; from suite.cli import main; sys.argv[0] = 'suite'; main()",
                           *args], cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    return proc, uri


def test_verl_grpo_two_steps_on_vllm_cpu(tmp_path):
    proc, uri = run_verl(tmp_path, REWARD, "algo=grpo")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:] + root_cause(tmp_path / "runs")
    client = mlflow.tracking.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    r = runs[0]
    assert (r.data.tags["precision"], r.data.tags["correction"]) == (PRECISION, "acr")
    for key in ("rollout_corr/kl", "timing_s/step", "timing_s/update_weights", "actor/pg_loss",
                "actor/acr_relaxed_frac", "val-core/arith/acc/mean_at_1"):
        assert key in r.data.metrics, key
    steps = [m.step for m in client.get_metric_history(r.info.run_id, "timing_s/step")]
    assert sorted(steps) == [1, 2]
    _embedded_run_beside(tmp_path, uri, r)
    NUMBERS.append("verl GRPO on vLLM CPU, 2 steps: " + ", ".join(
        f"{k} {r.data.metrics[k]:.3g}" for k in ("timing_s/step", "timing_s/update_weights", "rollout_corr/kl",
                                                  "actor/acr_relaxed_frac")))



ERROR_MARKS = ("Traceback (most recent call last)", " ERROR ", "out of memory", "OutOfMemory", "corruption",
               "Segmentation fault", "core dumped", "EngineDeadError", "Worker failed")


def root_cause(runs) -> str:
    """The first error verl's log holds (a dead vLLM engine's own traceback comes long before
    the driver's last lines), so a failure in CI says why the engine died."""
    for log in sorted(runs.glob("*/verl.log")):
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if "Warning" not in line and any(m in line for m in ERROR_MARKS):
                return f"\n--- first error in {log}:\n" + "\n".join(lines[max(0, i - 5):i + 40])
    return ""


def _embedded_run_beside(tmp_path, uri, verl_run):
    """An embedded run of the same cell in the same store: the two backends' runs carry the metric
    names the report reads, and `suite report`'s tables hold both, one row per backend."""
    from suite.config import compose_config
    from suite.embedded.trainer import EmbeddedRun
    from suite.report.data import load_runs
    from suite.report.tables import kl_table

    cfg = compose_config([
        f"quant={PRECISION}", "correction=acr", "algo=grpo", "uaq.s=1.0", "steps=2", "eval_every=2", "ckpt_every=2",
        "rollout.prompts_per_step=4", "algo.group_size=2", "rollout.max_new_tokens=8", "task.difficulty=1",
        "task.n_eval=8", "warm_start.steps=20", "warm_start.batch_size=8", "threads=1",
        f"warm_start.cache_dir={tmp_path / 'warm'}", f"out_dir={tmp_path / 'runs'}", f"tracking.tracking_uri={uri}",
    ])
    EmbeddedRun(cfg, str(tmp_path / "runs" / "embedded"), progress=False).run()
    client = mlflow.tracking.MlflowClient(uri)
    emb = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
           if r.data.tags.get("backend") == "embedded"]
    assert len(emb) == 1
    shared = {"rollout_corr/kl", "rollout_corr/k3_kl", "timing_s/step", "timing_s/gen", "timing_s/update_weights",
              "actor/pg_loss", "actor/pg_clipfrac", "actor/acr_relaxed_frac", "val-core/arith/acc/mean_at_1"}
    assert shared <= set(verl_run.data.metrics) and shared <= set(emb[0].data.metrics)
    data = load_runs(uri)
    runs = data.runs.set_index("backend")
    assert sorted(runs.index) == ["embedded", "verl"]
    for backend in ("embedded", "verl"):
        assert runs.loc[backend, "status"] == "FINISHED"
        assert runs.loc[backend, "acc"] == pytest.approx(
            (verl_run if backend == "verl" else emb[0]).data.metrics["val-core/arith/acc/mean_at_1"])
    kl = kl_table(data.runs)
    assert sorted(kl["backend"]) == ["embedded", "verl"], kl.to_string()
    assert kl["kl_last"].notna().all(), kl.to_string()

