"""Grading in worker processes that cannot write, connect, start a program or run a string as code.

A grader that parses what a model wrote runs here, never in the caller: a pool of spawned worker
processes (one per core by default), each of which, once its grader modules are imported, installs a
Python audit hook (PEP 578) that refuses

- opening a file for writing, and removing, renaming or creating files and directories;
- every socket operation (no network, not even loopback);
- starting a program (``subprocess``, ``os.system``, ``os.exec*``, ``os.fork``, ``posix_spawn``) or loading a
  shared library;
- compiling or running code whose source is a string (``eval``, ``exec``, ``compile`` of text, hence
  ``sympify`` and ``parse_expr`` of text), while modules imported from files still load.

An audit hook cannot be removed once installed, so a worker stays sealed for its life. Each item runs
under the grader's own time limit (``signal.alarm`` in the worker's main thread) and the pool's
(`ITEM_TIMEOUT_S`): a worker past it is killed, the item scores 0 and the pool is started again.
A refused operation, a timeout or any exception is a score of 0 for that item and is counted
(`Sandbox.refused`, `Sandbox.timeouts`), never raised into training.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import re
import sys
import threading
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

ITEM_TIMEOUT_S = 30.0  # the pool's own limit per item, beyond the grader's 5 s ones (a stuck C call)
CHUNK = 16  # items per task: amortises the pipe round trip over short answers

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_REFUSED_EVENTS = frozenset({
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "os.startfile", "pty.spawn", "os.kill", "os.killpg", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
    "os.truncate", "os.chmod", "os.chown", "os.link", "os.symlink", "os.utime", "os.putenv", "os.unsetenv",
    "shutil.rmtree", "shutil.copyfile", "shutil.move", "ctypes.dlopen", "ctypes.call_function", "webbrowser.open",
    "urllib.Request", "http.client.connect", "ftplib.connect", "smtplib.connect", "sys.settrace", "sys.setprofile",
})


# Code from text. sympy compiles strings of its own while it grades (a number's digits read by
# parse_expr, "Integer (3 )"; the polynomial module's generated monomial functions; unit names as Symbols),
# so code from text is allowed only when it names nothing that reaches outside the process: no dunder (the
# way from any object to builtins and modules), no import but sympy's own "from sympy import *", none of
# the builtins that read, write, import or run code. What such code could still do is pure computation,
# under the grader's time limits, and every file write, socket and program start is refused above anyway.
_DENIED_NAMES = frozenset({
    "open", "exec", "eval", "compile", "getattr", "setattr", "delattr", "globals", "locals", "vars", "input",
    "breakpoint", "help", "exit", "quit", "memoryview", "os", "sys", "subprocess", "builtins", "importlib",
    "socket", "shutil", "pathlib", "io", "ctypes", "signal", "pickle", "marshal", "lambdify"})
_DENIED_TEXT = re.compile(r"__|\bimport\b|\b(?:" + "|".join(sorted(_DENIED_NAMES)) + r")\b")


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


class SandboxRefusal(PermissionError):
    """An operation a grading worker may not do."""


_refusals = 0  # in a worker: how many operations the hook refused (a grader may swallow the exception)


def _audit(event: str, args: tuple) -> None:
    try:
        _check(event, args)
    except SandboxRefusal:
        global _refusals
        _refusals += 1
        raise


def _check(event: str, args: tuple) -> None:
    if event == "open":
        _, mode, flags = args
        writes = isinstance(mode, str) and any(c in mode for c in "wax+")
        if writes or (isinstance(flags, int) and flags & _WRITE_FLAGS):
            raise SandboxRefusal(f"grading sandbox: no writing ({args[0]!r})")
    elif event.startswith("socket."):
        raise SandboxRefusal(f"grading sandbox: no network ({event})")
    elif event in _REFUSED_EVENTS:
        raise SandboxRefusal(f"grading sandbox: {event} refused")
    elif event == "compile":
        source, filename = args
        if source is not None and not (isinstance(filename, str) and os.path.isabs(filename)):
            text = source.decode("utf-8", "replace") if isinstance(source, bytes) else str(source)
            if text.strip() != "from sympy import *" and _DENIED_TEXT.search(text):
                raise SandboxRefusal(f"grading sandbox: no code from text ({text[:60]!r})")
    elif event == "exec":
        code = args[0]
        filename = getattr(code, "co_filename", "")
        if not (os.path.isabs(filename) or filename.startswith("<frozen")):
            names = _code_names(code) if hasattr(code, "co_names") else {"?"}
            if names != {"sympy"} and any("__" in n or n in _DENIED_NAMES for n in names):
                raise SandboxRefusal(f"grading sandbox: no code from text ({filename!r})")


def _seal(modules: tuple[str, ...]) -> None:
    """Worker initializer: import and warm the graders, then install the audit hook."""
    for name in modules:
        module = importlib.import_module(name)
        warm = getattr(module, "warm", None)
        if warm is not None:
            warm()
    sys.addaudithook(_audit)


def _run(jobs: list[tuple[str, str, str, str]]) -> list[tuple[float, str]]:
    """(score, "" or why it is 0) for each (module, function, response, truth)."""
    out = []
    for module, function, response, truth in jobs:
        before = _refusals
        try:
            value, why = float(getattr(sys.modules[module], function)(response, truth)), ""
        except SandboxRefusal as exc:
            value, why = 0.0, f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001 - a grader failing on model text scores it 0
            value, why = 0.0, f"error: {type(exc).__name__}"
        if _refusals > before:  # refused inside the grader, which caught it: the item is not graded
            value, why = 0.0, why or "refused"
        out.append((value, why))
    return out


MAX_WORKERS = 8  # per grading process: verl runs several reward workers per node, each with its own pool


def default_workers() -> int:
    """Workers of a pool: $SUITE_GRADING_WORKERS, else this process's cores, at most `MAX_WORKERS`."""
    if os.environ.get("SUITE_GRADING_WORKERS", "").isdigit() and int(os.environ["SUITE_GRADING_WORKERS"]) > 0:
        return int(os.environ["SUITE_GRADING_WORKERS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_WORKERS))


class Sandbox:
    """A pool of sealed grading workers that import ``modules`` (each grader's module)."""

    def __init__(self, modules: tuple[str, ...], workers: int | None = None):
        self.modules = tuple(sorted(set(modules)))
        self.workers = workers or default_workers()
        self.refused = 0
        self.timeouts = 0
        self.errors = 0
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _start(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_seal, initargs=(self.modules,))
            return self._pool

    def _kill(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        # ProcessPoolExecutor cannot stop a running task; its processes are killed instead (their handles
        # are the executor's `_processes`, the only way to reach them)
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def score(self, jobs: list[tuple[str, str, str, str]]) -> list[float]:
        """The score of each (module, function, response, truth), in order; in parallel over the workers.
        A chunk whose worker died or ran past its limit is graded again item by item; an item that fails
        so scores 0."""
        results = [0.0] * len(jobs)
        todo = [(i, min(i + CHUNK, len(jobs))) for i in range(0, len(jobs), CHUNK)]
        broken_rounds = 0
        while todo:
            pool = self._start()
            try:
                futures = {pool.submit(_run, jobs[a:b]): (a, b) for a, b in todo}
            except BrokenProcessPool:
                self._kill()
                continue
            done, late = wait(futures, timeout=ITEM_TIMEOUT_S * max(b - a for a, b in todo))
            failed = []
            for fut in done:
                a, b = futures[fut]
                try:
                    chunk = fut.result()
                except BrokenProcessPool:  # a worker died (killed, out of memory)
                    failed.append((a, b))
                    continue
                for j, (value, why) in enumerate(chunk):
                    results[a + j] = value
                    self.refused += why.startswith("refused")
                    self.errors += why.startswith("error")
            failed += [futures[f] for f in late]
            if failed:
                self._kill()
            if not late and len(failed) == len(futures):  # not one chunk came back: the workers cannot start
                broken_rounds += 1
                if broken_rounds == 2:
                    raise RuntimeError("grading sandbox: its worker processes die before grading anything "
                                       "(see the errors above); a spawned worker must be able to import "
                                       f"{', '.join(self.modules)}")
            else:
                broken_rounds = 0
            self.timeouts += sum(b - a == 1 for a, b in (futures[f] for f in late))
            # a failed chunk of several is graded again item by item; a failed single item stays 0
            todo = [(k, k + 1) for a, b in failed if b - a > 1 for k in range(a, b)]
        return results


__all__ = ["ITEM_TIMEOUT_S", "Sandbox", "SandboxRefusal", "default_workers"]
