"""The `MLflow UI:` link the suite prints opens the model-training runs table in a browser that
has never seen MLflow, where the bare experiment page opens the GenAI overview: a real `mlflow
server` and headless Debian chromium, driven as scripts/mlflow_screenshots.py drives it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from suite.tracking.experiments import create_run, ui_hint



@pytest.fixture(scope="module")
def browser() -> str:
    """Debian's chromium, installed with apt-get where it is missing and this is root (as the
    SLURM fixture installs slurm-wlm; ~1 min); skipped where neither is possible."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        got = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], env=env,
                             capture_output=True, text=True, timeout=1200)
        if got.returncode != 0:  # e.g. stale package lists
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
            got = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], env=env,
                                 capture_output=True, text=True, timeout=1200)
        found = shutil.which("chromium")
        if found is None:
            pytest.skip(f"apt-get could not install chromium: {(got.stdout + got.stderr)[-400:]}")
    if found is None:
        pytest.skip("needs Debian's chromium (apt-get install -y chromium)")
    return found


def _chromium():
    path = Path(__file__).resolve().parents[2] / "scripts" / "mlflow_screenshots.py"
    spec = importlib.util.spec_from_file_location("mlflow_screenshots", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Chromium


def _open(browser: str, url: str, ready: str) -> tuple[str, str]:
    """(final URL, page text) of `url` in a fresh browser profile, once `ready` holds."""
    b = _chromium()(browser, 1600, 900)
    try:
        b.goto(url)
        b.wait_for(ready, 120)
        return b.js("location.href"), b.js("document.body.innerText")
    finally:
        b.close()


@pytest.mark.slow
def test_the_printed_link_opens_the_training_runs_table(mlflow_server_uri, browser):
    client = MlflowClient(mlflow_server_uri)
    run = create_run(client, "suite-ui-browser", run_name="grpo-int8-acr-seed0", tags={})
    client.set_terminated(run.info.run_id)
    link = ui_hint(mlflow_server_uri, run.info.run_id)
    experiment_page = link.split("/runs/")[0] + "?workflowType=machine_learning"
    # the experiment's page in the training view: its runs table, with the run in it
    url, text = _open(browser, experiment_page, "document.querySelectorAll('.ag-row').length > 0")
    assert "/runs?" in url and "workflowType=machine_learning" in url and "grpo-int8-acr-seed0" in text
    # the run's own page: the training run view (its metrics tab), not a trace
    url, text = _open(browser, link, "document.body.innerText.includes('Model metrics')")
    assert run.info.run_id in url and "grpo-int8-acr-seed0" in text
    # without the parameter the same experiment (tagged as model training) opens on GenAI's overview
    url, text = _open(browser, link.split("/runs/")[0], "location.href.includes('workflowType=') && "
                                               "document.body.innerText.includes('Observability')")
    assert "workflowType=genai" in url and "grpo-int8-acr-seed0" not in text
