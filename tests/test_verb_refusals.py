"""Refusals that depend on what is on disk or around the machine, a class per verb: each case
builds its inputs in an empty working directory, runs the verb through the CLI's entry point,
and asserts exit 2, a message naming the thing refused, no traceback, and nothing created or
changed (every file's bytes and every directory's listing compared before and after, the MLflow
store included). The flag and file tables are tests/test_bad_inputs.py (`suite run`) and
tests/test_bad_inputs_verbs.py; docs/architecture.md, "What each verb refuses", counts all three
(scripts/refusals_table.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from suite.cli import main

TINY = ["model=tiny", "steps=1", "eval_every=1", "ckpt_every=1", "task.n_eval=4", "warm_start.steps=0", "threads=1"]


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` -> its content's SHA-256 (files) or "dir"."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


def refused(work: Path, argv: list[str], names: list[str], capsys, *, may_lock: bool = False) -> str:
    """`may_lock`: the run dir exists already and the refusal came while its writer lock was held;
    the lock's file (empty, suite.tracking.lock) stays, as after every run."""
    capsys.readouterr()  # what setting the case up printed
    before = snapshot(work)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    for n in names:
        assert n in err, (n, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    after = snapshot(work)
    if may_lock:
        after = {k: v for k, v in after.items() if not (k.endswith("/run.lock") and k not in before and v == EMPTY)}
    assert after == before, err
    return err


EMPTY = hashlib.sha256(b"").hexdigest()


@pytest.fixture
def work(empty_cwd):
    return empty_cwd / "work"


def _store(work: Path) -> str:
    """A real sqlite MLflow store with one finished run (what 'MLflow unchanged' compares)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("suite"), run_name="earlier")
    client.set_terminated(run.info.run_id)
    return uri


def _no_slurm(work: Path, monkeypatch) -> None:
    """sbatch and scontrol are installed here; a configuration that names no cluster is what a
    machine without SLURM set up has (an empty slurm.conf fails at once, a missing one after a
    minute of retries)."""
    conf = work.parent / "slurm.conf"
    conf.write_text("")
    monkeypatch.setenv("SLURM_CONF", str(conf))


class TestRun:
    def test_out_dir_is_a_file(self, work, capsys):
        (work / "runs").write_text("x")
        refused(work, ["run", *TINY, "out_dir=runs"], ["out_dir", "is a file, not a directory"], capsys)

    def test_out_dir_name_too_long(self, work, capsys):
        refused(work, ["run", *TINY, f"out_dir={'r' * 300}"], ["out_dir", "300 bytes", "allows 255"], capsys)

    def test_store_file_not_writable_directory(self, work, capsys):
        (work / "db").write_text("x")
        refused(work, ["run", *TINY, f"tracking.tracking_uri=sqlite:///{work / 'db' / 'mlflow.db'}"],
                ["tracking.tracking_uri", "is a file, not a directory"], capsys)

    def test_checkpoints_none_of_which_can_be_read(self, work, capsys):
        from suite.config import compose_config, run_id

        argv = [*TINY, f"out_dir={work / 'runs'}", f"tracking.tracking_uri={_store(work)}",
                f"warm_start.cache_dir={work / 'cache'}"]
        ck = work / "runs" / run_id(compose_config(argv)) / "checkpoints"
        ck.mkdir(parents=True)
        (ck / "step_00000001.pt").write_bytes(b"")  # cut short before its first byte
        (work / "cache").mkdir()
        refused(work, ["run", *argv], ["cannot resume", "none of the 1 checkpoints", "can be read"], capsys,
                may_lock=True)


    def test_warm_start_cache_is_a_file(self, work, capsys):
        (work / "cache").write_text("x")
        refused(work, ["run", "--warm-start-only", *TINY, f"warm_start.cache_dir={work / 'cache' / 'ws'}"],
                ["--warm-start-only", "warm_start.cache_dir", "is a file, not a directory"], capsys)


class TestSweep:
    def test_slurm_without_a_configuration(self, work, capsys, monkeypatch):
        _no_slurm(work, monkeypatch)
        (work / "s.yaml").write_text("name: s\nbase: [" + ", ".join(TINY) + "]\nmatrix: {seed: [0]}\n")
        refused(work, ["sweep", "s.yaml", "launcher=slurm", "cluster=cpu"],
                ["launcher=slurm", "`scontrol ping` reaches no SLURM controller", "launcher=local"], capsys)

    def test_a_store_that_does_not_answer(self, work, capsys):
        from mlflow_server import free_port

        (work / "s.yaml").write_text("name: s\nbase: [" + ", ".join(TINY) + "]\nmatrix: {seed: [0]}\n")
        uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        refused(work, ["sweep", "s.yaml", f"tracking.tracking_uri={uri}"],
                [f"the MLflow tracking server at {uri} does not answer", "suite sweep needs it"], capsys)


class TestTune:
    def test_slurm_without_a_configuration(self, work, capsys, monkeypatch):
        _no_slurm(work, monkeypatch)
        (work / "t.yaml").write_text(
            "study: t\nstorage: sqlite:///optuna.db\nout_dir: runs\nbase: [" + ", ".join(TINY) + "]\n"
            "objective: {metric: val-core/arith/acc/mean@1, direction: maximize}\nn_trials: 1\n"
            "launcher: {name: slurm, profile: cpu}\nspace:\n  uaq.s: {type: float, low: 1.0, high: 2.0}\n")
        refused(work, ["tune", "t.yaml"], ["`scontrol ping` reaches no SLURM controller"], capsys)

    def test_a_store_that_does_not_answer(self, work, capsys):
        from mlflow_server import free_port

        uri = f"http://127.0.0.1:{free_port()}"
        (work / "t.yaml").write_text(
            "study: t\nstorage: sqlite:///optuna.db\nout_dir: runs\nbase: [" + ", ".join(TINY) +
            f", 'tracking.tracking_uri={uri}']\n"
            "objective: {metric: val-core/arith/acc/mean@1, direction: maximize}\nn_trials: 1\n"
            "space:\n  uaq.s: {type: float, low: 1.0, high: 2.0}\n")
        refused(work, ["tune", "t.yaml"], [f"the MLflow tracking server at {uri} does not answer"], capsys)

    def test_a_storage_directory_that_is_a_file(self, work, capsys):
        (work / "db").write_text("x")
        (work / "t.yaml").write_text(
            "study: t\nstorage: sqlite:///db/optuna.db\nout_dir: runs\nbase: [" + ", ".join(TINY) + "]\n"
            "objective: {metric: val-core/arith/acc/mean@1, direction: maximize}\nn_trials: 1\n"
            "space:\n  uaq.s: {type: float, low: 1.0, high: 2.0}\n")
        refused(work, ["tune", "t.yaml"], ["storage sqlite:///", "is a file, not a directory"], capsys)


class TestReport:
    def test_out_is_a_file(self, work, capsys):
        _store(work)
        (work / "out").write_text("x")
        refused(work, ["report", "--experiment", "suite", "--out", "out"], ["--out out", "not a directory"], capsys)

    def test_out_holds_something_else(self, work, capsys):
        _store(work)
        (work / "out").mkdir()
        (work / "out" / "notes.md").write_text("mine")
        refused(work, ["report", "--experiment", "suite", "--out", "out"],
                ["--out out", "not a `suite report`", "--force"], capsys)

    def test_a_store_that_does_not_answer(self, work, capsys):
        from mlflow_server import free_port

        uri = f"http://127.0.0.1:{free_port()}"
        refused(work, ["report", "--tracking-uri", uri, "--out", "out"], [uri, "does not answer"], capsys)


def _embedded_run(work: Path, checkpoints: dict[int, dict | bytes] = {}) -> Path:  # noqa: B006 - read only
    """A run dir with the config of TINY and, per step, a checkpoint of that state (a dict) or
    those bytes (a damaged file): what export and eval read, without training anything."""
    from omegaconf import OmegaConf

    from suite.config import compose_config
    from suite.tracking.checkpoint import checkpoint_path, save_checkpoint

    run = work / "run"
    run.mkdir()
    OmegaConf.save(compose_config([*TINY, f"warm_start.cache_dir={work / 'cache'}"]), run / "config.yaml")
    for step, state in checkpoints.items():
        if isinstance(state, dict):
            save_checkpoint(run, step, state, keep_last=10)
        else:
            checkpoint_path(run, step).parent.mkdir(parents=True, exist_ok=True)
            checkpoint_path(run, step).write_bytes(state)
    return run


class TestExport:
    def test_a_run_without_checkpoints(self, work, capsys):
        _embedded_run(work)
        refused(work, ["export", "--run", "run", "--out", "out"], ["--run run: holds no checkpoint"], capsys)

    def test_a_damaged_newest_checkpoint_is_named_not_passed_over(self, work, capsys):
        _embedded_run(work, {1: {"actor": {}}, 2: b"cut short"})
        refused(work, ["export", "--run", "run", "--out", "out"],
                ["step_00000002.pt (step 2) cannot be read", "--step 1"], capsys)

    def test_a_checkpoint_record_missing_its_state(self, work, capsys):
        import torch

        from suite.tracking.checkpoint import checkpoint_path

        run = _embedded_run(work, {1: {"actor": {}}})
        torch.save({"format": 1, "step": 2}, checkpoint_path(run, 2))  # what a foreign writer might leave
        refused(work, ["export", "--run", "run", "--out", "out"], ["step_00000002.pt", "state: field required"],
                capsys)

    def test_a_checkpoint_of_another_model(self, work, capsys):
        _embedded_run(work, {1: {"actor": {"layers.0.nosuch": __import__("torch").zeros(1)}}})
        refused(work, ["export", "--run", "run", "--out", "out"], ["its checkpoint does not fit model=tiny"], capsys)

    def test_a_step_that_is_not_there(self, work, capsys):
        _embedded_run(work, {1: {"actor": {}}})
        refused(work, ["export", "--run", "run", "--step", "5", "--out", "out"],
                ["--step 5", "it has steps 1"], capsys)

    def test_overrides_beside_run(self, work, capsys):
        _embedded_run(work)
        refused(work, ["export", "--run", "run", "seed=1", "--out", "out"], ["drop the overrides", "seed=1"], capsys)

    def test_out_not_empty(self, work, capsys):
        (work / "out").mkdir()
        (work / "out" / "keep").write_text("x")
        refused(work, ["export", *TINY, "--out", "out"], ["--out out", "not empty"], capsys)

    def test_a_verl_run(self, work, capsys):
        (work / "run").mkdir()
        (work / "run" / "config.yaml").write_text("backend: {name: verl}\n")
        err = refused(work, ["export", "--run", "run", "--out", "out"], ["--run run: a verl run"], capsys)
        assert "drop backend" not in err

    def test_a_damaged_config(self, work, capsys):
        (work / "run").mkdir()
        (work / "run" / "config.yaml").write_text("backend: [unclosed\n")
        refused(work, ["export", "--run", "run", "--out", "out"], ["run/config.yaml: not valid YAML", "line 2"], capsys)

    def test_step_without_run(self, work, capsys):
        refused(work, ["export", *TINY, "--step", "3", "--out", "out"], ["--step", "--run"], capsys)


class TestDataPrepare:
    def test_out_is_a_file(self, work, capsys):
        (work / "g.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
        (work / "data").write_text("x")
        refused(work, ["data", "prepare", "gsm8k", "--src", "g.jsonl", "--out", "data"],
                ["--out data", "not a directory"], capsys)

    def test_an_existing_output(self, work, capsys):
        (work / "g.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
        (work / "data").mkdir()
        (work / "data" / "gsm8k-train.parquet").write_bytes(b"prepared before")
        refused(work, ["data", "prepare", "gsm8k", "--src", "g.jsonl", "--out", "data"],
                ["gsm8k-train.parquet exists", "--force"], capsys)


class TestUaq:
    def test_out_is_a_file(self, work, capsys):
        (work / "model").mkdir()
        (work / "out").write_text("x")
        refused(work, ["uaq", "apply", "--s", "1.5", "model", "out"], ["OUT_DIR out", "not empty"], capsys)

    def test_out_is_in(self, work, capsys):
        (work / "model").mkdir()
        refused(work, ["uaq", "apply", "--s", "1.5", "model", "model"], ["is IN_DIR", "never overwrites"], capsys)

    def test_out_inside_in(self, work, capsys):
        (work / "model").mkdir()
        refused(work, ["uaq", "apply", "--s", "1.5", "model", "model/out"], ["lies inside IN_DIR"], capsys)

    def test_not_a_hugging_face_directory(self, work, capsys):
        (work / "model").mkdir()
        refused(work, ["uaq", "apply", "--s", "1.5", "model", "out"], ["no config.json"], capsys)

    def test_an_architecture_without_a_mapping(self, work, capsys):
        (work / "model").mkdir()
        (work / "model" / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
        refused(work, ["uaq", "apply", "--s", "1.5", "model", "out"], ["GPT2LMHeadModel", "LlamaForCausalLM"], capsys)


class TestEval:
    def test_no_such_run_dir(self, work, capsys):
        refused(work, ["eval", "nowhere"], ["nowhere: no such run directory"], capsys)

    def test_a_run_without_checkpoints(self, work, capsys):
        _embedded_run(work)
        refused(work, ["eval", "run"], ["holds no checkpoint to score"], capsys)

    def test_an_engine_that_is_not_there(self, work, capsys):
        _embedded_run(work)
        refused(work, ["eval", "run", "--precision", "int3"], ["--precision", "int3"], capsys)

    def test_not_a_run_dir(self, work, capsys):
        (work / "run").mkdir()
        refused(work, ["eval", "run"], ["run: not a run directory", "config.yaml"], capsys)

    def test_a_run_config_with_a_value_of_the_wrong_type(self, work, capsys):
        run = _embedded_run(work, {1: {"actor": {}}})
        _edit_config(run, lambda c: c.update(steps="abc"))
        refused(work, ["eval", "run"], ["run/config.yaml: steps: Value 'abc'", "Integer"], capsys)

    def test_a_run_config_with_a_key_no_section_has(self, work, capsys):
        run = _embedded_run(work, {1: {"actor": {}}})
        _edit_config(run, lambda c: c["train"].update(bogus=1))
        refused(work, ["eval", "run"], ["run/config.yaml: train.bogus: Key 'bogus' not in 'TrainConfig'"], capsys)

    def test_a_run_config_that_is_not_yaml(self, work, capsys):
        run = _embedded_run(work, {1: {"actor": {}}})
        (run / "config.yaml").write_text("backend: {name: embedded\n")
        refused(work, ["eval", "run"], ["run/config.yaml: not valid YAML", "line 2"], capsys)

    def test_overrides_beside_a_run_dir(self, work, capsys):
        (work / "run").mkdir()
        refused(work, ["eval", "run", "seed=1"], ["overrides 'seed=1'", "sweep file"], capsys)


def _edit_config(run: Path, change) -> None:
    import yaml

    config = yaml.safe_load((run / "config.yaml").read_text())
    change(config)
    (run / "config.yaml").write_text(yaml.safe_dump(config))


def _damaged_jobs_record(work: Path) -> None:
    """A sweep file s.yaml whose state dir holds a jobs.jsonl cut mid-line."""
    (work / "s.yaml").write_text("name: s\nbase: [" + ", ".join(TINY) + ", out_dir=runs]\nmatrix: {seed: [0]}\n")
    state = work / "runs" / "_sweeps" / "s"
    state.mkdir(parents=True)
    (state / "jobs.jsonl").write_text("{not json\n")


class TestStatus:
    def test_a_damaged_jobs_record(self, work, capsys):
        _damaged_jobs_record(work)
        refused(work, ["status", "s.yaml"], ["jobs.jsonl"], capsys)


class TestSync:
    def test_a_damaged_run_record(self, work, capsys):
        (work / "run").mkdir()
        (work / "run" / "mlflow_run.json").write_text("{cut")
        refused(work, ["sync", "run"], ["mlflow_run.json: not valid JSON"], capsys)

    def test_a_tracking_uri_no_store_takes(self, work, capsys):
        (work / "run").mkdir()
        refused(work, ["sync", "run", "--tracking-uri", "ftp://x"], ["--tracking-uri", "ftp://x", "sqlite"], capsys)


class TestCancel:
    def test_a_damaged_jobs_record(self, work, capsys):
        _damaged_jobs_record(work)
        refused(work, ["cancel", "s.yaml"], ["jobs.jsonl"], capsys)


CLASSES = [TestRun, TestSweep, TestTune, TestReport, TestExport, TestDataPrepare, TestUaq, TestEval, TestStatus,
           TestSync, TestCancel]
