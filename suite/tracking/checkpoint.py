"""Atomic checkpoints and RNG state, so a run killed at any instant (even `kill -9`)
resumes from its last checkpoint with the same random streams.

Layout: `run_dir/checkpoints/step_{step:08d}.pt`, each a `torch.save` of
`{"format": 1, "step": step, "state": state}`. A checkpoint is written to a temporary file
in the same directory, fsynced, and renamed over its final name (`os.replace` is atomic on
POSIX), so a reader sees either no file or a complete one. Files are loaded with
`weights_only=True` by default: keep `state` to tensors, numbers, strings and
dicts/lists/tuples of them (what `rng_state()` and `state_dict()`s return).
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from suite.schemas import CheckpointRecord, validate
from suite.tracking.atomic import atomic_write
# the names of checkpoint files live with the run dir's other names: `suite status` lists them without torch
from suite.tracking.rundir import CHECKPOINT_DIR, checkpoint_path, list_checkpoints  # noqa: F401

log = logging.getLogger(__name__)

FORMAT = 1


def save_checkpoint(
    run_dir: str | os.PathLike, step: int, state: Mapping[str, Any], *, keep_last: int = 2
) -> Path:
    """Write `state` as the checkpoint of `step` atomically, then delete all but the
    newest `keep_last` checkpoints (and temporary files left by killed writers)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    final = checkpoint_path(run_dir, step)
    d = final.parent
    d.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "step": int(step), "state": dict(state)}
    # atomic_write fsyncs the directory, so the rename is durable before older ones go.
    atomic_write(final, lambda f: torch.save(payload, f))

    for old_step, p in list_checkpoints(run_dir)[:-keep_last]:
        p.unlink(missing_ok=True)
    for p in d.glob(".step_*.pt.tmp.*"):  # one writer per run dir: any other tmp is stale
        p.unlink(missing_ok=True)
    return final


