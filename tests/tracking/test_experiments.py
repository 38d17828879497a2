"""MLflow experiments and runs as the suite creates them: the experiment kind the UI needs to open
the runs table, MLflow's standard source/user/git tags, run names that tell runs apart."""

from __future__ import annotations

import getpass
import os
import subprocess

import pytest
from mlflow.tracking import MlflowClient

import suite
from suite.config import compose_config
from suite.identity import run_name
from suite.tracking.experiments import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    context_tags,
    create_run,
    UI_VIEW,
    experiment_id,
    suite_command,
    ui_hint,
    ui_link,
)

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")


@pytest.fixture
def client(tmp_path):
    return MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_a_created_experiment_is_a_model_training_one(client):
    exp = client.get_experiment(experiment_id(client, "new"))
    assert exp.tags[EXPERIMENT_KIND_TAG] == "custom_model_development" == EXPERIMENT_KIND


def test_an_existing_experiment_gets_the_kind_unless_it_has_one(client):
    bare = client.create_experiment("bare")
    genai = client.create_experiment("genai", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    assert experiment_id(client, "bare") == bare and experiment_id(client, "genai") == genai
    assert client.get_experiment(bare).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert client.get_experiment(genai).tags[EXPERIMENT_KIND_TAG] == "genai_development"  # the user's choice
    assert experiment_id(client, "absent", create=False) is None
    assert client.get_experiment_by_name("absent") is None


def test_a_run_carries_source_user_and_commit_and_its_own_tags_win(client):
    run = create_run(client, "e", run_name="r", tags={"algo": "grpo", "mlflow.source.name": "suite sweep x.yaml"})
    tags = run.data.tags
    assert tags["algo"] == "grpo" and tags["mlflow.source.name"] == "suite sweep x.yaml"
    assert tags["mlflow.user"] == (os.environ.get("MLFLOW_TRACKING_USERNAME") or getpass.getuser())
    assert tags["mlflow.source.type"] == "LOCAL" and run.info.run_name == "r"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(suite.__file__), capture_output=True,
                          text=True)
    if head.returncode == 0:
        assert tags["mlflow.source.git.commit"] == head.stdout.strip()


def test_outside_any_checkout_there_is_no_commit_tag(tmp_path, monkeypatch):
    import suite.tracking.experiments as ex

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ex, "__file__", str(tmp_path / "pkg" / "tracking" / "experiments.py"))
    ex._git_tags.cache_clear()
    try:
        assert "mlflow.source.git.commit" not in context_tags("suite run")
    finally:
        ex._git_tags.cache_clear()


@pytest.mark.parametrize("argv, want", [
    (["/venv/bin/suite", "run", "quant=fp8"], "suite run quant=fp8"),
    (["/repo/suite/__main__.py", "sweep", "experiments/quickstart.yaml"], "suite sweep experiments/quickstart.yaml"),
    (["/repo/suite/cli.py", "tune", "t.yaml"], "suite tune t.yaml"),  # python -m suite.cli
    (["/x/train.py", "--lr", "1"], "/x/train.py"),
    ([], "<console>"),
])
def test_the_source_name_is_the_command_a_user_typed(argv, want):
    assert suite_command(argv) == want


def test_run_names_show_model_steps_lr_and_the_axes_that_vary():
    cfg = compose_config(["quant=fp8", "model=small", "steps=40", "train.lr=1e-4", "seed=2"])
    assert run_name(cfg) == "grpo-fp8-acr-s1.5-arith-small-40steps-lr0.0001-seed2"
    # a sweep axis the name already shows adds nothing; any other is appended as key=value
    assert run_name(cfg, {"quant": "fp8", "seed": "2", "rollout.temperature": "1.5", "+tracking.tags.x": "y"}) == \
        "grpo-fp8-acr-s1.5-arith-small-40steps-lr0.0001-seed2 rollout.temperature=1.5 tracking.tags.x=y"
    aligned = compose_config(["quant=w4a16", "correction=tbpo", "correction.aligned_forward=true"])
    assert run_name(aligned).startswith("grpo-w4a16-tbpo+aligned-s1.5-")


# ---------------------------------------------------------------------------- the UI link


def _ui_bundle() -> str:
    import glob

    import mlflow

    js = os.path.join(os.path.dirname(mlflow.__file__), "server", "js", "build", "static", "js", "main.*.js")
    files = glob.glob(js)
    assert files, f"no MLflow UI bundle at {js}"
    return open(files[0], encoding="utf-8").read()


def test_the_installed_ui_reads_the_view_parameter_the_link_sets():
    # The link's `workflowType=machine_learning` is what this MLflow's UI reads from the URL to
    # choose its model-training view; when an upgrade renames it, this fails, not the users' links.
    key, value = UI_VIEW.split("=")
    bundle = _ui_bundle()
    assert f'get("{key}")' in bundle and f'MACHINE_LEARNING="{value}"' in bundle


@pytest.mark.slow
def test_a_link_to_a_run_in_a_file_store_names_the_command_and_the_page(client, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = create_run(client, "suite", run_name="r", tags={})
    e, r = run.info.experiment_id, run.info.run_id
    assert ui_link(uri, e) == f"http://127.0.0.1:5000/#/experiments/{e}?workflowType=machine_learning"
    assert ui_hint(uri, r) == (f"mlflow ui --backend-store-uri {uri}, then open "
                               f"http://127.0.0.1:5000/#/experiments/{e}/runs/{r}?workflowType=machine_learning")
    # no run, or one the store does not have: only the command (the summary line still prints)
    assert ui_hint(uri, None) == ui_hint(uri, "0" * 32) == f"mlflow ui --backend-store-uri {uri}"


def test_a_link_to_a_run_on_a_tracking_server_is_the_servers_own_page(mlflow_server_uri):
    import urllib.request

    client = MlflowClient(mlflow_server_uri)
    run = create_run(client, "suite-ui-link", run_name="r", tags={})
    link = ui_hint(mlflow_server_uri, run.info.run_id)
    assert link == (f"{mlflow_server_uri}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
                    "?workflowType=machine_learning")
    with urllib.request.urlopen(link.split("#")[0], timeout=30) as page:  # the UI's page is served there
        assert page.status == 200 and b"<html" in page.read(2000).lower()
    assert ui_hint(mlflow_server_uri + "/", None) == mlflow_server_uri + "/"


def test_a_link_to_a_run_on_a_dead_server_is_the_server_at_once():
    import time

    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    start = time.perf_counter()
    assert ui_hint(dead, "0" * 32) == dead
    assert time.perf_counter() - start < 30  # one try, not MLflow's minutes of retries
