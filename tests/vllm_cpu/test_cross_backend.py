"""The same cell on both backends, before any RL step: `suite export` of an embedded warm start,
validated through verl on vLLM's CPU build (FSDP in fp32: ``backend.param_dtype=fp32``), scores the
held-out set as the embedded trainer's own evaluation does. Export, tokenizer, chat template, EOS
and the reward all sit on this path: a space between decoded characters, a ``<bos>`` the embedded
model never saw, or a stop token vLLM does not know would each put verl's accuracy near 0.

Greedy on both sides, on the same 64 prompts; the embedded evaluation runs the float32 model, verl's
vLLM engine the bf16 rollout (the precision every CPU kind serves), so a few near-tie answers may
differ: the check is |verl - embedded| <= max(0.05, 2 standard errors of the difference). About
4 minutes on 2 cores (a 300-step warm start, one verl step)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import mlflow
import pytest
from test_verl_grpo import RUN_TIMEOUT_S, root_cause
from vllm_tiny import NUMBERS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(os.environ.get("SUITE_VLLM_CPU_EMULATE")), reason=(
    "SUITE_VLLM_CPU_EMULATE: verl's workers are subprocesses, which the emulation does not reach"))]

N_EVAL = 64


def test_an_exported_warm_start_validates_through_verl_as_the_embedded_trainer_scores_it(tmp_path):
    from suite.config import compose_config
    from suite.embedded.export import export
    from suite.embedded.trainer import EmbeddedRun

    cell = [f"task.n_eval={N_EVAL}", "warm_start.steps=300", "threads=2", "uaq.s=1.0",
            f"warm_start.cache_dir={tmp_path / 'warm'}"]
    cfg = compose_config([*cell, f"out_dir={tmp_path / 'runs'}"])
    paths = export(cfg, tmp_path / "export", progress=False)
    run = EmbeddedRun(cfg, str(tmp_path / "runs" / "embedded"), progress=False)
    run.build()  # the same cached warm start the export wrote
    embedded = run.evaluate()
    max_prompt = max(len(ex.prompt) for ex in run.eval_set + run.train_pool[:2000])

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["run", "backend=verl", "backend.device=cpu", f"backend.python={sys.executable}",
            "backend.param_dtype=fp32", f"backend.model_path={paths['model']}", f"backend.train_files={paths['train']}",
            f"backend.val_files={paths['test']}", f"backend.reward_fn_path={paths['reward']}",
            "backend.n_gpus_per_node=1", f"backend.max_prompt_length={max_prompt + 2}",
            "backend.micro_batch_size_per_gpu=4", "backend.max_num_batched_tokens=2048", "quant=bf16",
            "correction=naive", "algo=grpo", "rollout.prompts_per_step=4", "algo.group_size=2", "train.minibatches=1",
            "steps=1", "eval_every=1", "ckpt_every=100", *cell, f"out_dir={tmp_path / 'runs'}",
            f"tracking.tracking_uri={uri}"]
    proc = subprocess.run([sys.executable, "-c", "import sys; from suite.cli import main; sys.argv[0] = 'suite'; "
                           "main()", *args], cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:] + root_cause(tmp_path / "runs")
    client = mlflow.tracking.MlflowClient(uri)
    runs = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
            if r.data.tags.get("backend") == "verl"]
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    history = client.get_metric_history(runs[0].info.run_id, "val-core/arith/acc/mean_at_1")
    before = min(history, key=lambda m: m.step)  # verl validates before its first step
    assert before.step == 0, [(m.step, m.value) for m in history]
    verl = before.value
    se = math.sqrt(verl * (1 - verl) / N_EVAL + embedded * (1 - embedded) / N_EVAL)
    NUMBERS.append(f"held-out accuracy before RL, {N_EVAL} prompts, greedy: embedded (fp32) {embedded:.3f}, "
                   f"verl on vLLM CPU (bf16) {verl:.3f}")
    assert 0.1 < embedded < 0.95, f"the warm start must answer some and miss some ({embedded})"
    assert abs(verl - embedded) <= max(0.05, 2 * se), (verl, embedded, se)
