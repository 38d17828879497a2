"""`suite report`: regenerate the papers' tables and figures from tracked runs.

    suite report experiments/main_table.yaml          # a sweep: its parent run's children, missing cells shown
    suite report --experiment suite                   # every run of an MLflow experiment
    suite report --runs "tags.precision = 'int8'"     # an MLflow filter (with or without --experiment)
    suite report --parent RUN_ID                      # the children of any parent run (a sweep, a study)
    suite report ... --out reports/main --tracking-uri http://127.0.0.1:5000 --no-notebook

Writes tables (CSV, Markdown, LaTeX), figures (PNG, SVG), report.md and an executed report
notebook with its HTML export (docs/reports.md). With a sweep or --parent, the report is also
logged as the `report/` artifacts of that parent run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def register(subparsers) -> None:
    from suite.report import BOOTSTRAP_MIN_N

    p = subparsers.add_parser(
        "report", help="tables, figures and an executed notebook from MLflow runs (a sweep, an experiment, a filter)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_file", nargs="?", default=None, help="a sweep file (suite sweep): report its cells")
    p.add_argument("sweep_overrides", nargs="*", default=[],
                   help="the overrides the sweep was launched with (so its cells' run ids match)")
    p.add_argument("--experiment", default=None, help="MLflow experiment name (or id); default: the sweep's, or all")
    p.add_argument("--runs", default="", metavar="FILTER",
                   help="MLflow search filter, e.g. \"tags.precision = 'int8' and tags.seed = '0'\"")
    p.add_argument("--parent", default=None, metavar="RUN_ID", help="only the child runs of this MLflow run")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: the sweep's, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    p.add_argument("--out", default=None, help="output directory (default: reports/<sweep or experiment name>); an "
                                              "earlier report there is replaced, anything else is refused")
    p.add_argument("--force", action="store_true", help="write into an --out that holds something else than a report")
    p.add_argument("--paper", default=None, metavar="DIR",
                   help="directory of the published values paper_*.csv (default: analysis/ of the suite source)")
    p.add_argument("--bench", action="append", default=[], metavar="FILE",
                   help="a `suite bench vllm` result (<out>/vllm.json): its speed-ups join the throughput table "
                        "beside the papers' claims (repeatable)")
    p.add_argument("--resamples", type=int, default=None,
                   help=f"bootstrap resamples for the 95%% CI of cells with >= {BOOTSTRAP_MIN_N} seeds (default 10000)")
    p.add_argument("--ci-seed", type=int, default=None, help="bootstrap seed (default 0)")
    p.add_argument("--no-notebook", action="store_true", help="skip the executed notebook and its HTML")
    p.add_argument("--no-log", action="store_true", help="do not log the report as artifacts of the parent run")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--history", choices=("auto", "client", "sql"), default="auto",
                   help="how metric histories are read: MLflow's client on 8 threads, or one SQL query on a "
                        "database store with a tested MLflow version; auto = sql where it applies (default)")
    p.set_defaults(func=cmd_report)


def _sweep_source(args) -> dict:
    """Tracking URI, experiment, parent run and expected cells of a sweep file."""
    from suite.sweep.spec import RecordedCell, SweepError, load_sweep, read_record
    from suite.tracking.loggers import resolve_tracking_uri

    try:
        # the configs its last launch recorded (composed once, by that launch), when they are the
        # whole matrix of this very file and overrides; else the file as it is now, composed
        sweep = load_sweep(args.sweep_file, args.sweep_overrides, recorded=True)
        recorded = all(isinstance(c, RecordedCell) for c in sweep.cells)
        narrowed = recorded and bool((read_record(sweep.state_dir) or ({},))[0].get("only"))  # --only: part of it
        if sweep.launch_note or narrowed or not recorded:
            sweep = load_sweep(args.sweep_file, args.sweep_overrides)
    except SweepError as e:
        print(f"suite report: bad sweep file: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    uri = resolve_tracking_uri(args.tracking_uri or sweep.tracking_uri)
    _store_or_exit(uri)
    parent = args.parent
    if parent is None:
        from suite.sweep.parent import parent_run

        try:
            parent = parent_run(sweep, create=False) if not args.tracking_uri else None
        except SweepError as e:  # a damaged parent_run.json, named
            print(f"suite report: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    if parent is None:  # found by name: the sweep was launched from another state dir
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        from suite.tracking.experiments import experiment_id

        exp_id = experiment_id(client, sweep.experiment, create=False)
        if exp_id is not None:
            found = client.search_runs([exp_id],
                                       f"tags.`suite.kind` = 'sweep' and tags.sweep = '{sweep.name}'",
                                       order_by=["attributes.start_time DESC"], max_results=1)
            parent = found[0].info.run_id if found else None
    from suite.report.data import config_params

    expected = [{"cell": c.index, "run_id": c.run_id, "lr": float(c.cfg.train.lr * c.cfg.train.lr_factor),
                 "lr_factor": float(c.cfg.train.lr_factor), "sweep": sweep.name,
                 "params": config_params(c.cfg), **c.config_axes} for c in sweep.cells]
    return {"tracking_uri": uri, "experiment": args.experiment or sweep.experiment, "parent": parent,
            "name": sweep.name, "expected": expected}


def _store_or_exit(uri: str) -> None:
    """Exit 2 naming the store when it is not there: a sqlite file that does not exist (opening it
    would create an empty store: a typo would report "no runs" and leave a file behind), or a
    server that does not answer within ~10 s."""
    from suite.tracking.outage import StoreUnreachable, check_store

    if uri.startswith("sqlite:///") and not os.path.isfile(uri[len("sqlite:///"):]):
        print(f"suite report: no MLflow store at {uri} (file {uri[len('sqlite:///'):]} does not exist)",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        check_store(uri, verb="suite report")
    except StoreUnreachable as exc:
        print(f"suite report: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _out_problem(out: str, force: bool) -> str | None:
    """Why `suite report` may not write to `out` (None: it may). An earlier report there (its
    data/source.json) is regenerated in place; anything else is kept unless --force."""
    from suite.tracking.fscheck import writable_problem

    if os.path.exists(out) and not os.path.isdir(out):
        return f"--out {out}: exists and is not a directory; choose a directory"
    if os.path.isdir(out) and os.listdir(out) and not force \
            and not os.path.isfile(os.path.join(out, "data", "source.json")):
        return f"--out {out}: holds files that are not a `suite report`; choose a new directory or pass --force"
    return writable_problem(out, "--out", is_dir=True)


def _store_error(e: Exception) -> bool:
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    return isinstance(e, (MlflowException, SQLAlchemyError))


def cmd_report(args: argparse.Namespace) -> int:
    from suite.tracking.loggers import resolve_tracking_uri

    start = time.perf_counter()
    if args.resamples is not None and args.resamples < 2000:
        print(f"suite report: --resamples={args.resamples}: use at least 2000 for stable 95% percentiles",
              file=sys.stderr)
        return 2
    from suite.report.paper import PaperDataError, load_paper

    try:  # the published values first: a bad row stops the report before anything is read or written
        load_paper(args.paper)
    except PaperDataError as e:
        print(f"suite report: bad published values: {e}", file=sys.stderr)
        return 2
    from suite.report.paper import load_bench

    try:
        bench = load_bench(args.bench) if args.bench else None
    except PaperDataError as e:
        print(f"suite report: {e}", file=sys.stderr)
        return 2
    expected, name = None, None
    if args.out and (problem := _out_problem(args.out, args.force)) is not None:  # before the store is asked
        print(f"suite report: {problem}", file=sys.stderr)
        return 2
    if args.sweep_file:
        src = _sweep_source(args)
        uri, experiment, parent, name, expected = (src["tracking_uri"], src["experiment"], src["parent"], src["name"],
                                                   src["expected"])
        flt = args.runs
        if parent is None:  # no parent run (never launched, or another store): match the cells' sweep tag
            sweep_flt = f"tags.sweep = '{name}'"
            flt = f"{flt} and {sweep_flt}" if flt else sweep_flt
    else:
        uri = resolve_tracking_uri(args.tracking_uri)
        _store_or_exit(uri)
        experiment, parent, flt = args.experiment, args.parent, args.runs
        name = experiment or (f"parent-{parent[:8]}" if parent else "runs")
    out = args.out or os.path.join("reports", name)
    if (problem := _out_problem(out, args.force)) is not None:
        print(f"suite report: {problem}", file=sys.stderr)
        return 2
    from suite.tracking.outage import bounded_http

    with bounded_http():
        return _report(args, uri, experiment, parent, flt, name, expected, out, bench, start)


def _report(args, uri, experiment, parent, flt, name, expected, out, bench, start) -> int:
    from suite.report import data as D
    from suite.report.build import write_report
    from suite.report.tables import CI_SEED, N_RESAMPLES

    try:
        rd = D.load_runs(uri, experiment=experiment, filter_string=flt, parent_run_id=parent, quiet=args.quiet,
                         history_source=args.history)
    except ValueError as e:
        print(f"suite report: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - the store itself: a file that is not an MLflow database, a dead server
        if not _store_error(e):
            raise
        print(f"suite report: cannot read the MLflow store {uri}: {str(e).splitlines()[0][:300]}", file=sys.stderr)
        return 2
    if rd.runs.empty:  # nothing to report is a wrong source, not a report of nothing: no file is written
        what = (f"sweep {name!r} ({args.sweep_file}) has no run there: it was never launched, or launched with "
                "another tracking store (`suite status FILE` shows its cells)") if expected is not None else \
            f"no runs found (experiment={experiment!r}, filter={flt!r}, parent={parent!r})"
        print(f"suite report: {uri}: {what}", file=sys.stderr)
        return 2
    if expected is not None:
        rd.runs = D.add_missing(rd.runs, expected)
        rd.source["sweep"] = name
        rd.source["sweep_file"] = os.path.abspath(args.sweep_file)
    res = write_report(rd, out, paper_dir=args.paper, n_resamples=args.resamples or N_RESAMPLES,
                       ci_seed=CI_SEED if args.ci_seed is None else args.ci_seed,
                       notebook=not args.no_notebook, quiet=args.quiet, bench=bench)
    if parent and not args.no_log:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=uri).log_artifacts(parent, res["out"], artifact_path="report")
        if not args.quiet:
            print(f"suite report: logged as artifacts report/ of parent run {parent}", file=sys.stderr)
    counts = ", ".join(f"{n} {s}" for s, n in res["status"].items())
    print(f"suite report: {counts} -> {res['out']} ({time.perf_counter() - start:.1f} s)"
          + (f"; open {res['html']}" if res["html"] else ""), flush=True)
    return 0
