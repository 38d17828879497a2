"""The verl runner up to the process it starts, and the INT8 hook's no-GPU error.

verl + vLLM need GPUs, so `run()` is exercised with its `execute` step replaced by a stand-in
that does what main_ppo's MLflow logger does (attach to MLFLOW_RUN_ID, log val-core metrics):
a test double for the GPU job only; the MLflow store, UAQ copy and scripts are real.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest
import torch

from suite.config import compose_config
from suite.verl.runner import Allocation, node_script, run, slurm_allocation
from suite.verl.translate import uaq_model_dir, verl_command


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory):
    return tmp_path_factory.mktemp("mlflow") / "mlflow.db"  # one store: its schema migration takes seconds


@pytest.fixture
def verl_cfg(tiny_qwen2, tmp_path, mlflow_db):
    def make(*extra):
        return compose_config([
            "backend=verl", f"backend.model_path={tiny_qwen2}", f"backend.train_files={tmp_path / 'train.parquet'}",
            f"backend.val_files={tmp_path / 'val.parquet'}", f"out_dir={tmp_path / 'runs'}",
            f"tracking.tracking_uri=sqlite:///{mlflow_db}", "tracking.experiment=verl-test", *extra,
        ])
    return make


def test_two_node_scripts(verl_cfg, tmp_path):
    cfg = verl_cfg("backend.nnodes=2", "quant=int8", "uaq.s=1.0")
    alloc = slurm_allocation({"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NODEID": "0", "SLURM_CPUS_PER_TASK": "96",
                              "SLURM_JOB_ID": "77"},
                             hostnames=lambda nl: ["gpu01", "gpu02"] if nl == "gpu[01-02]" else [])
    assert alloc == Allocation(nodes=("gpu01", "gpu02"), node_rank=0, cpus_per_node=96, job_id="77")
    run_dir = str(tmp_path / "r")
    head = node_script(cfg, run_dir, alloc, "abc123")
    worker = node_script(cfg, run_dir, Allocation(alloc.nodes, 1, 96, "77"), "abc123")
    for text in (head, worker):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)  # valid bash
        assert "export MLFLOW_RUN_ID=abc123" in text and "export SUITE_ROLLOUT_QUANT=int8" in text
        assert "export HEAD_HOST=gpu01" in text and "export NNODES=2" in text and "export GPUS_PER_NODE=8" in text
    assert 'ray start --head --node-ip-address="$HEAD_IP" --port="$RAY_PORT" --num-gpus="$GPUS_PER_NODE"' in head
    assert "alive >= want" in head and 'export RAY_ADDRESS="$HEAD_IP:$RAY_PORT"' in head
    assert head.rstrip().endswith(shlex.join(verl_command(cfg, run_dir)))  # the main_ppo line is the translator's
    assert f"trainer.default_local_dir={tmp_path / 'r' / 'checkpoints'}" in head
    assert 'ray start --address="$HEAD_IP:$RAY_PORT"' in worker and "--block" in worker
    assert "main_ppo" not in worker and "--head" not in worker


def test_allocation_errors(verl_cfg, tmp_path):
    with pytest.raises(RuntimeError, match="SLURM_JOB_NODELIST"):
        slurm_allocation({})
    cfg = verl_cfg("backend.nnodes=4")
    with pytest.raises(RuntimeError, match="backend.nnodes=4 but the SLURM allocation has 2 nodes"):
        run(cfg, str(tmp_path / "r"), env={"SLURM_JOB_NODELIST": "x"}, hostnames=lambda _: ["a", "b"],
            execute=lambda *a: pytest.fail("must not start anything"))


def test_run_single_node_end_to_end(verl_cfg, tmp_path):
    """run(): UAQ copy, MLflow run with tags + parent, main_ppo argv and env, summary from MLflow, resume."""
    import mlflow
    from mlflow.tracking import MlflowClient

    cfg = verl_cfg("quant=fp8", "correction=acr", "uaq.s=1.5", "+tracking.tags.sweep=verltest")
    uri = cfg.tracking.tracking_uri
    client = MlflowClient(uri)
    parents = client.get_experiment_by_name("parents")
    parent = client.create_run(parents.experiment_id if parents else client.create_experiment("parents")).info.run_id
    cfg.tracking.parent_run_id = parent
    run_dir = str(tmp_path / "runs" / "cell0")
    seen = {}

    def fake_verl(argv, log_path, env):  # what verl's MLflow logger does when main_ppo runs
        seen.update(argv=argv, env=dict(env), log=log_path)
        mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
        with mlflow.start_run(run_id=env["MLFLOW_RUN_ID"]):
            for step, acc in ((0, 0.25), (2, 0.5), (4, 0.625)):
                mlflow.log_metric("val-core/gsm8k/acc/mean_at_1", acc, step=step)
                mlflow.log_metric("val-core/gsm8k/reward/mean_at_1", acc - 1, step=step)
        return 0

    summary = run(cfg, run_dir, env={}, execute=fake_verl)
    assert summary["baseline_acc"] == 0.25 and summary["final_acc"] == 0.625 and summary["delta_acc"] == 0.375
    assert summary["already_finished"] is False and summary["metric_keys"] == ["val-core/gsm8k/acc/mean_at_1"]
    assert seen["argv"] == verl_command(cfg, run_dir)
    # the UAQ copy lives in the run's own directory (a read-only models directory works)
    assert uaq_model_dir(cfg, run_dir) == os.path.join(run_dir, "model-uaq-s1.5")
    assert f"actor_rollout_ref.model.path={uaq_model_dir(cfg, run_dir)}" in seen["argv"]
    assert json.loads((tmp_path / "runs" / "cell0" / "summary.json").read_text())["final_acc"] == 0.625
    from omegaconf import OmegaConf  # the resolved config, as `suite eval` reads it back

    assert OmegaConf.to_container(OmegaConf.load(tmp_path / "runs" / "cell0" / "config.yaml")) == \
        OmegaConf.to_container(cfg, resolve=True)
    # the UAQ copy was made (and verified) before launch
    with open(f"{uaq_model_dir(cfg, run_dir)}/uaq.json") as fh:
        uaq_meta = json.load(fh)
    assert uaq_meta["s"] == 1.5 and uaq_meta["max_rel_logit_diff"] < 1e-5
    # the MLflow run verl logged into carries the axes, the sweep tag and the parent
    env = seen["env"]
    assert json.loads(env["SUITE_LOSS_PARAMS"]) == {"tis_cap": 2.0} and env["MLFLOW_TRACKING_URI"] == uri
    info = MlflowClient(uri).get_run(env["MLFLOW_RUN_ID"])
    tags = info.data.tags
    assert tags["mlflow.parentRunId"] == parent and tags["sweep"] == "verltest"
    assert (tags["backend"], tags["precision"], tags["correction"], tags["uaq_s"]) == ("verl", "fp8", "acr", "1.5")
    assert info.info.experiment_id == MlflowClient(uri).get_experiment_by_name("verl-test").experiment_id
    # a second call finds the finished run and starts nothing
    again = run(cfg, run_dir, env={}, execute=lambda *a: pytest.fail("must not start anything"))
    assert again["already_finished"] is True and again["final_acc"] == 0.625


def test_a_cpu_run_drops_the_empty_cuda_visible_devices_a_local_sweep_job_gets(verl_cfg, tmp_path):
    """submitit's local executor starts a job without GPUs under CUDA_VISIBLE_DEVICES="", and Ray then
    refuses the one pretend GPU the vLLM CPU path asks for ("Attempting to start raylet with 1 GPU, but
    CUDA_VISIBLE_DEVICES contains []"): a CPU run's environment drops it; a GPU run's keeps it."""
    seen = {}

    def capture(argv, log_path, env):
        seen[env["VERL_PLATFORM"] if "VERL_PLATFORM" in env else "cuda"] = dict(env)
        return 3

    for device in ("cpu", "cuda"):
        cfg = verl_cfg("quant=bf16", "uaq.s=1.0", f"backend.device={device}")
        with pytest.raises(RuntimeError, match="verl exited with status 3"):
            run(cfg, str(tmp_path / device), env={"CUDA_VISIBLE_DEVICES": "", "KEEP": "1"}, execute=capture)
    assert "CUDA_VISIBLE_DEVICES" not in seen["cpu"] and seen["cpu"]["KEEP"] == "1"
    assert seen["cuda"]["CUDA_VISIBLE_DEVICES"] == ""


def test_run_failure_names_the_log(verl_cfg, tmp_path):
    cfg = verl_cfg("quant=bf16", "uaq.s=1.0")
    with pytest.raises(RuntimeError, match=r"verl exited with status 3; see .*verl.log"):
        run(cfg, str(tmp_path / "r"), env={}, execute=lambda *a: 3)


def test_a_failed_verl_run_from_suite_run_ends_its_mlflow_run_failed(tiny_qwen2, tmp_path, monkeypatch):
    """`suite run backend=verl` whose main_ppo fails: the run's MLflow run (created before the
    launch, which verl would have ended) is ended FAILED with the error as a tag, as an embedded
    run's is (suite.cell.run_cell), not left RUNNING."""
    import functools

    from mlflow.tracking import MlflowClient

    import suite.verl.runner as runner
    from suite.cli import main
    from suite.config import run_id

    db = tmp_path / "mlflow.db"
    overrides = ["backend=verl", f"backend.model_path={tiny_qwen2}", f"backend.train_files={tmp_path / 't.parquet'}",
                 f"backend.val_files={tmp_path / 'v.parquet'}", f"out_dir={tmp_path / 'runs'}",
                 f"tracking.tracking_uri=sqlite:///{db}", "quant=bf16", "uaq.s=1.0"]
    monkeypatch.setattr(runner, "run", functools.partial(runner.run, env={}, execute=lambda *a: 3))
    # verl's trainer is a stand-in here (it exits 3), so the environment needs no vLLM for it
    monkeypatch.setattr("suite.verl.backend.missing", lambda cfg: None)
    with pytest.raises(RuntimeError, match="verl exited with status 3"):
        main(["run", "--no-progress", *overrides])
    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    assert runs[0].info.status == "FAILED" and "verl exited with status 3" in runs[0].data.tags["error"]
    assert runs[0].data.tags["run_id"] == run_id(compose_config(overrides))


def test_int8_hook_quantizers_run_anywhere_and_only_the_gpu_fold_needs_a_gpu():
    """The re-quantization is the suite's CPU quantizer (the live-engine sync is tested in
    tests/vllm_cpu); only the fold into live CUDA tensors is GPU-only, and it says so."""
    from suite.core.quant import QuantScheme, fake_quant, quantize_int8_per_channel
    from suite.verl.int8_hook import (NoGPUError, fake_quant_weights, fold_into_live, is_quantized_linear,
                                      requantize_int8)

    w = torch.randn(8, 16)
    out = dict(requantize_int8([("model.layers.0.mlp.up_proj.weight", w), ("model.norm.weight", w[0])]))
    codes, scales = quantize_int8_per_channel(w)
    assert torch.equal(out["model.layers.0.mlp.up_proj.weight"], codes)
    assert torch.equal(out["model.layers.0.mlp.up_proj.weight_scale"], scales)
    assert torch.equal(out["model.norm.weight"], w[0])
    scheme = QuantScheme("w4a16")
    (name, fq), = fake_quant_weights([("model.layers.0.mlp.up_proj.weight", w)], scheme)
    assert torch.equal(fq, fake_quant(w, scheme))
    if not torch.cuda.is_available():
        layer = torch.nn.Linear(16, 8)
        with pytest.raises(NoGPUError, match=r"needs a CUDA GPU.*slurm/gpu_check.sh"):
            fold_into_live(layer, {"weight": layer.weight})
    assert is_quantized_linear("model.layers.3.self_attn.q_proj.weight")
    assert not is_quantized_linear("lm_head.weight") and not is_quantized_linear("model.layers.0.self_attn.q_proj.bias")


def test_worker_node_joins_and_returns_the_heads_summary(verl_cfg, tmp_path):
    cfg = verl_cfg("backend.nnodes=2", "quant=bf16", "uaq.s=1.0")
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "mlflow_run.json").write_text(json.dumps({"run_id": "r1"}))
    seen = {}

    def ray_worker(argv, log_path, env):  # the worker's Ray blocks until the head finished
        seen["script"] = open(argv[1]).read()
        (run_dir / "summary.json").write_text(json.dumps({"baseline_acc": 0.1, "final_acc": 0.3, "delta_acc": 0.2}))
        return 0

    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODEID": "1", "SLURM_CPUS_PER_TASK": "4"}
    out = run(cfg, str(run_dir), env=env, execute=ray_worker, hostnames=lambda _: ["n1", "n2"])
    assert out == {"baseline_acc": 0.1, "final_acc": 0.3, "delta_acc": 0.2, "already_finished": False}
    assert "export MLFLOW_RUN_ID=r1" in seen["script"] and "--block" in seen["script"]
    assert not (run_dir / "verl_node0.sh").exists()  # node 1 never starts the head


