"""Tracking: metric loggers (MLflow, JSONL, console), resync of a run dir to MLflow,
atomic checkpoints and RNG state. See docs/architecture.md, "suite.tracking".

The checkpoint names are loaded on first use (PEP 562 ``__getattr__``): importing a light
submodule (``suite.tracking.rundir``, which `suite status` reads) must not import torch. The
loggers import no MLflow at their top, so their names are bound here at once (``resync`` must be
the function, not the submodule of that name).
"""

from __future__ import annotations

import importlib

from suite.tracking.loggers import (
    ConsoleLogger,
    CorruptMetricsError,
    JsonlLogger,
    MetricLogger,
    MlflowLogger,
    MultiLogger,
    SyncResult,
    flatten_params,
    read_jsonl,
    resolve_tracking_uri,
    resync,
    resync_cli,
    truncate_jsonl,
)

_CHECKPOINT = ("checkpoint_path", "generator_state", "list_checkpoints", "load_latest_checkpoint", "rng_state",
               "save_checkpoint", "set_generator_state", "set_rng_state")

# a literal list (the loggers' names and _CHECKPOINT's, sorted), so linters see the re-exports
__all__ = ["ConsoleLogger", "CorruptMetricsError", "JsonlLogger", "MetricLogger", "MlflowLogger", "MultiLogger",
           "SyncResult", "checkpoint_path", "flatten_params", "generator_state", "list_checkpoints",
           "load_latest_checkpoint", "read_jsonl", "resolve_tracking_uri", "resync", "resync_cli", "rng_state",
           "save_checkpoint", "set_generator_state", "set_rng_state", "truncate_jsonl"]


def __getattr__(name: str):
    if name not in _CHECKPOINT:
        raise AttributeError(f"module 'suite.tracking' has no attribute {name!r}")
    return getattr(importlib.import_module("suite.tracking.checkpoint"), name)
