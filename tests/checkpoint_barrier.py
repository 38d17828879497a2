"""A barrier at a run's checkpoints, for tests that interrupt a run in progress.

`install(monkeypatch, tmp_path, steps, when)` writes a `sitecustomize.py` that every Python
process started afterwards from the test (through PYTHONPATH, which subprocesses and SLURM jobs
inherit) imports at start-up: at the checkpoint of each listed step the run writes
`reached-<step>` and waits until the test writes `release-<step>`, either before the checkpoint
is written (`when="before"`: the steps since the last checkpoint are logged, not saved) or after
(`when="after"`). The test then acts on a run known to be at that point, however fast the
machine steps. Only the test's own processes see it; the suite's code is unchanged.

Every such process also dumps the stacks of all its threads to stderr on SIGUSR1
(`faulthandler`): `communicate(proc, timeout)` sends it to a process that has not ended in
time, so a stall fails the test with where the process stood instead of a bare timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

_SITE = """
import os
if os.environ.get("SUITE_TEST_BARRIER"):
    import faulthandler, signal, sys
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    import time
    from suite.tracking import checkpoint as _ckpt
    _save, _dir = _ckpt.save_checkpoint, os.environ["SUITE_TEST_BARRIER"]
    _steps = {int(x) for x in os.environ["SUITE_TEST_BARRIER_STEPS"].split(",")}
    _before = os.environ["SUITE_TEST_BARRIER_WHEN"] == "before"

    def _hold(step):
        with open(os.path.join(_dir, f"reached-{step}"), "w") as f:  # how a stop signal would land
            f.write(f"SIGINT handler: {signal.getsignal(signal.SIGINT)!r}\\n")
            with open("/proc/self/status") as st:
                f.writelines(ln for ln in st if ln.startswith(("SigBlk", "SigIgn")))
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


def interactive(module: str, *args: str) -> list[str]:
    """The command line of `python -m module args` started as a terminal starts its foreground job:
    SIGINT at Python's default (KeyboardInterrupt) and unblocked, whatever the test process hands
    down. A child inherits an ignored or blocked SIGINT from its parent, and Python only installs
    its KeyboardInterrupt handler where SIGINT is at its default at start-up; a pytest worker that
    an earlier test or library left so would otherwise make a Ctrl-C test stall."""
    code = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", code, *args]


def communicate(proc: subprocess.Popen, timeout: float, *, group: bool = False,
                barrier: Barrier | None = None) -> tuple[str, str]:
    """`proc.communicate(timeout=...)`; past the timeout, the stacks of the process (or of its
    whole process group, `group=True`) are dumped (SIGUSR1, see the module docstring), it is
    killed, and the test fails with what it printed, the stacks included, and with how SIGINT
    stood in each process that reached the `barrier`."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    kill = (lambda sig: os.killpg(proc.pid, sig)) if group else proc.send_signal
    for sig, wait in ((signal.SIGUSR1, 10), (signal.SIGKILL, None)):
        try:
            kill(sig)
        except ProcessLookupError:
            break
        try:  # output read before a timeout is kept for the next call (subprocess' contract)
            proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            pass  # still stalled after the dump: the kill comes next
    out, err = proc.communicate()
    held = "".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(barrier.root.glob("reached-*"))) if barrier else ""
    raise AssertionError(f"the process did not end within {timeout:.0f} s; its stacks and output:\n"
                         f"--- stderr\n{err}\n--- stdout\n{out}\n{held}")

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