def test_cpu_workarounds_dedupe_verls_backend_string():
    from suite.verl.cpu_workarounds import dedupe_backend

    assert dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"  # verl's f"cpu:gloo,{device}:{comm}" on the CPU
    assert dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert dedupe_backend("gloo") == "gloo" and dedupe_backend(None) is None


def test_summary_reads_avg_at_32_and_pass_at_32_where_verl_logs_them(tmp_path):
    """A run validated as QuRL reports AIME (rollout.val_kwargs.n=32) logs only mean@32 (and
    best@32/mean, maj@32/mean) for its core metric: read, not FAILED; two data sources averaged."""
    import mlflow

    from suite.verl.runner import read_summary

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run() as r:
        for step, (a, b) in ((0, (0.125, 0.25)), (10, (0.25, 0.5))):
            for src, acc in (("aime24", a), ("amc", b)):
                mlflow.log_metric(f"val-core/{src}/acc/mean_at_32", acc, step=step)
                mlflow.log_metric(f"val-core/{src}/acc/best_at_32/mean", min(1.0, 2 * acc), step=step)
                mlflow.log_metric(f"val-core/{src}/acc/maj_at_32/mean", acc, step=step)
                mlflow.log_metric(f"val-aux/{src}/reward/mean_at_1", acc, step=step)
    s = read_summary(uri, r.info.run_id)
    assert s["val_n"] == 32 and s["metric_keys"] == ["val-core/aime24/acc/mean_at_32", "val-core/amc/acc/mean_at_32"]
    assert s["baseline_acc"] == pytest.approx((0.125 + 0.25) / 2) and s["final_acc"] == pytest.approx(0.375)
    assert s["steps"] == 10 and s["final_pass_at_n"] == pytest.approx((0.5 + 1.0) / 2)
    with mlflow.start_run() as empty:
        mlflow.log_metric("val-aux/aime24/acc/mean_at_32", 0.5, step=0)
    with pytest.raises(RuntimeError, match="no val-core/\\*/acc\\|reward/mean_at_N"):
        read_summary(uri, empty.info.run_id)


