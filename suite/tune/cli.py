"""`suite tune FILE [KEY=VALUE...] [--report]`: run or continue a study; or report on it."""

from __future__ import annotations

import argparse
import sys


def cmd_tune(args: argparse.Namespace) -> int:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from suite.config import ConfigError
    from suite.tune.spec import TuneSpecError, load_tune_file

    try:
        spec = load_tune_file(args.file, args.overrides)
        if args.report:
            from suite.tune.report import make_report

            make_report(spec, args.report_dir)
            return 0
        from suite.tune.study import run_study

        with open(args.file) as fh:
            text = fh.read()
        summary = run_study(spec, text)
    except (TuneSpecError, ConfigError, HydraException, OmegaConfBaseException) as exc:
        print(f"suite tune: bad tune file {args.file}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0 if summary["n_complete"] else 1


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune", help="search hyper-parameters with Optuna (docs/tuning.md)",
        description="Run or continue the Optuna study of a tune file; trials run through the local or "
                    "SLURM launcher and land in MLflow as child runs of the study's run.",
    )
    p.add_argument("file", help="tune file, e.g. experiments/tune_uaq.yaml")
    p.add_argument("overrides", nargs="*", help="dotted overrides of the tune file, e.g. n_trials=4 parallelism=1")
    p.add_argument("--report", action="store_true",
                   help="write the best trial, importances, history figures and a table; log them to MLflow")
    p.add_argument("--report-dir", default=None, help="where --report writes (default: <out_dir>/<study>/report)")
    p.set_defaults(func=cmd_tune)


def main(argv: list[str] | None = None) -> int:
    """`python -m suite.tune.cli FILE ...`: the `tune` verb alone (same arguments as `suite tune`)."""
    parser = argparse.ArgumentParser(prog="suite")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tune", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
