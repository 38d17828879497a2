"""Whether an interpreter can run verl's trainer: verl and vLLM found (not imported) in its environment.

Asked before anything is created, by the verl backend (`suite run`, a sweep's cells) and by the config
check that lists the paths a verl run still needs, so a missing install is said in the same message."""

from __future__ import annotations

INSTALL = "pip install -e '.[gpu]' (verl 0.9.1 + vllm 0.24.0) on a GPU node; .ci/vllm-cpu builds the CPU one"

_FIND = ("import importlib.util as u, sys; "
         "sys.stdout.write(' '.join(m for m in ('verl', 'vllm') if u.find_spec(m) is None))")


def missing_install(python: str) -> str | None:
    """What the environment of `python` lacks to run verl, in one line; None when nothing. A fraction of a
    second: the packages are found, not imported."""
    import shutil
    import subprocess

    if shutil.which(python) is None:
        return f"backend.python={python}: no such interpreter here (it runs verl's trainer)"
    try:
        out = subprocess.run([python, "-c", _FIND], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"backend.python={python}: could not be started ({exc})"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [""])[-1]
        return f"backend.python={python}: could not look up verl and vllm ({last})"
    if out.stdout.strip():
        return (f"backend=verl needs {' and '.join(out.stdout.split())} in the environment of backend.python={python}, "
                f"which has not: {INSTALL}")
    return None
