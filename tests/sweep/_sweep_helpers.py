"""Helpers of the sweep tests: the tiny cell, sweep files in tmp_path, subprocess environment."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

# The tiny, fast cell of every launch test: a few steps, no warm start, so a launch test costs seconds.
TINY = [
    "model=tiny", "steps=4", "eval_every=2", "ckpt_every=2", "task.n_eval=16", "rollout.prompts_per_step=2",
    "algo.group_size=4", "rollout.max_new_tokens=16", "warm_start.steps=0", "threads=1",
]


def write_sweep(path: Path, data: dict | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def child_env() -> dict[str, str]:
    """Environment for `suite` subprocesses: one thread, unbuffered."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env
