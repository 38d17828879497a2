"""Benchmark (a script, not a test): `suite report` over N synthetic runs in a sqlite store.

    python benchmarks/report_store.py --runs 1000 --steps 50 --dir /tmp/report-bench

Writes N runs shaped like the trainer's (axes tags, ~60 params, the metric keys the report
reads at every step, MLflow statuses with ~3% FAILED and ~2% RUNNING) with one `log_batch`
per 1,000 values, then times `load_runs` (paged search + bulk history), every table, every
figure and, with --notebook, the executed notebook. It also times the naive alternative,
one `get_metric_history` request per run and key, on a sample of runs and extrapolates.
A store left in --dir by an earlier call with the same N and steps is reused.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np


def write_runs(uri: str, n_runs: int, steps: int, seed: int = 0) -> float:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from suite.report.data import HISTORY_KEYS, acc_key

    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("bench")
    rng = np.random.default_rng(seed)
    grid = list(itertools.product(("bf16", "int8", "fp8", "w4a16"), ("naive", "tis", "acr"), ("1", "1.25", "1.5", "2"),
                                  ("tiny", "small")))
    t0 = time.perf_counter()
    for i in range(n_runs):
        prec, corr, s, model = grid[i % len(grid)]
        seed_i = i // len(grid)
        tags = {"backend": "embedded", "precision": prec, "correction": corr, "uaq_s": s, "algo": "grpo",
                "task": "arith", "model": model, "aligned_forward": "false", "seed": str(seed_i),
                "run_id": f"bench-{i}", "trainer_dtype": "fp32", "sweep": "bench", "cell": str(i)}
        run = client.create_run(exp, run_name=f"bench-{i}", tags=tags)
        rid = run.info.run_id
        params = [Param(f"group{j // 10}.key{j}", str(j)) for j in range(58)]
        params += [Param("train.lr", "3e-05"), Param("steps", str(steps))]
        ts = 1_700_000_000_000 + i * 10_000
        metrics = []
        base = {"bf16": 0.6, "int8": 0.55, "fp8": 0.57, "w4a16": 0.5}[prec]
        for step in range(steps + 1):
            if step == 0 or step % 10 == 0 or step == steps:
                metrics.append(Metric(acc_key("arith"), float(np.clip(base + 0.05 * rng.standard_normal(), 0, 1)),
                                      ts + step, step))
            if step == 0:
                continue
            for key in HISTORY_KEYS:
                metrics.append(Metric(key, float(abs(rng.standard_normal())), ts + step, step))
        for j in range(0, len(params), 100):
            client.log_batch(rid, params=params[j : j + 100])
        for j in range(0, len(metrics), 1000):
            client.log_batch(rid, metrics=metrics[j : j + 1000])
        r = rng.random()
        if r < 0.03:
            client.set_terminated(rid, "FAILED")
        elif r >= 0.05:
            client.set_terminated(rid, "FINISHED")
        if (i + 1) % 100 == 0:
            print(f"  wrote {i + 1}/{n_runs} runs ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--dir", default="/tmp/suite-report-bench")
    ap.add_argument("--notebook", action="store_true", help="also execute the notebook (adds kernel start-up)")
    ap.add_argument("--naive-sample", type=int, default=50, help="runs timed with one request per run and key")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    from mlflow.tracking import MlflowClient

    from suite.report import data as D
    from suite.report.build import write_report

    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    db = d / f"bench-{args.runs}x{args.steps}.db"
    uri = f"sqlite:///{db}"
    res: dict = {"runs": args.runs, "steps": args.steps}
    done = d / f"bench-{args.runs}x{args.steps}.done"
    if not done.exists():  # a store cut short by an interrupted write is rebuilt
        db.unlink(missing_ok=True)
        print(f"writing {args.runs} runs x {args.steps} steps to {uri} ...", file=sys.stderr)
        res["write_s"] = write_runs(uri, args.runs, args.steps)
        done.write_text("ok\n")
    t = time.perf_counter()
    client = MlflowClient(tracking_uri=uri)
    client.search_experiments(max_results=1)
    res["store_open_s"] = time.perf_counter() - t

    # Wall seconds on a shared machine depend on the other load; CPU seconds of this process
    # (time.process_time) are reported beside them.
    t, c = time.perf_counter(), time.process_time()
    data = D.load_runs(uri, experiment="bench", quiet=False)
    res["load_runs_s"] = time.perf_counter() - t
    res["load_runs_cpu_s"] = time.process_time() - c
    res["load_runs_parts_s"] = data.timings_s
    res["history_rows"] = len(data.history)
    t, c = time.perf_counter(), time.process_time()
    out = write_report(data, d / "report", notebook=args.notebook, quiet=False)
    res["write_report_s"] = time.perf_counter() - t
    res["write_report_cpu_s"] = time.process_time() - c  # the notebook's kernel is another process
    res["write_report_parts_s"] = {k: v for k, v in out["timings_s"].items() if k not in data.timings_s}
    res["status"] = out["status"]

    # The alternative the bulk read replaces: one request per run and metric key.
    sample = data.runs["mlflow_run_id"].head(args.naive_sample).tolist()
    t = time.perf_counter()
    n_req = 0
    for rid in sample:
        for key in D.HISTORY_KEYS:
            client.get_metric_history(rid, key)
            n_req += 1
    naive = time.perf_counter() - t
    res["naive_per_request_s"] = naive / n_req
    res["naive_extrapolated_s"] = naive / n_req * args.runs * (len(D.HISTORY_KEYS) + 1)
    print(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
