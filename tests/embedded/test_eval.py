"""`suite eval` of an embedded run: the checkpoint's actor scored per benchmark by the fp32, bf16 and
rollout engines, against the run's own validation; idempotent; bad inputs refused before anything
is written (no eval/ directory, no MLflow metric)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import mlflow
import pytest
from cli_here import suite_here

from suite.evaluation import read_results

TINY = ["model=tiny", "task.difficulty=1", "task.n_eval=32", "steps=4", "eval_every=2", "ckpt_every=2",
        "rollout.prompts_per_step=4", "algo.group_size=4", "warm_start.steps=60", "warm_start.batch_size=16",
        "threads=1"]


def _suite(*args, cwd=None, timeout=600):
    code = "import sys; from suite.cli import main; sys.argv[0] = 'suite'; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, warmstart_cache):
    """A finished 4-step tiny INT8 run (checkpoints at steps 2 and 4) and its MLflow store."""
    root = tmp_path_factory.mktemp("eval")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    proc = _suite("run", *TINY, f"warm_start.cache_dir={warmstart_cache}", f"out_dir={root / 'runs'}",
                  f"tracking.tracking_uri={uri}", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p for p in (root / "runs").iterdir() if p.is_dir()]
    return run_dir, uri


def _metrics(uri: str, run_dir) -> dict:
    rid = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    client = mlflow.tracking.MlflowClient(uri)
    keys = [k for k in client.get_run(rid).data.metrics if k.startswith("eval/")]
    return {k: [(m.step, m.value) for m in client.get_metric_history(rid, k)] for k in keys}


def test_fp32_reproduces_the_runs_validation_and_each_engine_is_logged(trained):
    run_dir, uri = trained
    summary = json.loads((run_dir / "summary.json").read_text())
    proc = _suite("eval", run_dir, "--precision", "fp32,bf16,rollout")
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = {(s.benchmark, s.engine): s for s in read_results(run_dir, 4)}
    # the run's own level, fp32, last checkpoint: what its in-training validation scored at step 4
    own = scores[("arith-d1", "fp32")]
    assert own.acc == summary["final_acc"] and own.n_prompts == 32 and own.protocol.samples == 1
    assert own.protocol.temperature == 0.0 and own.step == 4
    assert own.grader.startswith("suite-arith-verify (suite ")  # what graded it, beside the score
    # every level that fits the tiny model, each by the three engines, the rollout copy named
    assert {b for b, _ in scores} == {"arith-d1", "arith-d2", "arith-d3", "arith-d4"}
    assert {e for _, e in scores} == {"fp32", "bf16", "rollout"}
    assert "int8" in scores[("arith-d1", "rollout")].engine_detail
    for s in scores.values():
        assert s.acc == s.n_correct / (s.n_prompts * s.protocol.samples)
    logged = _metrics(uri, run_dir)
    assert logged["eval/arith-d1/fp32/acc/mean_at_1"] == [(4, own.acc)]
    assert len(logged) == 12
    assert "rollout - bf16" in proc.stdout  # the engine's own error, printed per benchmark


def test_a_second_call_scores_nothing_again_and_sends_nothing_twice(trained):
    run_dir, uri = trained
    assert _suite("eval", run_dir, "--precision", "fp32").returncode == 0
    before = (run_dir / "eval" / "step_00000004.json").read_text()
    logged = _metrics(uri, run_dir)
    proc = _suite("eval", run_dir, "--precision", "fp32")
    assert proc.returncode == 0 and "new score" not in proc.stdout, proc.stdout
    assert (run_dir / "eval" / "step_00000004.json").read_text() == before
    assert _metrics(uri, run_dir) == logged


def test_best_and_numbered_checkpoints(trained):
    run_dir, _ = trained
    hist = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    acc = {e["step"]: e["metrics"]["val-core/arith/acc/mean@1"] for e in hist
           if "val-core/arith/acc/mean@1" in e["metrics"] and e["step"] in (2, 4)}
    best = max(acc, key=lambda s: (acc[s], s))
    # best is chosen on the run's own level (arith-d1): never reported there, on another level it is
    _refused(_suite("eval", run_dir, "--precision", "fp32", "--benchmarks", "arith-d1", "--checkpoint", "best"),
             "--checkpoint best: chosen on the validation of arith-d1, which it would then report")
    _refused(_suite("eval", run_dir, "--benchmarks", "arith-d2", "--checkpoint", "best", "--select-on", "arith-d3"),
             "--select-on 'arith-d3': not one of arith-d1")
    _refused(_suite("eval", run_dir, "--benchmarks", "arith-d2", "--select-on", "arith-d1"), "--checkpoint best only")
    proc = _suite("eval", run_dir, "--precision", "fp32", "--benchmarks", "arith-d2", "--checkpoint", "best")
    assert proc.returncode == 0, proc.stderr
    assert [x.step for x in read_results(run_dir, best) if x.engine == "fp32" and x.benchmark == "arith-d2"] == [best]
    proc = _suite("eval", run_dir, "--precision", "fp32", "--benchmarks", "arith-d1", "--checkpoint", str(best))
    assert proc.returncode == 0, proc.stderr
    (s,) = [x for x in read_results(run_dir, best) if x.engine == "fp32" and x.benchmark == "arith-d1"]
    assert s.acc == acc[best]  # a checkpoint at an evaluated step reproduces that evaluation
    assert _suite("eval", run_dir, "--precision", "fp32", "--benchmarks", "arith-d1", "--checkpoint",
                  "2").returncode == 0
    assert [x.acc for x in read_results(run_dir, 2) if x.engine == "fp32" and x.benchmark == "arith-d1"] == [acc[2]]


# a job no other test of this module scores (step 2): the run's MLflow run has none of it before
ONLY_HERE = ("--precision", "rollout", "--benchmarks", "arith-d3", "--checkpoint", "2")


def test_scores_made_during_a_tracking_outage_are_sent_by_the_next_call(trained, tmp_path):
    import socket

    run_dir, uri = trained
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("eval"))
    record = json.loads((copy / "mlflow_run.json").read_text())
    before = _metrics(uri, run_dir)
    with socket.socket() as held:  # a port bound but never listening: every connection is refused
        held.bind(("127.0.0.1", 0))
        dead = dict(record, tracking_uri=f"http://127.0.0.1:{held.getsockname()[1]}")
        (copy / "mlflow_run.json").write_text(json.dumps(dead))
        proc = _suite("eval", copy, *ONLY_HERE)
    assert proc.returncode == 0, proc.stderr
    assert "unreachable" in proc.stdout and "sent by the next" in proc.stdout
    assert len(read_results(copy, 2)) == 1
    (copy / "mlflow_run.json").write_text(json.dumps(record))  # the server is back
    proc = _suite("eval", copy, *ONLY_HERE)
    assert proc.returncode == 0 and "1 metric(s) sent" in proc.stdout, proc.stdout
    after = _metrics(uri, run_dir)
    key = "eval/arith-d3/rollout/acc/mean_at_1"
    at_2 = [step for step, _ in after[key] if step == 2]
    assert [step for step, _ in before.get(key, []) if step == 2] == [] and at_2 == [2]


def _refused(proc, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    for w in words:
        assert w in proc.stderr, (w, proc.stderr)


class TestBadInputs:
    """Each refused with exit 2 and one line naming the value and what is allowed; the run dir gets
    no eval/ and its MLflow run no metric."""

    def test_each_refusal(self, trained, tmp_path):
        run_dir, uri = trained
        copy = tmp_path / "run"
        shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("eval"))
        before = _metrics(uri, run_dir)
        # the first through a real `suite` process, the rest through the same entry point in this one
        _refused(_suite("eval", copy, "--benchmarks", "aime2024"), "aime2024", "arith-d1, arith-d2")
        _refused(suite_here("eval", copy, "--precision", "int4"), "'int4'", "bf16, fp32, rollout")
        _refused(suite_here("eval", copy, "--checkpoint", "3"), "'3'", "last, best, 2, 4")
        _refused(suite_here("eval", tmp_path / "nowhere"), "no such run directory")
        _refused(suite_here("eval", tmp_path), "not a run directory")
        _refused(suite_here("eval", copy, "seed=1"), "a run directory takes none")
        # a checkpoint of another model: a small-model checkpoint in the tiny run's place
        import torch

        from suite.embedded.model import PRESETS, ModelConfig, Transformer
        from suite.embedded.tokenizer import CharTokenizer

        other = Transformer(ModelConfig(**dict(PRESETS["small"], vocab_size=CharTokenizer().vocab_size)))
        ckpt = copy / "checkpoints" / "step_00000004.pt"
        payload = torch.load(ckpt, weights_only=True)
        payload["state"]["actor"] = other.state_dict()
        torch.save(payload, ckpt)
        _refused(suite_here("eval", copy), "holds another model", "model.preset=tiny")
        ckpt.write_bytes(b"not a checkpoint")
        _refused(suite_here("eval", copy), "step_00000004.pt: not a readable suite checkpoint")
        assert ckpt.read_bytes() == b"not a checkpoint"  # a read-only verb renames nothing
        for p in (copy / "checkpoints").iterdir():
            p.unlink()
        _refused(suite_here("eval", copy), "holds no checkpoint")
        assert not (copy / "eval").exists()
        # damaged files it reads: an earlier result of another shape, metrics that are not text, a config
        # that is empty or of another backend
        shutil.copytree(run_dir / "checkpoints", copy / "checkpoints", dirs_exist_ok=True)
        (copy / "eval").mkdir()
        result = copy / "eval" / "step_00000004.json"
        for body, field in (('{"step": 4, "scores": [{"benchmark": "arith-d1"}]}', "scores.0.engine: field required"),
                            ('[1, 2]', "must be a valid dictionary"), ("\udcff", "not UTF-8 text (byte 0)"),
                            ("", "not valid JSON"),
                            ('{"step": 3, "scores": []}', "step: 3, but the file is checkpoint 4")):
            result.write_text(body, errors="surrogateescape")
            _refused(suite_here("eval", copy), "step_00000004.json: not a suite eval result file", field)
            assert result.read_text(errors="surrogateescape") == body
        shutil.rmtree(copy / "eval")
        (copy / "metrics.jsonl").write_bytes(b"\xff\xfe not text")
        _refused(suite_here("eval", copy, "--benchmarks", "arith-d2", "--checkpoint", "best"),
                 "metrics.jsonl: not a readable metrics file")
        config = (copy / "config.yaml").read_text()
        for body in ("", "- a list\n", config.replace("name: embedded", "name: nosuch", 1)):
            (copy / "config.yaml").write_text(body)
            _refused(suite_here("eval", copy), "config.yaml: backend.name is", "not one of embedded, verl")
        assert not (copy / "eval").exists()
        assert _metrics(uri, run_dir) == before


def test_a_sweep_file_scores_its_finished_cells(tmp_path, warmstart_cache):
    """`suite eval SWEEP_FILE OVERRIDES`: refused while no cell has finished (nothing written), then,
    once the sweep ran, every finished cell scored (locally: the sweep's launcher is local)."""
    sweep = tmp_path / "tiny.yaml"
    base = [x for x in TINY if not x.startswith(("steps=", "task.difficulty=", "task.n_eval="))]
    # difficulty 2 with 96 held-out prompts: arith-d1 holds out only 75, which are all scored
    base += ["steps=2", "task.difficulty=2", "task.n_eval=96"]
    sweep.write_text("name: evalsweep\nbase: [" + ", ".join(base) + "]\n"
                     "matrix:\n  seed: [0, 1]\nlauncher:\n  name: local\n  max_parallel: 1\n")
    over = [f"warm_start.cache_dir={warmstart_cache}", f"out_dir={tmp_path / 'runs'}",
            f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    _refused(_suite("eval", sweep, *over), "none of its 2 cells has finished")
    assert not (tmp_path / "runs").exists()
    proc = _suite("sweep", sweep, *over, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _suite("eval", sweep, *over, "--precision", "fp32", "--benchmarks", "arith-d1,arith-d2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 finished cell(s) of 2" in proc.stdout
    cells = [p for p in (tmp_path / "runs").iterdir() if (p / "summary.json").is_file()]
    assert len(cells) == 2
    for run_dir in cells:
        scores = {s.benchmark: s for s in read_results(run_dir, 2)}
        assert scores["arith-d2"].acc == json.loads((run_dir / "summary.json").read_text())["final_acc"]
        assert (scores["arith-d2"].n_prompts, scores["arith-d1"].n_prompts) == (96, 75)
