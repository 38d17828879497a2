"""Benchmark (a script, not a test): reading the report's metric histories, every way there is.

    python benchmarks/report_history.py --runs 200 --steps 50 --dir /tmp/suite-history-bench

Builds a sqlite store of N synthetic runs shaped like the trainer's (benchmarks/report_store.py:
the keys the report reads at every step), each with a `metrics.jsonl` artifact holding the same
values (the trainer logs one at the end of a run), then reads every history through:

- `sql`: one SELECT on MLflow's metrics table (suite.report.history; tested MLflow versions only),
- `client xT`: MLflow's public `get_metric_history`, one call per run and key, on T threads,
- `jsonl x8`: each run's `metrics.jsonl` artifact downloaded with the public client and parsed.

Each path's values are checked equal to the SQL path's, and the table shows wall seconds and the
ratio to `sql`, side by side in one process, interleaved over `--repeats`, median reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per run would bury the table


def add_jsonl_artifacts(client, uri: str) -> None:
    """Each run's history as the trainer's metrics.jsonl, logged as its artifact."""
    from suite.report import history as H
    from suite.report.data import HISTORY_KEYS

    runs = client.search_runs([client.get_experiment_by_name("bench").experiment_id], max_results=50000)
    ids = [r.info.run_id for r in runs]
    keys = [*HISTORY_KEYS, "val-core/arith/acc/mean_at_1"]
    df, _ = H.read_history(client, ids, keys, source="sql")
    with tempfile.TemporaryDirectory() as tmp:
        for rid, g in df.groupby("mlflow_run_id"):
            path = Path(tmp) / rid / "metrics.jsonl"
            path.parent.mkdir()
            with open(path, "w") as fh:
                for step, s in g.groupby("step"):
                    row = {"step": int(step), "time": 0.0, "metrics": dict(zip(s["key"], s["value"]))}
                    fh.write(json.dumps(row) + "\n")
            client.log_artifact(rid, str(path))


def read_jsonl_artifacts(client, run_ids: list[str], keys: list[str], threads: int = 8) -> dict:
    from suite.tracking.jsonl import read_jsonl

    want = set(keys)

    def one(rid):
        with tempfile.TemporaryDirectory() as tmp:
            local = client.download_artifacts(rid, "metrics.jsonl", tmp)
            return [(rid, e["step"], k, v) for e in read_jsonl(local) for k, v in e["metrics"].items() if k in want]

    rows = []
    with ThreadPoolExecutor(threads) as ex:
        for part in ex.map(one, run_ids):
            rows += part
    return {(r, int(s), k): float(v) for r, s, k, v in rows}


def _values(df) -> dict:
    cols = df[["mlflow_run_id", "step", "key", "value"]]
    return {(r, int(s), k): float(v) for r, s, k, v in cols.itertuples(index=False)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--dir", default="/tmp/suite-history-bench")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from report_store import write_runs
    from mlflow.tracking import MlflowClient

    from suite.report import history as H
    from suite.report.data import HISTORY_KEYS

    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    db, done = d / f"hist-{args.runs}x{args.steps}.db", d / f"hist-{args.runs}x{args.steps}.done"
    uri = f"sqlite:///{db}"
    if not done.exists():
        db.unlink(missing_ok=True)
        print(f"writing {args.runs} runs x {args.steps} steps (+ metrics.jsonl artifacts) to {uri} ...",
              file=sys.stderr)
        write_runs(uri, args.runs, args.steps)
        add_jsonl_artifacts(MlflowClient(uri), uri)
        done.write_text("ok\n")
    client = MlflowClient(uri)
    ids = [r.info.run_id for r in client.search_runs([client.get_experiment_by_name("bench").experiment_id],
                                                      max_results=50000)]
    keys = [*HISTORY_KEYS, "val-core/arith/acc/mean_at_1"]
    paths = {
        "sql": lambda: _values(H.read_history(client, ids, keys, source="sql")[0]),
        "client x8": lambda: _values(H._history_client(client, ids, keys, threads=8)),
        "client x1": lambda: _values(H._history_client(client, ids, keys, threads=1)),
        "jsonl x8": lambda: read_jsonl_artifacts(client, ids, keys, threads=8),
    }
    times: dict[str, list[float]] = {k: [] for k in paths}
    ref = None
    for _ in range(args.repeats):
        for name, fn in paths.items():  # interleaved: every path sees the same machine load
            t = time.perf_counter()
            got = fn()
            times[name].append(time.perf_counter() - t)
            if ref is None:
                ref = got
            assert got.keys() == ref.keys() and all(got[k] == ref[k] or got[k] != got[k] for k in ref), name
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.runs} runs x {len(keys)} keys x {args.steps} steps = {len(ref)} values; median of {args.repeats}")
    print(f"{'path':<12} {'wall s':>8} {'x sql':>7}")
    for name, t in med.items():
        print(f"{name:<12} {t:>8.2f} {t / med['sql']:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
