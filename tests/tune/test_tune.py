"""`suite tune` end to end: a small real study (tiny preset, local launcher, real MLflow and
Optuna sqlite stores), killed with SIGKILL mid-way, resumed, then reported.

Trial order is fixed by enqueuing the four configurations into the study before the first
`suite tune` (Optuna's `enqueue_trial`, a user feature the driver's `ask` honours), so the
one with a response budget too short to answer (4 tokens) runs after a good trial has completed and the
median pruner prunes it at its first evaluation: its held-out accuracy there is below the completed
trials', which sit at the warm start's accuracy (> 0, checked). Every number comes from
real runs; nothing is mocked.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest
from procs import kill_procs_naming
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from suite.config import compose_config
from suite.embedded.trainer import EmbeddedRun
from suite.tracking.loggers import read_jsonl

BASE = [
    "model=tiny", "steps=4", "eval_every=2", "ckpt_every=2", "task.n_eval=32", "task.difficulty=1",
    "rollout.prompts_per_step=2", "algo.group_size=4",
    # the warm start of tests/embedded/test_run.py: held-out accuracy > 0, so pruning is a real comparison
    "warm_start.steps=150", "warm_start.batch_size=32",
]
# A 4-token response budget cannot hold an answer ("8*12=96;#96"): held-out accuracy 0 at every
# evaluation, whatever the updates (a bad learning rate is not enough: GRPO groups that are all
# right or all wrong give no gradient, so two tiny steps may change nothing).
GOOD_TOK, BAD_TOK = 32, 4
# The good trials' UAQ scales differ by 0.1 %, so their held-out accuracies are the same (one
# prompt of 32 is 0.031, and with s = 1.0 / 1.5 / 2.0 the trajectories part by a prompt or two: on
# an AMX Xeon s = 2.0 fell one prompt below the median at step 2 and was pruned) and the median
# rule separates only the truncated trial. They are still distinct configs, run ids and trials.
ENQUEUED = [(1.0, GOOD_TOK), (1.001, GOOD_TOK), (1.25, BAD_TOK), (1.002, GOOD_TOK)]
PRUNED_TRIAL = 2
ACC = "val-core/arith/acc/mean@1"


def suite_tune(*args):
    return [sys.executable, "-m", "suite.cli", "tune", *args]


# ~3 min on a quiet 2-core machine; far longer when the cores are shared, hence the timeout.
pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def study_files(request):
    # Our own directory, not pytest's tmp_path: other pytest sessions on a shared machine rotate
    # pytest's base directories away, and trial jobs outlive a killed driver.
    root = Path(tempfile.mkdtemp(prefix="suite-tune-test-"))
    failed = request.session.testsfailed
    try:
        yield _study_files(root)
    finally:
        kill_procs_naming(root)
        if request.session.testsfailed == failed:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"tune test files kept for inspection: {root}")


def _study_files(root: Path) -> dict:
    cache = root / "warmstart-cache"
    uri = f"sqlite:///{root / 'mlflow.db'}"
    base = BASE + [f"warm_start.cache_dir={cache}", f"tracking.tracking_uri={uri}", "tracking.experiment=tune-test"]
    # The warm start once, here, rather than in two trial processes at the same time.
    cfg = compose_config(base + ["threads=1"])
    EmbeddedRun(cfg, str(root / "warm"), progress=False).build()
    db = root / "optuna.db"
    path = root / "tune.yaml"
    path.write_text(
        "study: small\n"
        f"storage: sqlite:///{db}\n"
        f"out_dir: {root / 'runs'}\n"
        f"base: {json.dumps(base)}\n"
        "space:\n"
        "  uaq.s: {type: float, low: 1.0, high: 2.0}\n"
        f"  rollout.max_new_tokens: {{type: categorical, choices: [{GOOD_TOK}, {BAD_TOK}]}}\n"
        f"objective: {{metric: {ACC}, direction: maximize}}\n"
        "n_trials: 4\nparallelism: 2\npoll_s: 0.5\n"
        "pruner: {name: median, n_startup_trials: 1, n_warmup_steps: 0}\n"
        "launcher: {name: local, timeout_min: 20, cpus_per_task: 1}\n"
    )
    study = optuna.create_study(study_name="small", storage=f"sqlite:///{db}", direction="maximize")
    for s, tok in ENQUEUED:
        study.enqueue_trial({"uaq.s": s, "rollout.max_new_tokens": tok})
    return {"root": root, "path": str(path), "storage": f"sqlite:///{db}", "uri": uri}


def load(files):
    return optuna.load_study(study_name="small", storage=files["storage"])


def states(files):
    return [t.state for t in load(files).get_trials(deepcopy=False)]


@pytest.fixture(scope="module")
def killed_and_resumed(study_files):
    root = study_files["root"]
    log1 = open(root / "first.log", "w")
    # its own process group: the kill below takes the driver and the trial jobs it started, as a
    # closed terminal or a dead machine would, so the trial in flight stays RUNNING (a job left
    # alive could finish it and leave the second driver nothing to resume)
    first = subprocess.Popen(suite_tune(study_files["path"]), stdout=log1, stderr=subprocess.STDOUT,
                             start_new_session=True)
    deadline = time.monotonic() + 900  # ~1 min on a quiet 2-core machine
    try:
        while True:  # kill once a trial has completed and others are running
            st = states(study_files)
            if st.count(TrialState.COMPLETE) >= 1 and st.count(TrialState.RUNNING) >= 1:
                break
            assert first.poll() is None, (root / "first.log").read_text()
            assert time.monotonic() < deadline, "no trial completed in time"
            time.sleep(0.5)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        log1.close()
    at_kill = states(study_files)
    second = subprocess.run(suite_tune(study_files["path"]), capture_output=True, text=True, timeout=600)
    return {"at_kill": at_kill, "second": second, **study_files}


def test_kill_resume_no_duplicates_and_pruned_in_both(killed_and_resumed):
    r = killed_and_resumed
    assert r["second"].returncode == 0, r["second"].stdout + r["second"].stderr
    # the kill landed mid-way: some trial was left RUNNING, and the second driver resumed it
    assert TrialState.RUNNING in r["at_kill"] and TrialState.COMPLETE in r["at_kill"]
    assert "left running by an interrupted `suite tune`; resuming it" in r["second"].stdout

    study = load(r)
    trials = study.get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert [(t.params["uaq.s"], t.params["rollout.max_new_tokens"]) for t in trials] == ENQUEUED
    want = [TrialState.PRUNED if n == PRUNED_TRIAL else TrialState.COMPLETE for n in range(4)]
    assert [t.state for t in trials] == want
    good = [t for t in trials if t.state == TrialState.COMPLETE]
    assert min(t.value for t in good) > 0  # the pruning below was a real comparison, not a tie
    pruned = trials[PRUNED_TRIAL]
    assert list(pruned.intermediate_values) == [2]  # stopped at its first evaluation (step 2 of 4)
    # the median rule: below the median of the completed trials at that step
    assert pruned.value == pruned.intermediate_values[2] < min(t.intermediate_values[2] for t in good)
    for t in good:
        assert sorted(t.intermediate_values) == [2, 4]
        assert t.value == t.intermediate_values[4]

    client = MlflowClient(tracking_uri=r["uri"])
    exp = client.get_experiment_by_name("tune-test")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.tune_study = 'small'", max_results=100)
    parents = [x for x in runs if x.data.tags.get("tune_role") == "study"]
    assert len(parents) == 1
    parent = parents[0].info.run_id
    assert study.user_attrs["mlflow_parent_run_id"] == parent
    children = [x for x in runs if x.data.tags.get("tune_role") != "study"]
    assert sorted(int(x.data.tags["trial"]) for x in children) == [0, 1, 2, 3]  # one each: no duplicates
    by_trial = {int(x.data.tags["trial"]): x for x in children}
    for t in trials:
        run = by_trial[t.number]
        assert run.data.tags["mlflow.parentRunId"] == parent
        assert run.info.run_id == t.user_attrs["mlflow_run_id"]
        assert run.data.tags["trial_state"] == t.state.name
        assert run.info.run_name.startswith(f"small trial {t.number}: ") and "uaq.s=" in run.info.run_name
        assert Path(run.data.tags["job_log"]).is_file()  # where the trial's output went
        assert run.data.tags["mlflow.source.name"].startswith("suite tune ")
        assert float(run.data.params["uaq.s"]) == t.params["uaq.s"]  # the run used the trial's values
        assert int(run.data.params["rollout.max_new_tokens"]) == t.params["rollout.max_new_tokens"]
        hist = client.get_metric_history(run.info.run_id, "val-core/arith/acc/mean_at_1")
        steps = [m.step for m in hist]
        assert len(steps) == len(set(steps))  # no step logged twice across the kill
        run_dir = t.user_attrs["run_dir"]
        jsteps = [e["step"] for e in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))]
        assert jsteps == list(range(0, 3 if t.number == PRUNED_TRIAL else 5))
        if t.number == PRUNED_TRIAL:
            assert run.info.status == "KILLED" and run.data.tags["pruned"] == "true"
            assert run.data.tags["pruned_step"] == "2"
            with open(os.path.join(run_dir, "summary.json")) as fh:
                assert json.load(fh)["pruned"] is True
        else:
            assert run.info.status == "FINISHED" and "pruned" not in run.data.tags
            by_step = {m.step: m.value for m in hist}
            assert sorted(by_step) == [0, 2, 4]
            assert (by_step[2], by_step[4]) == (t.intermediate_values[2], t.intermediate_values[4])

    # a third run has nothing to do and creates nothing
    third = subprocess.run(suite_tune(r["path"]), capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr
    assert "started" not in third.stdout
    assert len(load(r).get_trials()) == 4
    assert len(client.search_runs([exp.experiment_id], filter_string="tags.tune_study = 'small'")) == 5


def test_report_figures_table_and_mlflow(killed_and_resumed):
    r = killed_and_resumed
    p = subprocess.run(suite_tune(r["path"], "--report"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rdir = r["root"] / "runs" / "small" / "report"
    for name in ("history.png", "importances.png", "intermediate.png", "slice.png", "contour.png"):
        assert (rdir / name).stat().st_size > 10_000, name  # a drawn figure, not an empty canvas
    study = load(r)
    best = json.loads((rdir / "best.json").read_text())
    assert best["number"] == study.best_trial.number and best["value"] == study.best_value
    lines = (rdir / "trials.md").read_text().splitlines()
    assert len(lines) == 2 + 4 and "| 2 | PRUNED |" in lines[2 + PRUNED_TRIAL]
    imp = (rdir / "importances.csv").read_text().splitlines()
    assert imp[0] == "param,importance" and {ln.split(",")[0] for ln in imp[1:]} == {"uaq.s", "rollout.max_new_tokens"}
    assert abs(sum(float(ln.split(",")[1]) for ln in imp[1:]) - 1.0) < 1e-9  # normalised importances
    client = MlflowClient(tracking_uri=r["uri"])
    parent = study.user_attrs["mlflow_parent_run_id"]
    arts = {a.path for a in client.list_artifacts(parent, "tune_report")}
    assert {"tune_report/history.png", "tune_report/importances.png", "tune_report/trials.csv"} <= arts
    run = client.get_run(parent)
    assert run.data.metrics["best_value"] == study.best_value
    assert run.data.tags["best_trial"] == str(study.best_trial.number)
