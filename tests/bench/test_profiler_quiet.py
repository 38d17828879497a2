"""The benches' profiler (`suite bench rollout --profile`, `suite bench peer`: suite.bench.rollout
`op_shares`) writes nothing to the process's stderr: torch 2.13's kineto prints a `USDT:` line at
every profiler start and stop, which op_shares silences. Checked at the file-descriptor level, in
a fresh process, next to a plain torch.profiler run that does print them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

OURS = """
import json, torch
from suite.bench.rollout import op_shares
a = torch.ones(16, 16)
print(json.dumps(op_shares(lambda: (a @ a).sum())))
print(json.dumps(op_shares(lambda: (a @ a).sum())))  # a second profile, as the benches run several
"""

PLAIN = """
import torch
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU]):
    torch.ones(16, 16) @ torch.ones(16, 16)
"""


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_op_shares_prints_no_profiler_lines():
    plain = _run(PLAIN)
    assert plain.returncode == 0, plain.stderr
    assert "USDT:" in plain.stderr and "profiler_start" in plain.stderr  # what torch.profiler alone prints here
    ours = _run(OURS)
    assert ours.returncode == 0, ours.stderr
    assert ours.stderr == ""
    for line in ours.stdout.splitlines():
        shares = json.loads(line)
        assert shares["aten_calls"] >= 2 and shares["total_s"] > 0  # the profile itself still ran
        assert abs(sum(shares[k] for k in ("gemm", "attention", "act_quant", "sampling", "other")) - 1) < 1e-9
        assert shares["gemm"] > 0  # aten::mm is a GEMM