def test_a_paper_recipe_cell_is_scored_after_training_and_a_failed_scoring_keeps_the_run(verl_cfg, tmp_path,
                                                                                          capsys):
    """backend.eval_after_train (on in every paper recipe) runs `suite eval --precision bf16,rollout`
    once main_ppo succeeded. Here the stand-in main_ppo writes no checkpoint (and the held-out file does
    not exist), so the scoring is refused: the run still finishes with its summary, and the message names
    the command that scores it."""
    import mlflow

    from suite.identity import run_id
    from suite.recipes import resolved_values

    assert all(resolved_values(n)["backend.eval_after_train"].value for n in ("qurl-gsm8k", "qurl-dapo"))
    cfg = verl_cfg("quant=bf16", "correction=naive", "uaq.s=1.0", "backend.eval_after_train=true")
    assert run_id(cfg) == run_id(verl_cfg("quant=bf16", "correction=naive", "uaq.s=1.0"))  # not in the run id
    run_dir = str(tmp_path / "runs" / "scored")

    def fake_verl(argv, log_path, env):
        mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
        with mlflow.start_run(run_id=env["MLFLOW_RUN_ID"]):
            mlflow.log_metric("val-core/gsm8k/acc/mean_at_1", 0.5, step=1)
        return 0

    summary = run(cfg, run_dir, env={}, execute=fake_verl)
    assert summary["final_acc"] == 0.5 and os.path.isfile(os.path.join(run_dir, "summary.json"))
    out = capsys.readouterr().out
    assert "its evaluation failed" in out and f"suite eval {run_dir} --precision bf16,rollout" in out, out
    assert not os.path.exists(os.path.join(run_dir, "eval"))
