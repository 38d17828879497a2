"""A barrier at a run's checkpoints, for tests that interrupt a run in progress.

`install(monkeypatch, tmp_path, steps, when)` writes a `sitecustomize.py` that every Python
process started afterwards from the test (through PYTHONPATH, which subprocesses and SLURM jobs
inherit) imports at start-up: at the checkpoint of each listed step the run writes
`reached-<step>` and waits until the test writes `release-<step>`, either before the checkpoint
is written (`when="before"`: the steps since the last checkpoint are logged, not saved) or after
(`when="after"`). The test then acts on a run known to be at that point, however fast the
machine steps. Only the test's own processes see it; the suite's code is unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

_SITE = """
import os
if os.environ.get("SUITE_TEST_BARRIER"):
    import time
    from suite.tracking import checkpoint as _ckpt
    _save, _dir = _ckpt.save_checkpoint, os.environ["SUITE_TEST_BARRIER"]
    _steps = {int(x) for x in os.environ["SUITE_TEST_BARRIER_STEPS"].split(",")}
    _before = os.environ["SUITE_TEST_BARRIER_WHEN"] == "before"

    def _hold(step):
        open(os.path.join(_dir, f"reached-{step}"), "w").close()
        while not os.path.exists(os.path.join(_dir, f"release-{step}")):
            time.sleep(0.05)

    def save_checkpoint(run_dir, step, state, **kw):
        if _before and step in _steps:
            _hold(step)
        out = _save(run_dir, step, state, **kw)
        if not _before and step in _steps:
            _hold(step)
        return out

    _ckpt.save_checkpoint = save_checkpoint
"""


class Barrier:
    def __init__(self, root: Path, steps: tuple[int, ...]):
        self.root, self.steps = root, steps

    def reached(self, step: int) -> bool:
        return (self.root / f"reached-{step}").exists()

    def release(self, step: int) -> None:
        (self.root / f"release-{step}").touch()

    def release_all(self) -> None:
        for step in self.steps:
            self.release(step)


def install(monkeypatch, tmp_path: Path, steps: tuple[int, ...], when: str = "after") -> Barrier:
    assert when in ("before", "after")
    root = tmp_path / "barrier"
    root.mkdir()
    (root / "sitecustomize.py").write_text(_SITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("SUITE_TEST_BARRIER", str(root))
    monkeypatch.setenv("SUITE_TEST_BARRIER_STEPS", ",".join(map(str, steps)))
    monkeypatch.setenv("SUITE_TEST_BARRIER_WHEN", when)
    return Barrier(root, steps)
