"""`suite` command line: one verb, one thin entry point.

    suite run [HYDRA_OVERRIDES...]      # e.g. suite run quant=int8 correction=acr uaq.s=1.5 algo=dapo seed=1
    suite run --cfg [OVERRIDES...]      # print the resolved config and exit (Hydra's --cfg job)
    suite sync RUN_DIR                  # re-send a run's JSONL metrics to MLflow after an outage

Further verbs (sweep, status, cancel, report, bench, tune, uaq) live in their own packages;
each exposes `register(subparsers)` and is listed in `_PLUGINS`, imported lazily so that
`suite run` never pays for pandas or Optuna.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from suite.config import ConfigError, compose_config, run_id


def _compose_or_exit(overrides: list[str]):
    try:
        return compose_config(overrides)
    except (ConfigError, HydraException, OmegaConfBaseException) as exc:
        msg = str(exc)
        if exc.__cause__ is not None and str(exc.__cause__) not in msg:
            msg += f"\n{exc.__cause__}"
        print(f"suite: bad config: {msg}", file=sys.stderr)
        sys.exit(2)


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _compose_or_exit(args.overrides)
    if args.cfg:
        print(OmegaConf.to_yaml(cfg, resolve=True), end="")
        return 0
    rid = run_id(cfg)
    run_dir = os.path.join(cfg.out_dir, rid)
    print(f"suite run {rid}\n  run dir: {run_dir}\n  tracking: {cfg.tracking.tracking_uri} "
          f"(experiment {cfg.tracking.experiment!r})", flush=True)
    start = time.perf_counter()
    from suite.cell import run_cell
    from suite.hardware import HardwareError
    from suite.tracking.lock import RunLockedError
    from suite.tracking.loggers import CorruptMetricsError

    try:
        summary = run_cell(cfg, run_dir, progress=not args.no_progress and sys.stderr.isatty())
    except HardwareError as exc:  # refused before anything was created: no run dir, no MLflow run
        print(f"suite: cannot run here: {exc}", file=sys.stderr)
        return 2
    except CorruptMetricsError as exc:  # refused before the warm start; the MLflow run is untouched
        print(f"suite: cannot resume: {exc}", file=sys.stderr)
        return 2
    except RunLockedError as exc:  # the holder's MLflow run is its own: leave it alone
        print(f"suite: run dir busy: {exc}", file=sys.stderr)
        return 2
    if summary.already_finished:
        print(f"already finished: {run_dir} (delete it to run again)")
    wall = time.perf_counter() - start
    print(
        f"done {rid}: held-out acc {summary.baseline_acc:.3f} -> {summary.final_acc:.3f} "
        f"({summary.delta_acc:+.3f}) in {wall / 60:.1f} min; "
        f"mlflow ui --backend-store-uri {cfg.tracking.tracking_uri}",
        flush=True,
    )
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    from suite.tracking.loggers import resync_cli

    return resync_cli(args.run_dir, args.tracking_uri)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="suite", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one experiment (Hydra overrides as arguments)")
    p_run.add_argument("--cfg", action="store_true", help="print the resolved config and exit")
    p_run.add_argument("--no-progress", action="store_true", help="periodic lines instead of a progress bar")
    p_run.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. quant=fp8 uaq.s=1.0 seed=2")
    p_run.set_defaults(func=cmd_run)
    p_sync = sub.add_parser("sync", help="re-send a run's metrics.jsonl to MLflow (idempotent)")
    p_sync.add_argument("run_dir")
    p_sync.add_argument("--tracking-uri", default=None, help="default: the one the run used")
    p_sync.set_defaults(func=cmd_sync)
    for module in _PLUGINS:
        importlib.import_module(module).register(sub)
    return parser


# Modules that add verbs: each defines `register(subparsers)` which calls `add_parser` and
# `set_defaults(func=...)`; heavy imports belong inside the verb's function, not at module top.
_PLUGINS: tuple[str, ...] = (
    "suite.verl.uaq_cli",
    "suite.sweep.cli",
    "suite.tune.cli",
    "suite.bench",
    "suite.report.cli",
)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
