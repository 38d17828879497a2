"""Screenshots of the MLflow UI on runs the suite made: the runs table, one run, the compare view.

    python scripts/mlflow_screenshots.py --out docs/img          # ~3 min on 2 cores

Needs Debian's chromium (`apt-get install -y chromium`; a browser downloaded by pip cannot reach
its CDN here). It runs a 4-cell tiny sweep (bf16 / int8 x seed 0 / 1, no warm start, 6 steps)
into a fresh store in a temporary directory, starts a real `mlflow server` on 127.0.0.1 (its own
process group, stopped by its PID), and takes each page with `chromium --headless --screenshot`:

- `mlflow_runs_table.png`: the experiment's page on the runs table. The experiment carries
  `mlflow.experimentKind=custom_model_development`; MLflow 3.17's UI also has a global
  "GenAI | Model training" switch (remembered by the browser, GenAI at first), which the links
  set with `?workflowType=machine_learning`, as a click on "Model training" does (docs/sweeps.md),
  The table nests the sweep's cells under its parent run `shots` (a click on "+" lists them; a
  headless screenshot cannot click),
- `mlflow_run.png`: one cell's run page (its name, source, git commit, params, tags),
- `mlflow_compare.png`: the compare view of the four cells.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SWEEP = """\
# suite sweep shots.yaml   (scripts/mlflow_screenshots.py; Laptop ~2 min, Cluster n/a)
name: shots
description: the MLflow UI screenshots of docs/img
base: [model=tiny, steps=6, eval_every=3, ckpt_every=3, task.n_eval=16, rollout.prompts_per_step=2,
       algo.group_size=4, rollout.max_new_tokens=16, warm_start.steps=0, threads=1]
matrix:
  quant: [bf16, int8]
  seed: [0, 1]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("mlflow_screenshots: no chromium on PATH; install it with `apt-get install -y chromium`")


def shoot(browser: str, url: str, out: Path, size: str = "1600,1000", wait_ms: int = 20000) -> None:
    """One page, rendered headless until the page's scripts have had `wait_ms` of virtual time."""
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={size}", f"--virtual-time-budget={wait_ms}", f"--screenshot={out}", url],
                   check=True, capture_output=True, timeout=180)
    print(f"  {out} ({out.stat().st_size // 1024} KiB)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "docs" / "img"))
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    browser = _browser()
    work = Path(tempfile.mkdtemp(prefix="suite-shots-"))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "SUITE_CACHE": str(work / "cache"), "OMP_NUM_THREADS": "1"}
    (work / "shots.yaml").write_text(SWEEP)
    print(f"sweep into {uri} ...", flush=True)
    subprocess.run([sys.executable, "-m", "suite.cli", "sweep", "shots.yaml"], cwd=work, env=env, check=True)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("suite")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    cells = [r for r in runs if r.data.tags.get("suite.kind") != "sweep"]
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
                               "--default-artifact-root", str(work / "artifacts"), "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1"],
                              cwd=work, env=env, stdout=open(work / "server.log", "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"mlflow server did not start; see {work / 'server.log'}")
                time.sleep(1)
        e = exp.experiment_id
        ids = json.dumps([r.info.run_id for r in cells])
        ml = "workflowType=machine_learning"
        # the cells by name; the table still nests them under the sweep's parent run ("+" opens it)
        cells_only = urllib.request.quote("attributes.run_name LIKE 'grpo%'")
        shoot(browser, f"{base}/#/experiments/{e}/runs?{ml}&searchFilter={cells_only}", out / "mlflow_runs_table.png",
              size="1900,900")
        shoot(browser, f"{base}/#/experiments/{e}/runs/{cells[0].info.run_id}?{ml}", out / "mlflow_run.png")
        shoot(browser, f"{base}/#/compare-runs?runs={urllib.request.quote(ids)}&experiments="
                       f"{urllib.request.quote(json.dumps([e]))}&{ml}", out / "mlflow_compare.png")
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server's own group: gunicorn/uvicorn workers too
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
