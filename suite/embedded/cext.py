"""The engine's C++ extensions (``csrc/``), each built once per Python environment on first use.

The build goes into torch's extension cache (``TORCH_EXTENSIONS_DIR``, default
~/.cache/torch_extensions), without ``-march=native``, so a build shared between nodes of a
cluster runs on each of them. Each build is named by a digest of its source (text and path), its
flags and the Python environment that compiles it (torch's directory and version, Python's
headers), which is what ninja's command line holds: every checkout and virtual environment on
one machine (or one home directory) shares that cache, and under one name each would rebuild the
other's in turn. With different sources a process could load the other version's library
(measured: a test run beside a CI run of the previous commit loaded the previous decode loop);
with one source in two environments (two CI clones, or the project's venv beside
.ci/vllm-cpu's) ninja saw another command line (the other venv's include paths and source path)
and recompiled at every process start of the other, 30-55 s of a core each time (measured: one
extension compiled 8 times in 9 minutes of two CI runs side by side). No
compiler, or a failed build: :func:`build` warns once and returns None, and the caller runs its
Python path (the same numbers, slower).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import sys
import warnings

CSRC = os.path.join(os.path.dirname(__file__), "csrc")
CFLAGS = ("-O3", "-ffp-contract=off", "-fopenmp")
_built: dict[str, object] = {}  # name -> the loaded module (True for a library of torch.ops)
_failed: dict[str, str] = {}  # name -> why its build failed


def build(name: str, source: str, *, python_module: bool, what: str):
    """Build ``csrc/<source>`` as extension ``name`` (once per process; cached on disk) and
    return its Python module (``python_module``; else True once its ``TORCH_LIBRARY`` ops are
    registered), or None where it cannot be built. ``what``: the fallback, for the warning."""
    if name not in _built and name not in _failed:
        try:
            from torch.utils.cpp_extension import get_default_build_root, load

            root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
            path = os.path.join(CSRC, source)
            disk_name = build_name(name, path)
            if not any(glob.glob(os.path.join(d, "*.so")) for d in build_dirs(root, disk_name)):
                print(f"suite: building the C++ extension {disk_name} into {root} (once per Python environment and "
                      "source version, ~30-75 s)", file=sys.stderr, flush=True)
            # -fopenmp: at::parallel_for is a header template whose OpenMP pragma is ignored (one
            # thread) in code compiled without it
            with _builder_lock(root, disk_name):
                mod = load(name=disk_name, sources=[path], extra_cflags=list(CFLAGS), extra_ldflags=["-fopenmp"],
                           is_python_module=python_module, verbose=False)
            _built[name] = mod if python_module else True
        except Exception as exc:  # no compiler / ninja / headers: the caller's Python path, same numbers
            _failed[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            warnings.warn(f"suite.embedded: the C++ extension {name} did not build ({_failed[name]}); {what}",
                          stacklevel=3)
    return _built.get(name)


@contextlib.contextmanager
def _builder_lock(root: str, disk_name: str):
    """One builder of an extension at a time, under a lock the kernel drops when its holder dies.

    torch's own build lock is the existence of a file (``<build dir>/lock``, its FileBaton):
    a builder killed mid-build (Ctrl-C, SIGKILL, a job's time limit) leaves it, and every later
    process waits for it forever. Holding this flock, no live suite process is building, so a
    baton found there is such a leftover and is removed."""
    import fcntl

    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, f".{disk_name}.suite-build.lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        for stale in [os.path.join(d, "lock") for d in build_dirs(root, disk_name)]:
            if os.path.exists(stale):
                print(f"suite: removing {stale}, left by a build of {disk_name} that was killed", file=sys.stderr,
                      flush=True)
                os.remove(stale)
        yield


def build_name(name: str, path: str, environment: str | None = None) -> str:
    """The name extension ``name`` is built and cached under: ``name`` and a digest of the source
    file at ``path`` (its text and where it is), the compiler flags and ``environment`` (default
    :func:`environment_key`), so neither different sources, checkouts nor Python environments share
    a build."""
    env = environment_key() if environment is None else environment
    with open(path, "rb") as fh:
        text = fh.read()
    key = b"\0".join([text, " ".join(CFLAGS).encode(), os.path.abspath(path).encode(), env.encode()])
    digest = hashlib.sha256(key).hexdigest()[:12]
    return f"{name}_{digest}"


def build_dirs(root: str, disk_name: str) -> list[str]:
    """Where torch builds ``disk_name`` under the cache ``root``: ``<root>/<python tag>/<name>``
    (its default root's layout) or ``<root>/<name>``; the latter listed whether or not it exists."""
    return glob.glob(os.path.join(root, "*", disk_name)) + [os.path.join(root, disk_name)]


def environment_key() -> str:
    """What of this Python environment enters the compiler's and linker's command line: torch's
    install directory (its headers and libraries) and version, and Python's header directory."""
    import sysconfig

    import torch

    return "\n".join([os.path.dirname(os.path.abspath(torch.__file__)), torch.__version__,
                      sysconfig.get_paths()["include"]])


def failure(name: str) -> str | None:
    """Why extension ``name`` did not build in this process; None if it did or was not tried."""
    return _failed.get(name)
