"""A fingerprint of everything composing a sweep's cells depends on, so that `suite status` can
trust a launch's record without composing (and so without Hydra's compose and torch).

Composing a cell is a deterministic function of the sweep file, the overrides and:

- the suite's code: every ``suite`` module loaded when the record is written (the launch has
  composed every cell by then, so every module composition used is among them; unrelated ones
  only make the check stricter), hashed by its path inside the package and its bytes;
- the libraries that compose and resolve: Hydra, OmegaConf, PyYAML, torch (their versions), Python;
- the environment it reads: the variables named by ``oc.env:`` in those sources, the sweep file
  and the overrides, the ones read with ``os.environ`` / ``os.getenv`` there, and ``ENV`` below;
  the working directory (relative ``out_dir``) and the home directory (``~``);
- the machine: the CPU's AVX/AMX flags and the GPU device nodes, which ``auto`` hardware choices
  resolve against (suite.hardware).

The record stores the digest and the list of files; status recomputes the digest from the same
files of the suite it runs. A digest that cannot be computed (a file gone, no /proc/cpuinfo) is
None: status then composes, as it does for any mismatch.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Optional

# read by composition or hardware resolution under names a source scan could miss
ENV = ("HOME", "MLFLOW_TRACKING_URI", "SUITE_CACHE", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
       "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
DISTRIBUTIONS = ("hydra-core", "omegaconf", "PyYAML", "torch")
_ENV_NAME = re.compile(r"""oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)|(?:environ\.get\(|environ\[|getenv\()\s*["']([A-Za-z_][A-Za-z0-9_]*)""")


def _root() -> Path:
    """The directory that holds the ``suite`` package (paths in the record are relative to it)."""
    return Path(__file__).resolve().parent.parent.parent


def loaded_files() -> Optional[list[str]]:
    """The loaded suite modules' files, relative to the package's parent; None if one lies elsewhere."""
    root = _root()
    out = set()
    for name, module in list(sys.modules.items()):
        if name != "suite" and not name.startswith("suite."):
            continue
        f = getattr(module, "__file__", None)
        if not f:
            continue  # a namespace package: no code of its own
        try:
            out.add(Path(f).resolve().relative_to(root).as_posix())
        except ValueError:
            return None
    return sorted(out)


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": sys.version}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = ""
    return out


def _machine() -> Optional[dict]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            flags = next((line for line in fh if line.startswith("flags")), None)
    except OSError:
        return None
    if flags is None:
        return None
    isa = sorted({f for f in flags.split(":", 1)[-1].split() if f.startswith(("avx", "amx"))})
    gpus = sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/kfd"))
    return {"isa": isa, "gpu_devices": gpus}


def digest(files: list[str], text: str, overrides: list[str]) -> Optional[str]:
    """The fingerprint of composing `text` with `overrides` here, with these suite files; None if unsure."""
    root = _root()
    h = hashlib.sha256()
    names = set(ENV)
    for rel in files:
        p = root / rel
        if ".." in Path(rel).parts or not p.is_file():
            return None
        data = p.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
        if rel.endswith(".py"):
            names.update(a or b for a, b in _ENV_NAME.findall(data.decode("utf-8", errors="replace")))
    for source in (text, *overrides):
        names.update(a or b for a, b in _ENV_NAME.findall(source))
    machine = _machine()
    if machine is None:
        return None
    rest = {"versions": _versions(), "env": {k: os.environ.get(k) for k in sorted(names)},
            "cwd": os.getcwd(), "home": os.path.expanduser("~"), "machine": machine,
            "text": text, "overrides": list(overrides)}
    h.update(json.dumps(rest, sort_keys=True).encode())
    return h.hexdigest()


def record(text: str, overrides: list[str]) -> dict:
    """What a launch writes into matrix.json: the files and their digest (None: status composes)."""
    files = loaded_files()
    return {"files": files, "digest": digest(files, text, overrides) if files else None}


def matches(rec: object, text: str, overrides: list[str]) -> bool:
    """Whether a record's fingerprint is the one composing here would have."""
    if not isinstance(rec, dict) or not isinstance(rec.get("digest"), str):
        return False
    files = rec.get("files")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        return False
    return digest(files, text, overrides) == rec["digest"]
