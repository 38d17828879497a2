"""DAPO's dynamic sampling through `suite run backend=verl backend.device=cpu algo=dapo`: verl's v1
trainer (the one that filters groups; suite.verl.cpu_workarounds VERL_CPU_V1_OVERRIDES) on vLLM's
CPU build, 2 steps of the tiny random model. The reward is the parity of the response's character
codes: random responses make some groups of G = 2 score alike (both right or both wrong), which the
replay buffer must evict, and others mixed, which fill the batch. About 5 minutes on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlflow
import pytest

from test_verl_grpo import PRECISION, RUN_TIMEOUT_S, _data, _root_cause
from vllm_tiny import NUMBERS, save_hf, tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(os.environ.get("SUITE_VLLM_CPU_EMULATE")), reason=(
    "SUITE_VLLM_CPU_EMULATE: verl's workers are subprocesses, which the emulation does not reach"))]

PARITY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(sum(map(ord, solution_str)) % 2 == 0)
'''


def test_verl_dapo_evicts_uniform_groups_on_vllm_cpu(tmp_path):
    model = save_hf(tiny_model(0), tmp_path / "model")
    tc = json.loads((model / "tokenizer_config.json").read_text())
    tc["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (model / "tokenizer_config.json").write_text(json.dumps(tc))
    paths, task = _data(tmp_path)
    (tmp_path / "reward.py").write_text(PARITY_REWARD)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [
        "run", "backend=verl", "backend.device=cpu", f"backend.python={sys.executable}",
        f"backend.model_path={model}", f"backend.train_files={paths['train']}", f"backend.val_files={paths['eval']}",
        f"backend.reward_fn_path={tmp_path / 'reward.py'}", "backend.n_gpus_per_node=1",
        f"backend.max_prompt_length={task.max_prompt_chars + 2}", "backend.micro_batch_size_per_gpu=4",
        "backend.max_num_batched_tokens=512", f"quant={PRECISION}", "correction=acr", "algo=dapo",
        "algo.overlong_buffer=4", "rollout.prompts_per_step=4", "algo.group_size=2", "rollout.max_new_tokens=8",
        "train.minibatches=1", "steps=2", "eval_every=2", "ckpt_every=100", "uaq.s=1.0",
        f"out_dir={tmp_path / 'runs'}", f"tracking.tracking_uri={uri}",
    ]
    cli = "import sys; from suite.cli import main; sys.argv[0] = 'suite'; main()"
    proc = subprocess.run([sys.executable, "-c", cli, *args], cwd=tmp_path, env=dict(os.environ),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:] + _root_cause(tmp_path / "runs")
    client = mlflow.tracking.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    r = runs[0]
    assert (r.data.tags["algo"], r.data.tags["correction"]) == ("dapo", "acr")
    evicted = client.get_metric_history(r.info.run_id, "training/filter_groups/evicted_samples")
    assert sorted(m.step for m in evicted) == [1, 2]
    assert sum(m.value for m in evicted) > 0, evicted  # uniform groups were dropped, and the batch still filled
    for key in ("rollout_corr/kl", "actor/pg_loss", "actor/acr_relaxed_frac", "timing_s/step"):
        assert key in r.data.metrics, key
    NUMBERS.append("verl DAPO (v1 trainer) on vLLM CPU, 2 steps: evicted samples per step "
                   + ", ".join(f"{m.value:g}" for m in sorted(evicted, key=lambda m: m.step))
                   + f", timing_s/step {r.data.metrics['timing_s/step']:.3g}")