def _is_allowlist_error(e: Exception) -> bool:
    # torch's weights_only unpickler refusing a type is a bug in what was saved, not a
    # damaged file: falling back to an older checkpoint would hide it.
    return "Unsupported global" in str(e) or "Unsupported class" in str(e)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read as the step it names; the message says why."""


class CheckpointTypeError(CheckpointError):
    """torch's weights-only loader refused a type in the file: a bug in what was saved (or a file
    that is not a checkpoint at all), never a reason to resume from an older one."""


class NoReadableCheckpoint(CheckpointError, RuntimeError):
    """Checkpoints exist and none can be read: a resume would silently start again from step 0."""


def read_checkpoint(path: str | os.PathLike, step: int, *, map_location: str | torch.device = "cpu",
                    weights_only: bool = True) -> dict:
    """The state saved in `path` as the checkpoint of `step`; reads only. CheckpointError for a
    damaged file (truncated, corrupt, another step), CheckpointTypeError for a type torch's
    weights-only loader refuses (`_is_allowlist_error`)."""
    try:
        payload = torch.load(path, map_location=map_location, weights_only=weights_only)
        record = validate(CheckpointRecord, payload, path)  # a SchemaError names the file and the field
        if record.step != step:
            raise ValueError(f"not a suite checkpoint of step {step} (it holds step {record.step})")
    except Exception as e:  # noqa: BLE001 - any failure to read means "damaged"
        kind = CheckpointTypeError if _is_allowlist_error(e) else CheckpointError
        raise kind(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}") from e
    return record.state


def load_latest_checkpoint(
    run_dir: str | os.PathLike, *, map_location: str | torch.device = "cpu", weights_only: bool = True
) -> tuple[int, dict] | None:
    """(step, state) of the newest readable checkpoint, or None if there is none.

    An unreadable newer file (truncated, corrupt, or holding the wrong step) is renamed to
    `*.corrupt` with a warning and the previous checkpoint is used. If checkpoints exist
    but none can be read, raises NoReadableCheckpoint rather than silently restarting from step 0.
    """
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        return None
    bad: list[tuple[Path, Exception]] = []
    for step, path in reversed(ckpts):
        try:
            state = read_checkpoint(path, step, map_location=map_location, weights_only=weights_only)
        except CheckpointTypeError as e:
            raise e.__cause__ from None
        except CheckpointError as e:
            log.warning("checkpoint %s is unreadable (%s)", path, e)
            bad.append((path, e))
            continue
        for p, _ in bad:
            corrupt = p.with_name(p.name + ".corrupt")
            os.replace(p, corrupt)
            log.warning("moved the unreadable %s aside to %s; resuming from step %d", p, corrupt.name, step)
        return step, state
    raise NoReadableCheckpoint(
        f"none of the {len(ckpts)} checkpoints in {Path(run_dir) / CHECKPOINT_DIR} can be read (newest: {bad[0][1]}); "
        "restore one, or delete the run dir to start again"
    )


# --------------------------------------------------------------------------- RNG

Generator = torch.Generator | random.Random | np.random.Generator


def generator_state(g: Generator) -> Any:
    """State of one generator, in a form `torch.load(weights_only=True)` accepts."""
    if isinstance(g, torch.Generator):
        return g.get_state()  # uint8 tensor
    if isinstance(g, random.Random):
        return g.getstate()  # (version, tuple of ints, gauss_next)
    if isinstance(g, np.random.Generator):
        return g.bit_generator.state  # dict of str / python ints
    raise TypeError(f"unsupported generator type {type(g).__name__}")


def set_generator_state(g: Generator, state: Any) -> None:
    """Restore a state from `generator_state` into `g` (of the same type)."""
    if isinstance(g, torch.Generator):
        g.set_state(state)
    elif isinstance(g, random.Random):
        g.setstate(_as_tuple(state))
    elif isinstance(g, np.random.Generator):
        g.bit_generator.state = state
    else:
        raise TypeError(f"unsupported generator type {type(g).__name__}")


def _as_tuple(x: Any) -> Any:
    # random.setstate needs tuples all the way down; a round trip may give lists.
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


def _numpy_global_state() -> dict:
    s = np.random.get_state(legacy=False)  # {'bit_generator', 'state': {'key', 'pos'}, ...}
    return {
        "bit_generator": s["bit_generator"],
        "key": torch.from_numpy(s["state"]["key"].astype(np.int64)),  # uint32 [624]
        "pos": int(s["state"]["pos"]),
        "has_gauss": int(s["has_gauss"]),
        "gauss": float(s["gauss"]),
    }


def _set_numpy_global_state(s: Mapping[str, Any]) -> None:
    np.random.set_state({
        "bit_generator": s["bit_generator"],
        "state": {"key": s["key"].numpy().astype(np.uint32), "pos": s["pos"]},
        "has_gauss": s["has_gauss"],
        "gauss": s["gauss"],
    })


def rng_state(generators: Mapping[str, Generator] | None = None) -> dict:
    """Every random stream of the process: python `random`, numpy's global RNG, torch CPU,
    torch CUDA (all devices, when CUDA is available), and the named `generators`
    (torch.Generator, random.Random or numpy Generator) the caller owns."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": _numpy_global_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "generators": {name: generator_state(g) for name, g in (generators or {}).items()},
    }
    return state


def set_rng_state(state: Mapping[str, Any], generators: Mapping[str, Generator] | None = None) -> None:
    """Restore what `rng_state` captured. Every generator in `generators` must be in it."""
    random.setstate(_as_tuple(state["python"]))
    _set_numpy_global_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning(
                "checkpoint has CUDA RNG state for %d devices, this process has %d: not restored",
                len(cuda), torch.cuda.device_count() if torch.cuda.is_available() else 0,
            )
    saved = state.get("generators", {})
    for name, g in (generators or {}).items():
        if name not in saved:
            raise KeyError(f"generator {name!r} is not in the saved RNG state (has {sorted(saved)})")
        set_generator_state(g, saved[name])
