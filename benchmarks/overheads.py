"""What orchestration costs, next to the science it orchestrates (a development benchmark: not
installed with the package; run from a checkout).

    python benchmarks/overheads.py [--parts sweep,mlflow,report] [--json]

- sweep: expanding and validating an N-cell sweep file (`suite.sweep.spec.load_sweep`: every
  cell composed, validated, hashed to its run id), median of repeats.
- mlflow: the share of a real run's wall time spent in the MLflow logger (real sqlite store),
  and in the JSONL logger beside it. The run is an `EmbeddedRun` of the default experiment
  (shortened by `--run-overrides`); every public method of `MlflowLogger` / `JsonlLogger` is
  timed while it runs (outermost calls only), so both shares come from the same run, with no
  second run to subtract. The warm start is filled beforehand (a sweep's runs share it).
  The one-off `import mlflow` of a fresh process is timed separately, in a subprocess.
- report: `suite report` (tables, figures, notebook unless `--no-notebook`) over N synthetic
  finished runs in a fresh sqlite store: each run has the axis tags, params and
  `--report-steps` steps of the metrics the report reads. The first 50 are written through
  `MlflowClient` (timed: what a run's logging costs the store), the rest copied inside the
  sqlite store from those (a 1,000-run store in seconds, not many minutes).

A part whose module is not installed is skipped with a note.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from suite.bench.common import (
    BenchError,
    add_common_args,
    check_common,
    emit,
    machine_info,
    median,
    note,
    parse_list,
    set_threads,
)

PARTS = ("sweep", "mlflow", "report")
COLUMNS = ("item", "n", "seconds", "per_item_ms", "share_of_run", "note")
# The 1,000-cell grid: precision x correction x UAQ s x seed = 5 x 4 x 5 x 10.
def grid() -> dict[str, list[str]]:
    """The grid's axes (a function: the precisions come from the quantizer registry, with torch):
    the papers' matrix, i.e. the precisions both backends run (not the embedded-only dose axes)."""
    from suite.core.quant import QUANTIZERS

    return {"quant": [p for p, q in QUANTIZERS.items() if q.verl], "correction": ["naive", "tis", "acr", "tbpo"],
            "uaq.s": ["1.0", "1.25", "1.5", "1.75", "2.0"], "seed": [str(i) for i in range(10)]}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/overheads.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated: {', '.join(PARTS)}")
    p.add_argument("--cells", type=int, default=1000, help="sweep cells to expand (<= 1000; default 1000)")
    p.add_argument("--run-overrides", default="steps=20",
                   help="Hydra overrides of the run timed for the MLflow share (default 'steps=20')")
    p.add_argument("--runs", type=int, default=1000, help="synthetic runs for `suite report` (<= 1000; default 1000)")
    p.add_argument("--report-steps", type=int, default=20, help="logged steps per synthetic run (default 20)")
    p.add_argument("--api-runs", type=int, default=50,
                   help="synthetic runs written through MlflowClient; the rest are copied inside the sqlite store "
                        "(default 50)")
    p.add_argument("--no-notebook", action="store_true", help="time `suite report --no-notebook`")
    add_common_args(p)
    p.set_defaults(func=cmd_overheads, repeats=3)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


def grid_cells(n: int) -> list[dict[str, str]]:
    """The first ``n`` cells of the grid in matrix order (seed varies fastest)."""
    g = grid()
    return [dict(zip(g, combo)) for combo in itertools.islice(itertools.product(*g.values()), n)]


