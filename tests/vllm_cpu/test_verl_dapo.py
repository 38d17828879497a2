"""DAPO's dynamic sampling through `suite run backend=verl backend.device=cpu algo=dapo`: verl's v1
trainer (the one that filters groups; suite.verl.cpu_workarounds VERL_CPU_V1_OVERRIDES) on vLLM's
CPU build, 4 steps of the tiny random model with bf16 rollouts. The reward is the parity of the response's character
codes: random responses make some groups of G = 2 score alike (both right or both wrong), which the
replay buffer must evict, and others mixed, which fill the batch. About 5 minutes on 2 cores.

Which steps evict is chance: a group is uniform with probability ~1/2, so a step whose first 4
groups all come out mixed evicts none and logs no eviction metric (verl logs it only when it
evicts). Measured with 2 steps: evictions at steps 1 and 2 in two runs (4, 3 and 3, 1), at step 1
only in a third (2026-12-03), which the old assertion (an eviction at every step) failed on. So
every step must train, and some step must evict: a false alarm needs four all-mixed steps,
~(1/16)^4 = 1.5e-5."""

from __future__ import annotations

import os

import mlflow
import pytest

from test_verl_grpo import root_cause, run_verl
from vllm_tiny import NUMBERS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(os.environ.get("SUITE_VLLM_CPU_EMULATE")), reason=(
    "SUITE_VLLM_CPU_EMULATE: verl's workers are subprocesses, which the emulation does not reach"))]

PARITY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(sum(map(ord, solution_str)) % 2 == 0)
'''


def test_verl_dapo_evicts_uniform_groups_on_vllm_cpu(tmp_path):
    # bf16 rollouts: served on every CPU kind, and the path whose 16-bit linears vLLM CPU packs after loading
    # (the weight sync re-stages them: suite.verl.int8_hook)
    proc, uri = run_verl(tmp_path, PARITY_REWARD, "algo=dapo", "algo.overlong_buffer=4", precision="bf16",
                         steps=4)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:] + root_cause(tmp_path / "runs")
    client = mlflow.tracking.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    r = runs[0]
    assert (r.data.tags["algo"], r.data.tags["precision"], r.data.tags["correction"]) == ("dapo", "bf16", "acr")
    trained = sorted(m.step for m in client.get_metric_history(r.info.run_id, "timing_s/step"))
    assert trained == [1, 2, 3, 4]  # every step filled its batch and trained
    evicted = client.get_metric_history(r.info.run_id, "training/filter_groups/evicted_samples")
    assert evicted and {m.step for m in evicted} <= {1, 2, 3, 4}, evicted
    assert sum(m.value for m in evicted) > 0, evicted  # uniform groups were dropped
    for key in ("rollout_corr/kl", "actor/pg_loss", "actor/acr_relaxed_frac", "timing_s/step"):
        assert key in r.data.metrics, key
    NUMBERS.append("verl DAPO (v1 trainer) on vLLM CPU, 4 steps: filter_groups/evicted_samples "
                   + ", ".join(f"step {m.step}: {m.value:g}" for m in sorted(evicted, key=lambda m: m.step))
                   + f", timing_s/step {r.data.metrics['timing_s/step']:.3g}")
