"""suite: RL of a small language model with a quantized rollout actor (QuRL / QaRL).

    suite run quant=int8 correction=acr uaq.s=1.5 algo=dapo seed=1   # one experiment
    suite run --cfg job quant=fp8         # print the resolved config and exit (Hydra's --cfg)
    suite sweep experiments/quickstart.yaml --dry-run   # a matrix of runs (see `suite sweep -h`)
    suite sync runs/RUN_ID                # re-send a run's metrics to MLflow after an outage

`suite VERB -h` explains each verb.
"""

# Further verbs (sweep, status, cancel, report, bench, tune, uaq) live in their own packages; each
# exposes `register(subparsers)` and is listed in `_PLUGINS`.

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import time

from suite.cli_common import GroupsHelp, compose_or_exit

# Nothing heavy at the top: `suite --help` and the light verbs (`suite status`) must not pay for
# Hydra's composition or torch, which suite.config imports (its registries live with torch code).


def cmd_run(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.cfg is not None and args.cfg not in CFG_PARTS:  # `--cfg quant=int8`: --cfg job, then an override
        overrides.insert(0, args.cfg)
        args.cfg = "job"
    _refuse_multirun(args.multirun, overrides)
    cfg = compose_or_exit(overrides)
    from omegaconf import OmegaConf

    from suite.config import run_id

    if args.cfg:
        if args.cfg in ("job", "all"):
            print(OmegaConf.to_yaml(cfg, resolve=True), end="")
        if args.cfg in ("hydra", "all"):
            from suite.hydra_compat import hydra_config_yaml

            print(hydra_config_yaml(overrides), end="")
        return 0
    if args.warm_start_only:
        return _warm_start_only(cfg, progress=not args.no_progress and sys.stderr.isatty())
    rid = run_id(cfg)
    run_dir = os.path.join(cfg.out_dir, rid)
    from suite.backend import backend_missing

    if (problem := backend_missing(cfg) or write_problem(cfg, run_dir)) is not None:  # before anything exists
        print(f"suite run: {problem}", file=sys.stderr)
        return 2
    print(f"suite run {rid}\n  run dir: {run_dir}\n  tracking: {cfg.tracking.tracking_uri} "
          f"(experiment {cfg.tracking.experiment!r})", flush=True)
    start = time.perf_counter()
    from suite.cell import run_cell
    from suite.hardware import HardwareError
    from suite.tracking.experiments import ui_hint
    from suite.tracking.checkpoint import NoReadableCheckpoint
    from suite.tracking.lock import RunLockedError
    from suite.tracking.loggers import CorruptMetricsError

    try:
        summary = run_cell(cfg, run_dir, progress=not args.no_progress and sys.stderr.isatty())
    except HardwareError as exc:  # refused before anything was created: no run dir, no MLflow run
        print(f"suite: cannot run here: {exc}", file=sys.stderr)
        return 2
    except (CorruptMetricsError, NoReadableCheckpoint) as exc:  # refused before training: nothing rewritten
        print(f"suite: cannot resume: {exc}", file=sys.stderr)
        return 2
    except RunLockedError as exc:  # the holder's MLflow run is its own: leave it alone
        print(f"suite: run dir busy: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C (or SIGINT): one line, the run KILLED, how to go on
        return _interrupted(cfg, run_dir, getattr(args, "argv", None))
    except Exception as exc:
        from suite.tracking.fscheck import env_fault, fault_line

        fault = env_fault(exc)
        if fault is None:
            raise
        print(f"suite run: stopped: {fault_line(fault, run_dir)}. Nothing written before the fault is lost: once it "
              f"is fixed, the same command resumes from the last complete checkpoint ({_last_checkpoint(run_dir)}).",
              file=sys.stderr)
        return 2
    if summary.already_finished:
        print(f"already finished: {run_dir} (delete it to run again)")
    wall = time.perf_counter() - start
    print(
        f"done {rid}: held-out acc {summary.baseline_acc:.3f} -> {summary.final_acc:.3f} "
        f"({summary.delta_acc:+.3f}) in {wall / 60:.1f} min\n"
        f"  MLflow UI: {ui_hint(summary.tracking_uri or cfg.tracking.tracking_uri, summary.mlflow_run_id)}",
        flush=True,
    )
    return 0


CFG_PARTS = ("job", "hydra", "all")


def write_problem(cfg, run_dir: str) -> str | None:
    """Why a run could not write its run dir, its sqlite MLflow store or its warm-start cache
    (suite.tracking.fscheck), or None. Checked before anything is created."""
    from suite.tracking.fscheck import writable_problem
    from suite.tracking.loggers import resolve_tracking_uri

    uri = resolve_tracking_uri(cfg.tracking.tracking_uri)
    checks = [(run_dir, "out_dir: the run dir")]
    if uri.startswith("sqlite:///"):
        db = uri[len("sqlite:///"):]
        checks.append((os.path.dirname(db) or ".", f"tracking.tracking_uri={uri}: the store's directory"))
        if os.path.exists(db) and not os.access(db, os.W_OK):
            return f"tracking.tracking_uri={uri}: {db} is not writable"
    if cfg.backend.name == "embedded":
        checks.append((os.path.expanduser(str(cfg.warm_start.cache_dir)), "warm_start.cache_dir"))
    for path, what in checks:
        if (problem := writable_problem(path, what, is_dir=True)) is not None:
            return problem
    return None


def _interrupted(cfg, run_dir: str, argv: list[str] | None) -> int:
    """After Ctrl-C: end the run's MLflow run KILLED (bounded: an unreachable server costs seconds),
    and print one line with the command that resumes it. A second Ctrl-C skips the marking."""
    from suite.launch.guard import end_runs
    from suite.tracking.loggers import resolve_tracking_uri
    from suite.tracking.rundir import recorded_mlflow_run_id

    marked = ""
    notes: list[str] = []
    if (rid := recorded_mlflow_run_id(run_dir)) is not None:
        try:
            if end_runs(resolve_tracking_uri(cfg.tracking.tracking_uri), [rid], "KILLED", out=notes.append):
                marked = f"; MLflow run {rid} marked KILLED"
        except KeyboardInterrupt:
            notes.append(f"MLflow run {rid} left as it was (interrupted again)")
    command = "suite " + shlex.join(argv) if argv else "the same `suite run` command"
    print(f"suite run: interrupted{marked}{' (' + '; '.join(notes) + ')' if notes else ''}. Resume from the "
          f"last checkpoint ({_last_checkpoint(run_dir)}) with: {command}", file=sys.stderr, flush=True)
    return 130


def _last_checkpoint(run_dir: str) -> str:
    from suite.tracking.rundir import list_checkpoints

    found = list_checkpoints(run_dir)
    return f"step {found[-1][0]}" if found else "none yet: it starts again"


def _warm_start_only(cfg, *, progress: bool) -> int:
    """`suite run --warm-start-only`: train (or find) the run's warm start in its cache and stop,
    with no run dir and no MLflow run. Cells that share a warm start otherwise wait, each holding
    its allocation, on the lock of the first one training it (suite.embedded.warmstart)."""
    from suite.backend import backend_warm_start
    from suite.hardware import HardwareError
    from suite.tracking.fscheck import writable_problem

    if cfg.backend.name == "embedded" and (problem := writable_problem(
            os.path.expanduser(str(cfg.warm_start.cache_dir)), "warm_start.cache_dir", is_dir=True)) is not None:
        print(f"suite run: --warm-start-only: {problem}", file=sys.stderr)
        return 2
    try:
        info = backend_warm_start(cfg, progress=progress)
    except ValueError as exc:  # a backend without a warm start
        print(f"suite run: --warm-start-only: {exc}", file=sys.stderr)
        return 2
    except HardwareError as exc:
        print(f"suite: cannot run here: {exc}", file=sys.stderr)
        return 2
    print(f"warm start: {info['cache_path']} ({'in the cache already' if info['cache_hit'] else 'trained'})",
          flush=True)
    return 0


def _refuse_multirun(multirun: bool, overrides: list[str]) -> None:
    """Hydra's `-m` and `key=a,b` sweeps: `suite run` runs one experiment; a matrix is a sweep file,
    run by the suite's launcher (resumable, one MLflow parent run, local or SLURM)."""
    from suite.overrides import ConfigError, parse_overrides

    sweeps = []
    if not multirun:
        try:
            sweeps = [o.input_line for o in parse_overrides(overrides) if o.is_sweep_override()]
        except ConfigError:
            return  # compose names the bad override
    if multirun or sweeps:
        what = "-m/--multirun" if multirun else f"the sweep override {sweeps[0]!r}"
        print(f"suite run: {what}: `suite run` runs one experiment. For several, write a sweep file "
              f"(matrix: {{seed: [0, 1]}}) and run `suite sweep FILE`; experiments/quickstart.yaml is one, "
              f"docs/sweeps.md the format.", file=sys.stderr)
        sys.exit(2)


RUN_HELP = """Run one experiment: compose the config from Hydra overrides, train, log to MLflow.

    suite run                                        # the default: INT8 rollout, ACR, UAQ s=1.5, GRPO
    suite run quant=fp8 correction=tis uaq.s=1.0 algo=dapo seed=1
    suite run --cfg job quant=w4a16 correction=tbpo  # print the resolved config; run nothing
    suite run --cfg hydra                            # Hydra's config and the chosen group options
    suite run --warm-start-only model=small          # train the cached warm start only (before a sweep)

A run goes to <out_dir>/<run_id> (out_dir=runs); running the same command again resumes it.
Several runs (Hydra's -m, key=a,b) are a sweep file: `suite sweep FILE`.
"""


def cmd_sync(args: argparse.Namespace) -> int:
    from suite.tracking.loggers import resync_cli

    return resync_cli(args.run_dir, args.tracking_uri)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="suite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run one experiment (Hydra overrides as arguments)", add_help=False,
                           description=RUN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p_run.add_argument("-h", "--help", action=GroupsHelp, help="show this help and the config groups, and exit")
    p_run.add_argument("--cfg", nargs="?", const="job", metavar="{job,hydra,all}",
                       help="print the config and exit: job (the run's, the default), hydra (Hydra's), all")
    p_run.add_argument("-m", "--multirun", action="store_true",
                       help="refused: several runs are a sweep file (`suite sweep FILE`)")
    p_run.add_argument("--no-progress", action="store_true", help="periodic lines instead of a progress bar")
    p_run.add_argument("--warm-start-only", action="store_true",
                       help="train (or find) the run's cached warm start, e.g. once before a sweep whose cells "
                            "share it, and stop: no run dir, no MLflow run")
    p_run.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. quant=fp8 uaq.s=1.0 seed=2")
    p_run.set_defaults(func=cmd_run)
    p_sync = sub.add_parser(
        "sync", help="re-send a run's metrics.jsonl to MLflow (idempotent)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Send to MLflow what a run recorded in its metrics.jsonl while the tracking server was\n"
                    "unreachable (a run never waits on the server). Idempotent: a metric MLflow has at its step\n"
                    "is not sent again.\n\n    suite sync runs/RUN_ID\n    suite sync runs/RUN_ID --tracking-uri "
                    "http://127.0.0.1:5000")
    p_sync.add_argument("run_dir", help="the run's directory, e.g. runs/grpo-int8-acr-s1.5-arith-seed0-68ac4b1688")
    p_sync.add_argument("--tracking-uri", default=None, help="default: the one the run used")
    p_sync.set_defaults(func=cmd_sync)
    for module in _PLUGINS:
        importlib.import_module(module).register(sub)
    return parser


# Modules that add verbs: each defines `register(subparsers)` which calls `add_parser` and
# `set_defaults(func=...)`; heavy imports belong inside the verb's function, so `suite run` never
# pays for pandas or Optuna.
_PLUGINS: tuple[str, ...] = (
    "suite.verl.uaq_cli",
    "suite.sweep.cli",
    "suite.tune.cli",
    "suite.bench",
    "suite.report.cli",
    "suite.verl.data",
    "suite.embedded.export",
    "suite.evaluation.cli",
)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # options may sit among the overrides (`suite run model=tiny --no-progress steps=5`), which one
    # argparse pass cannot split: the overrides after an option come back as extras
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    args.argv = argv  # what resume hints repeat
    if extra:
        if not isinstance(getattr(args, "overrides", None), list) or any(e.startswith("-") for e in extra):
            parser.parse_args(argv)  # argparse's own error for what is unknown
        args.overrides += extra
    try:
        return args.func(args)
    except KeyboardInterrupt:  # before a verb has anything to stop: nothing to say but that
        print(f"suite {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # a file system fault (full, read-only, permission) in any verb: one line, not a traceback.
        # export, uaq, data prepare and a run's records write temporary names renamed when complete,
        # so they leave nothing half-written; a report is regenerated whole by the same command
        from suite.tracking.fscheck import env_fault, fault_line

        fault = env_fault(exc)
        if fault is None:
            raise
        print(f"suite {args.command}: stopped: {fault_line(fault)}; once that is fixed, run the same command again",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
