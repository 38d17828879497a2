"""A real sweep's worth of runs for the report tests (built once per session).

A sweep file (suite.sweep.spec) with 10 cells on the tiny preset; its cells are run in this
process through the sweep's own job runner (`suite.launch.job.run_cell` with each cell's composed
config, as the local launcher does; the launch recorded in the state dir as `suite sweep` does),
as MLflow children of the sweep's parent run (`suite.sweep.launch.parent_run`) in a sqlite store.
Two cells are made to end badly by an injected exception (the only test double here): one raises
inside a training step (the runner marks its MLflow run FAILED), one is interrupted like a killed
process (its MLflow run stays RUNNING). Two cells are never run
(MISSING). Runtime: about a minute on 2 busy cores.
"""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
import torch

SWEEP = "report-test"
STEPS = 2
TASK = "arith"


@dataclass
class SweepStore:
    sweep_file: Path
    tracking_uri: str
    parent_run_id: str
    cells: list  # suite.sweep.spec.Cell
    outcome: dict  # cell index -> "FINISHED" | "FAILED" | "RUNNING" | "MISSING"
    root: Path


class _Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so the runner cannot mark the run FAILED."""


def _fail_at(step: int, exc):
    from suite.embedded.trainer import EmbeddedRun

    real = EmbeddedRun.train_step

    def train_step(self):
        if self.step == step:
            raise exc
        return real(self)

    return mock.patch.object(EmbeddedRun, "train_step", train_step)


def build_sweep_store(root: Path) -> SweepStore:
    from suite.launch.job import run_cell
    from suite.sweep.launch import parent_run
    from suite.sweep.spec import load_sweep
    from suite.sweep.states import write_state_files

    uri = f"sqlite:///{root / 'mlflow.db'}"
    sweep_file = root / "sweep.yaml"
    sweep_file.write_text(textwrap.dedent(f"""\
        name: {SWEEP}
        description: report tests (tiny preset, {STEPS} RL steps)
        base:
          - model=tiny
          - steps={STEPS}
          - eval_every={STEPS}
          - ckpt_every={STEPS}
          - task={TASK}
          - task.difficulty=1
          - task.n_eval=32
          - rollout.prompts_per_step=2
          - algo.group_size=4
          - rollout.max_new_tokens=16
          - train.lr=1e-3
          - warm_start.steps=80
          - warm_start.batch_size=32
          - threads=1
          - out_dir={root / 'runs'}
          - warm_start.cache_dir={root / 'warmstart'}
          - tracking.tracking_uri={uri}
          - tracking.experiment=report-test
        matrix:
          quant: [bf16, int8]
          seed: [0, 1]
        include:
          - {{quant: int8, correction: tis}}
          - {{quant: int8, uaq.s: 1.0}}
          - {{quant: fp8}}
        """))
    sweep = load_sweep(sweep_file)
    os.makedirs(sweep.state_dir, exist_ok=True)  # the launcher prepares it before creating the parent
    write_state_files(sweep)  # the launch's record: the report reads the cells' configs from it, as after `suite sweep`
    parent = parent_run(sweep)
    by_key = {}
    for c in sweep.cells:
        a = c.config_axes
        by_key[(a["precision"], a["correction"], a["uaq_s"], a["seed"])] = c
    plan = {
        ("bf16", "acr", "1.5", "0"): "FINISHED",
        ("bf16", "acr", "1.5", "1"): "FINISHED",
        ("int8", "acr", "1.5", "0"): "FINISHED",
        ("int8", "acr", "1.5", "1"): "FINISHED",
        ("int8", "tis", "1.5", "0"): "FINISHED",
        ("int8", "tis", "1.5", "1"): "RUNNING",
        ("int8", "acr", "1", "0"): "FINISHED",
        ("int8", "acr", "1", "1"): "MISSING",
        ("fp8", "acr", "1.5", "0"): "FAILED",
        ("fp8", "acr", "1.5", "1"): "MISSING",
    }
    assert set(plan) == set(by_key), sorted(by_key)
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    outcome = {}
    try:
        for key, want in plan.items():
            c = by_key[key]
            outcome[c.index] = want
            args = (c.cfg, c.run_dir, parent, {"sweep": SWEEP, "cell": str(c.index)}, uri)
            if want == "FINISHED":
                run_cell(*args)
            elif want == "FAILED":
                with _fail_at(STEPS, RuntimeError("injected failure in a training step")), pytest.raises(RuntimeError):
                    run_cell(*args)
            elif want == "RUNNING":
                with _fail_at(STEPS, _Killed()), pytest.raises(_Killed):
                    run_cell(*args)
    finally:
        torch.set_num_threads(n_threads)
    return SweepStore(sweep_file=sweep_file, tracking_uri=uri, parent_run_id=parent, cells=sweep.cells,
                      outcome=outcome, root=root)


def jsonl_metrics(run_dir: str) -> list[dict]:
    """A run's own record of its metrics (metrics.jsonl), independent of MLflow."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh if line.strip()]
