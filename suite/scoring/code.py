"""Generated code (LiveCodeBench's stdin/stdout problems) run against its tests, each in a sandboxed child.

A response's last fenced code block (```python ... ```, else the last ``` block) is written to a fresh
directory and run once per test with the test's input on stdin; the test passes when its stdout equals the
expected output (lines compared with trailing spaces and trailing blank lines dropped). The response scores
1.0 when every test passes. `suite eval` with k samples per problem then reports pass@k, as LiveCodeBench
does (QaRL's pass@4).

The child is `python -I -S` (no site packages, no user environment, an empty environment) and is limited
the way verl's code scorers limit theirs, and more:

- resource limits: CPU seconds (the test's limit), address space (1 GiB), file size 0 (nothing is
  written), 64 open files, no core dump; a wall-clock limit kills what sleeps;
- a network namespace of its own where the kernel allows one (root, or unprivileged user namespaces): no
  interface is up, so no address, loopback included, can be reached (`NETWORK_ISOLATION` says whether);
- a Python audit hook installed before the solution runs: no socket, no file opened for writing, no
  program started, no fork, no shared library loaded, no signal sent.

An audit hook is no security boundary against code that goes around Python (Python's own documentation
says so); the resource limits and the network namespace are the kernel's. Run untrusted code at scale in a
container as well.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

TIME_LIMIT_S = 6.0  # per test, when the ground truth gives none (LiveCodeBench's default is 6 s)
_FENCE = re.compile(r"```[ \t]*(\w*)[^\n]*\n(.*?)```", re.S)

# What the child runs: compile the solution, seal the process, run it as __main__.
_RUNNER = r'''
import ctypes, ctypes.util, os, resource, sys
cpu_s = int(sys.argv[2])
for what, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, 1 << 30), (resource.RLIMIT_FSIZE, 0),
                    (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(what, (value, value))
# a network namespace of its own (CLONE_NEWNET): nothing is up in it, loopback included; refused without privileges
ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).unshare(0x40000000)
src = open(sys.argv[1], encoding="utf-8").read()
code = compile(src, "solution.py", "exec")
_BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
            "os.kill", "os.killpg", "pty.", "ctypes.", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "shutil.",
            "os.truncate", "os.chmod", "os.link", "os.symlink", "urllib.", "http.", "ftplib.", "smtplib.",
            "webbrowser.")
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
def _hook(event, args):
    if event.startswith(_BLOCKED):
        raise PermissionError("sandbox: " + event)
    if event == "open":
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & _WRITE):
            raise PermissionError("sandbox: no writing")
sys.addaudithook(_hook)
del os
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
'''


def _own_network_namespace() -> bool:
    """unshare(CLONE_NEWNET) in this (child) process; False where the kernel refuses it."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return libc.unshare(0x40000000) == 0  # CLONE_NEWNET


def _probe_isolation() -> bool:
    try:
        probe = "import sys; from suite.scoring.code import _own_network_namespace as n; sys.exit(0 if n() else 1)"
        return subprocess.run([sys.executable, "-c", probe], timeout=30, capture_output=True).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


NETWORK_ISOLATION: bool | None = None  # known after the first run: whether children get a network of their own


def extract_code(response: str) -> str | None:
    """The last ```python block of the response (else its last fenced block), or None."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(response)]
    python = [b for lang, b in blocks if lang in ("python", "py", "python3")]
    chosen = python or [b for _, b in blocks]
    return chosen[-1] if chosen and chosen[-1].strip() else None


def _same_output(got: str, want: str) -> bool:
    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.strip("\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out

    return lines(got) == lines(want)


def tests_of(ground_truth) -> tuple[list[dict], float]:
    """(tests, seconds per test) of a ground truth: JSON ``{"tests": [{"input", "output"}, ...], "time_limit_s"}``
    (what `suite data prepare livecodebench` writes) or a bare list of tests."""
    data = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    tests, limit = (data, TIME_LIMIT_S) if isinstance(data, list) else (data["tests"], data.get("time_limit_s",
                                                                                                 TIME_LIMIT_S))
    if not tests or not all(isinstance(t, dict) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str)
                            for t in tests):
        raise ValueError("a code ground truth is a non-empty list of {input, output} strings")
    return tests, float(limit)


def run_test(code: str, stdin: str, time_limit_s: float) -> tuple[bool, str]:
    """Run ``code`` once in a sandboxed child with ``stdin``: (exited 0 within the limits, its stdout)."""
    global NETWORK_ISOLATION
    if NETWORK_ISOLATION is None:
        NETWORK_ISOLATION = _probe_isolation()
    with tempfile.TemporaryDirectory(prefix="suite-code-") as d:
        path = os.path.join(d, "solution.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(code)
        os.chmod(d, 0o555)
        try:
            cpu_s = str(max(1, int(time_limit_s + 0.999)))
            proc = subprocess.run([sys.executable, "-I", "-S", "-c", _RUNNER, path, cpu_s], input=stdin, text=True,
                                  capture_output=True, cwd=d, env={}, timeout=time_limit_s + 2, start_new_session=True)
        except subprocess.TimeoutExpired:
            return False, ""
        finally:
            os.chmod(d, 0o755)
    return proc.returncode == 0, proc.stdout


def score(response: str, ground_truth) -> float:
    """1.0 when the response's code passes every test of ``ground_truth``, else 0.0."""
    tests, limit = tests_of(ground_truth)
    code = extract_code(response)
    if code is None:
        return 0.0
    for t in tests:
        ok, out = run_test(code, t["input"], limit)
        if not (ok and _same_output(out, t["output"])):
            return 0.0
    return 1.0


__all__ = ["NETWORK_ISOLATION", "TIME_LIMIT_S", "extract_code", "run_test", "score", "tests_of"]
