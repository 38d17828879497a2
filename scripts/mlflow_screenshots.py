"""Screenshots of the MLflow UI on runs the suite made: the runs table, one run, the compare view.

    python scripts/mlflow_screenshots.py --out docs/img          # ~3 min on 2 cores

Needs Debian's chromium (`apt-get install -y chromium`; a browser downloaded by pip cannot reach
its CDN here). It runs a 4-cell tiny sweep (bf16 / int8 x seed 0 / 1, no warm start, 6 steps)
into a fresh store in a temporary directory, starts a real `mlflow server` on 127.0.0.1 (its own
process group, stopped by its PID), and drives headless chromium over its DevTools pipe
(`--remote-debugging-pipe`: no extra package), so a page is taken once its content is there and
after the clicks a user would make:

- `mlflow_runs_table.png`: the experiment's page on the runs table. The experiment carries
  `mlflow.experimentKind=custom_model_development`; MLflow 3.17's UI also has a global
  "GenAI | Model training" switch (remembered by the browser, GenAI at first), which the links
  set with `?workflowType=machine_learning`, as a click on "Model training" does and as the links
  `suite run` / `suite sweep` print do (docs/sweeps.md). The table nests the sweep's cells under
  its parent run `shots`; the script clicks its "+" to list them, and closes the assistant panel,
- `mlflow_run.png`: one cell's run page (its name, source, git commit, params, tags),
- `mlflow_compare.png`: the compare view of the four cells.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
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


class Chromium:
    """Headless chromium driven over its DevTools pipe: with --remote-debugging-pipe it reads
    JSON commands from fd 3 and writes replies and events to fd 4, each message ending in NUL."""

    def __init__(self, browser: str, width: int, height: int):
        self.profile = tempfile.mkdtemp(prefix="suite-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()

        def fds():  # in the child, before exec: the pipe ends become fds 3 and 4
            a, b = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        os.close(cmd_r)
        os.close(out_w)
        self._buf, self._id, self.session = b"", 0, None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.call("Page.enable")

    def call(self, method: str, timeout: float = 60, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.",)):
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
            if time.monotonic() > deadline:
                raise TimeoutError(method)
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buf += chunk

    def js(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:60]}...: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        probe = f"(() => {{ try {{ return !!({expression}); }} catch (e) {{ return false; }} }})()"
        while not self.js(probe):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never had: {expression}")
            time.sleep(0.25)

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def screenshot(self, path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        open(path, "wb").write(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def shoot(b: Chromium, url: str, out: Path, ready: str, *, clicks: tuple[str, ...] = ()) -> None:
    """Open `url`, wait until the page's JavaScript expression `ready` holds, run each of `clicks`
    (a JavaScript expression that clicks something and returns a condition to wait for, or ''),
    close the UI's assistant panel when it is open, and save the page as `out`."""
    b.goto(url)
    b.wait_for(ready, 120)
    for click in clicks:
        cond = b.js(click)
        if cond:
            b.wait_for(cond, 60)
    b.js("document.querySelector('button[aria-label=Close]')?.click()")
    time.sleep(1.5)  # let the table settle after the last layout change
    b.screenshot(out)
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
        ml = "workflowType=machine_learning"  # the view the suite's printed links open (ui_link)
        b = Chromium(browser, 1900, 900)
        try:
            # the table nests the cells under the sweep's parent run: open it ("+" in its row)
            expand = ("(() => { const a = Array.from(document.querySelectorAll('a'))"
                      ".find(x => x.innerText === 'shots');"
                      " a.closest('.ag-row').querySelector('button').click();"
                      f" return \"document.body.innerText.includes('{cells[0].info.run_name}')\"; }})()")
            shoot(b, f"{base}/#/experiments/{e}/runs?{ml}", out / "mlflow_runs_table.png",
                  "document.body.innerText.includes('shots')", clicks=(expand,))
            shoot(b, f"{base}/#/experiments/{e}/runs/{cells[0].info.run_id}?{ml}", out / "mlflow_run.png",
                  f"document.body.innerText.includes('{cells[0].info.run_name}') && "
                  "document.body.innerText.includes('Parameters')")
            shoot(b, f"{base}/#/compare-runs?runs={urllib.request.quote(ids)}&experiments="
                     f"{urllib.request.quote(json.dumps([e]))}&{ml}", out / "mlflow_compare.png",
                  f"document.body.innerText.includes('{cells[-1].info.run_name}')")
        finally:
            b.close()
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