def _sweep_yaml(n: int, out_dir: str) -> str:
    """A sweep file whose matrix expands to exactly ``n`` cells of the grid (an include list
    when n is not a full grid)."""
    cells, g = grid_cells(n), grid()
    lines = ["name: bench-overheads", "description: suite bench overheads (sweep expansion)",
             "base:", f"  - out_dir={out_dir}"]
    if n == len(list(itertools.product(*g.values()))):
        lines.append("matrix:")
        for k, vals in g.items():
            lines.append(f"  {k}: [{', '.join(vals)}]")
    else:
        lines.append("include:")
        for c in cells:
            lines.append("  - {" + ", ".join(f"{k}: {v}" for k, v in c.items()) + "}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- sweep


def bench_sweep(n: int, repeats: int, warmup: int, tmp: str) -> list[dict]:
    try:
        from suite.sweep.spec import load_sweep
    except ImportError as exc:
        return [{"item": "sweep expand + validate", "n": n, "seconds": float("nan"), "per_item_ms": float("nan"),
                 "note": f"skipped: suite.sweep.spec.load_sweep not available ({exc})"}]
    path = os.path.join(tmp, "sweep.yaml")
    with open(path, "w") as fh:
        fh.write(_sweep_yaml(n, os.path.join(tmp, "runs")))
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        sweep = load_sweep(path)
        dt = time.perf_counter() - t0
        if len(sweep.cells) != n:
            raise RuntimeError(f"the sweep expanded to {len(sweep.cells)} cells, expected {n}")
        if i >= warmup:
            times.append(dt)
        note(f"  sweep: {n} cells in {dt:.2f} s")
    s = median(times)
    return [{"item": "sweep expand + validate", "n": n, "seconds": s, "per_item_ms": 1e3 * s / n,
             "repeats": repeats, "note": "suite.sweep.spec.load_sweep: compose + validate + run id per cell"}]


# ----------------------------------------------------------------------------- MLflow share


class _Meter:
    """Seconds spent inside the wrapped methods of one class (outermost calls only)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._depth = 0

    def wrap(self, fn):
        def wrapper(*args, **kwargs):
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - t0
                    self.calls += 1

        return wrapper


_MLFLOW_METHODS = ("__init__", "log_params", "set_tags", "log_metrics", "log_artifact", "flush", "close",
                   "_enqueue_jsonl")
_JSONL_METHODS = ("__init__", "log_params", "set_tags", "log_metrics", "log_artifact", "flush", "close",
                  "truncate_after")


@contextlib.contextmanager
def metered(cls, names, meter: _Meter):
    """Time every call of ``cls.<names>`` into ``meter`` while the block runs."""
    saved = {n: cls.__dict__[n] for n in names if n in cls.__dict__}
    try:
        for n, fn in saved.items():
            setattr(cls, n, meter.wrap(fn))
        yield meter
    finally:
        for n, fn in saved.items():
            setattr(cls, n, fn)


def _import_seconds(module: str) -> float:
    """Wall seconds a fresh interpreter needs to import ``module``, minus a bare start."""
    def run(code):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        return time.perf_counter() - t0

    return max(0.0, run(f"import {module}") - run("pass"))


def bench_mlflow(overrides: list[str], repeats: int, tmp: str) -> list[dict]:
    from suite.config import compose_config
    from suite.embedded.trainer import EmbeddedRun
    from suite.tracking.loggers import JsonlLogger, MlflowLogger

    uri = f"sqlite:///{os.path.join(tmp, 'mlflow-overheads.db')}"
    ov = list(overrides) + [f"tracking.tracking_uri={uri}", "tracking.experiment=bench-overheads",
                            "tracking.console_every=0"]
    cfg = compose_config(ov)
    note(f"  mlflow: filling the warm start ({cfg.warm_start.steps} steps, cached), then {repeats} run(s) of "
         f"{cfg.steps} steps")
    EmbeddedRun(cfg, os.path.join(tmp, "warm"), progress=False).build()
    # One-offs of a sweep, not of each run: creating the sqlite store (MLflow's schema
    # migrations) and the experiment. Timed here, outside the runs' shares.
    from mlflow.tracking import MlflowClient

    t0 = time.perf_counter()
    MlflowClient(tracking_uri=uri).create_experiment("bench-overheads")
    t_store = time.perf_counter() - t0

    walls, ml, js, steps = [], [], [], cfg.steps
    for r in range(repeats):
        run_dir = os.path.join(tmp, f"run{r}")
        m_ml, m_js = _Meter(), _Meter()
        with metered(MlflowLogger, _MLFLOW_METHODS, m_ml), metered(JsonlLogger, _JSONL_METHODS, m_js):
            t0 = time.perf_counter()
            summary = EmbeddedRun(cfg, run_dir, progress=False).run()
            wall = time.perf_counter() - t0
        if summary.get("mlflow_run_id") is None:
            raise RuntimeError(f"the run did not reach MLflow at {uri}")
        walls.append(wall)
        ml.append(m_ml.seconds)
        js.append(m_js.seconds)
        note(f"  mlflow: run {r + 1}/{repeats}: wall {wall:.1f} s, MLflow {m_ml.seconds:.3f} s "
             f"({m_ml.calls} calls), JSONL {m_js.seconds:.3f} s")
    shares_ml = [m / w for m, w in zip(ml, walls)]
    shares_js = [j / w for j, w in zip(js, walls)]
    imp = _import_seconds("mlflow.tracking")
    w = median(walls)
    ovs = " ".join(overrides) or "(the default experiment)"
    return [
        {"item": "run wall time", "n": steps, "seconds": w, "per_item_ms": 1e3 * w / steps, "share_of_run": 1.0,
         "repeats": repeats, "note": f"EmbeddedRun.run(), {ovs}; n = RL steps"},
        {"item": "MLflow logging (sqlite)", "n": steps, "seconds": median(ml), "per_item_ms": 1e3 * median(ml) / steps,
         "share_of_run": median(shares_ml), "repeats": repeats,
         "note": "MlflowLogger: run creation, params, tags, batched metrics at each checkpoint, artifacts, close"},
        {"item": "JSONL logging", "n": steps, "seconds": median(js), "per_item_ms": 1e3 * median(js) / steps,
         "share_of_run": median(shares_js), "repeats": repeats, "note": "JsonlLogger (metrics.jsonl, params, tags)"},
        {"item": "import mlflow (fresh process)", "n": 1, "seconds": imp, "per_item_ms": 1e3 * imp,
         "share_of_run": imp / w, "note": "one-off per run process; not inside the shares above"},
        {"item": "MLflow sqlite store + experiment creation", "n": 1, "seconds": t_store, "per_item_ms": 1e3 * t_store,
         "share_of_run": t_store / w, "note": "one-off per store (schema migrations); not inside the shares above"},
    ]


# ----------------------------------------------------------------------------- report


_CLONED_TABLES = ("runs", "tags", "params", "metrics", "latest_metrics")  # MLflow's sqlite tables keyed by run_uuid


def _run_tags(i: int, cell: dict[str, str], experiment: str) -> dict[str, str]:
    return {"backend": "embedded", "precision": cell["quant"], "correction": cell["correction"],
            "uaq_s": f"{float(cell['uaq.s']):g}", "algo": "grpo", "task": "arith", "model": "small",
            "aligned_forward": "false", "seed": cell["seed"], "trainer_dtype": "fp32", "sweep": experiment,
            "cell": str(i), "run_id": f"bench-{i}", "mlflow.runName": f"bench-{i}"}


def _write_runs(uri: str, experiment: str, n: int, steps: int, api_runs: int) -> tuple[int, float]:
    """``n`` finished runs shaped like `suite run`'s: axis tags, params, metric histories.

    The first ``api_runs`` are written through `MlflowClient` (create, one `log_batch` per 1000
    metrics, terminate) and timed; the rest are copies of them made inside the sqlite store
    (rows of MLflow's run tables duplicated under new run ids, axis tags rewritten): a
    1,000-run store in seconds instead of many minutes on a busy machine. Returns
    (runs written through the API, their seconds)."""
    import random
    import sqlite3
    import uuid

    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from suite.report.data import HISTORY_KEYS, acc_key
    from suite.tracking.loggers import mlflow_metric_key

    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment(experiment)
    rng = random.Random(0)
    keys = [mlflow_metric_key(k) for k in (*HISTORY_KEYS, acc_key("arith"))]
    now = int(time.time() * 1000)
    cells = grid_cells(n)
    k = min(n, api_runs) if uri.startswith("sqlite:///") else n
    templates = []
    t0 = time.perf_counter()
    for i in range(k):
        tags = _run_tags(i, cells[i], experiment)
        run = client.create_run(exp_id, run_name=tags["mlflow.runName"], tags=tags)
        metrics = [Metric(key, rng.random(), now + s, s) for s in range(steps + 1) for key in keys]
        for j in range(0, len(metrics), 1000):  # MLflow's batch limit
            client.log_batch(run.info.run_id, metrics=metrics[j:j + 1000],
                             params=[Param("train.lr", "3e-05"), Param("steps", str(steps))] if j == 0 else [],
                             tags=[RunTag("suite.kind", "run")] if j == 0 else [])
        client.set_terminated(run.info.run_id, "FINISHED")
        templates.append(run.info.run_id)
    t_api = time.perf_counter() - t0
    if k == n:
        return k, t_api
    con = sqlite3.connect(uri[len("sqlite:///"):])
    try:
        cols = {t: [r[1] for r in con.execute(f"pragma table_info('{t}')")] for t in _CLONED_TABLES}
        for i in range(k, n):
            src, new = templates[i % k], uuid.uuid4().hex
            for t in _CLONED_TABLES:
                sel = ["?" if c == "run_uuid" else ("replace(artifact_uri, ?, ?)" if c == "artifact_uri" else c)
                       for c in cols[t]]
                params = []
                for c in cols[t]:
                    if c == "run_uuid":
                        params.append(new)
                    elif c == "artifact_uri":
                        params += [src, new]
                con.execute(f"insert into {t} ({', '.join(cols[t])}) select {', '.join(sel)} from {t} "
                            f"where run_uuid = ?", params + [src])
            tags = _run_tags(i, cells[i], experiment)
            con.execute("update runs set name = ? where run_uuid = ?", (tags["mlflow.runName"], new))
            con.executemany("update tags set value = ? where run_uuid = ? and key = ?",
                            [(v, new, key) for key, v in tags.items()])
        con.commit()
    finally:
        con.close()
    return k, t_api


def bench_report(n: int, steps: int, repeats: int, notebook: bool, tmp: str, api_runs: int = 50) -> list[dict]:
    try:
        import suite.report.cli  # noqa: F401
        import suite.report.data  # noqa: F401
    except ImportError as exc:
        return [{"item": "suite report", "n": n, "seconds": float("nan"), "per_item_ms": float("nan"),
                 "note": f"skipped: suite.report not available ({exc})"}]
    from suite.cli import main as suite_main
    from suite.report.data import HISTORY_KEYS

    uri = f"sqlite:///{os.path.join(tmp, 'mlflow-report.db')}"
    t0 = time.perf_counter()
    k, t_api = _write_runs(uri, "bench-report", n, steps, api_runs)
    t_write = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        out = os.path.join(tmp, f"report{r}")
        argv = ["report", "--experiment", "bench-report", "--tracking-uri", uri, "--out", out, "--no-log", "--quiet"]
        if not notebook:
            argv.append("--no-notebook")
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            rc = suite_main(argv)
        times.append(time.perf_counter() - t0)
        if rc != 0:
            raise RuntimeError(f"suite {' '.join(argv)} exited {rc}")
        note(f"  report: {n} runs in {times[-1]:.1f} s")
    s = median(times)
    return [
        {"item": "MLflow: write runs (MlflowClient)", "n": k, "seconds": t_api, "per_item_ms": 1e3 * t_api / k,
         "note": f"create + {steps + 1} steps x {len(HISTORY_KEYS) + 1} metrics + terminate, per run"},
        {"item": "store with the synthetic runs", "n": n, "seconds": t_write, "per_item_ms": 1e3 * t_write / n,
         "note": f"{k} runs through the API, {n - k} copied inside the sqlite store"},
        {"item": "suite report" + ("" if notebook else " --no-notebook"), "n": n, "seconds": s,
         "per_item_ms": 1e3 * s / n, "repeats": repeats, "note": "load runs + histories, tables, figures"
                                                                 + (", executed notebook" if notebook else "")},
    ]


# ----------------------------------------------------------------------------- command


def cmd_overheads(args) -> int:
    try:
        check_common(args)
        parts = parse_list("--parts", args.parts, PARTS)
        full = len(list(itertools.product(*grid().values())))
        for opt, v in (("--cells", args.cells), ("--runs", args.runs)):
            if not 1 <= v <= full:
                raise BenchError(f"{opt}={v} must be in 1..{full}")
        if args.report_steps < 1:
            raise BenchError(f"--report-steps={args.report_steps} must be >= 1")
        if args.api_runs < 1:
            raise BenchError(f"--api-runs={args.api_runs} must be >= 1")
        run_overrides = shlex.split(args.run_overrides)
        if "mlflow" in parts:
            from hydra.errors import HydraException
            from omegaconf.errors import OmegaConfBaseException

            from suite.config import ConfigError, compose_config

            try:
                compose_config(run_overrides)
            except (ConfigError, HydraException, OmegaConfBaseException) as exc:
                raise BenchError(f"--run-overrides {args.run_overrides!r}: {exc}") from None
    except BenchError as exc:
        note(f"benchmarks/overheads.py: {exc}")
        return 2
    set_threads(args.threads)
    tmp = tempfile.mkdtemp(prefix="suite-bench-overheads-")
    rows: list[dict] = []
    try:
        if "sweep" in parts:
            note(f"overheads: sweep of {args.cells} cells")
            rows += bench_sweep(args.cells, args.repeats, args.warmup, tmp)
        if "mlflow" in parts:
            note("overheads: MLflow logging share of a run")
            rows += bench_mlflow(run_overrides, args.repeats, tmp)
        if "report" in parts:
            note(f"overheads: suite report over {args.runs} runs")
            rows += bench_report(args.runs, args.report_steps, args.repeats, not args.no_notebook, tmp, args.api_runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    info = machine_info()
    notes = ["seconds: median of --repeats; per_item_ms: seconds / n; share_of_run: of the timed run's wall time"]
    ml = next((r for r in rows if r["item"].startswith("MLflow logging")), None)
    if ml is not None:
        notes.append(f"target MLflow logging <= 3% of a run's wall time: {100 * ml['share_of_run']:.2f}%")
    metrics = {f"overheads/{r['item']}/seconds".replace(" ", "_").replace("(", "").replace(")", "").replace("+", "and"):
               r["seconds"] for r in rows}
    params = {"parts": args.parts, "cells": args.cells, "run_overrides": args.run_overrides, "runs": args.runs,
              "report_steps": args.report_steps, "repeats": args.repeats, "notebook": not args.no_notebook}
    emit(args, "overheads", "overheads", info, rows, COLUMNS, notes, params, metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
