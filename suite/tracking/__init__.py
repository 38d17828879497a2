"""Tracking: metric loggers (MLflow, JSONL, console), resync of a run dir to MLflow,
atomic checkpoints and RNG state. See docs/architecture.md, "suite.tracking".

The names below are loaded on first use (PEP 562 ``__getattr__``): importing one light
submodule (``suite.tracking.rundir``, which `suite status` reads) must not import torch (the
checkpoints) or MLflow (the loggers).
"""

from __future__ import annotations

import importlib

_CHECKPOINT = ("checkpoint_path", "generator_state", "list_checkpoints", "load_latest_checkpoint", "rng_state",
               "save_checkpoint", "set_generator_state", "set_rng_state")
_LOGGERS = ("ConsoleLogger", "CorruptMetricsError", "JsonlLogger", "MetricLogger", "MlflowLogger", "MultiLogger",
            "SyncResult", "flatten_params", "read_jsonl", "resolve_tracking_uri", "resync", "resync_cli",
            "truncate_jsonl")
_HOME = {**{n: "suite.tracking.checkpoint" for n in _CHECKPOINT}, **{n: "suite.tracking.loggers" for n in _LOGGERS}}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'suite.tracking' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
