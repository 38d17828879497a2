"""One driver per sweep: a second `suite sweep` of a file being driven is refused, naming the first."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from _sweep_helpers import TINY, child_env, write_sweep
from suite.sweep.launch import launch
from suite.sweep.spec import SweepError, load_sweep
from suite.tracking.lock import run_lock


@pytest.mark.slow
def test_a_second_driver_of_one_sweep_is_refused_and_submits_nothing(tmp_path, sweep_env):
    path = write_sweep(tmp_path / "s.yaml", {"name": "locked", "base": TINY, "matrix": {"seed": [0, 1]}})
    sweep = load_sweep(str(path), [f"out_dir={tmp_path / 'runs'}"])
    with run_lock(sweep.state_dir):  # this process plays the first driver
        with pytest.raises(SweepError) as err:
            launch(sweep)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in str(err.value)
        # through the command: exit 2, no cell submitted, no run dir
        proc = subprocess.run([sys.executable, "-m", "suite.cli", "sweep", str(path), f"out_dir={tmp_path / 'runs'}"],
                              capture_output=True, text=True, env=child_env(), timeout=300)
        assert proc.returncode == 2 and "another `suite sweep` drives this sweep" in proc.stderr, proc.stderr
    assert all(not os.path.exists(c.run_dir) for c in sweep.cells)
