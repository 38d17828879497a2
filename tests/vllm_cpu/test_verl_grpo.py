"""A real verl 0.9.1 GRPO run on vLLM's CPU build, through `suite run backend=verl backend.device=cpu`, and
everything that reads it: the same cell on both backends before any RL step, `suite eval` of its checkpoint,
and `suite report` of it beside an embedded run. One verl run serves the four checks (each verl run costs
minutes of process start-up on 2 cores; its two steps take seconds).

The run: `suite export` of an embedded warm start (300 supervised steps on the arith task, level 1) trained
2 GRPO steps with INT8 rollouts on vLLM CPU through the suite's weight-sync hook (bf16 where vLLM CPU serves
no INT8) and the suite's ACR loss from the plugin, on the export's own parquet and reward file. Then:

1. **the run itself**: its tags, the metrics under verl's names, one `timing_s/step` per step;
2. **cross-backend, before RL**: verl validates before its first step; that score matches the embedded
   trainer's own evaluation of the same 64 held-out prompts (greedy; fp32 there, the rollout engine here, so a
   few near-tie answers may differ: |verl - embedded| <= max(0.05, 2 standard errors of the difference)).
   Export, tokenizer, chat template, EOS and the reward all sit on this path: a space between decoded
   characters, a ``<bos>`` the embedded model never saw, or a stop token vLLM does not know would each put
   verl's accuracy near 0;
3. **`suite eval`** merges the step-2 checkpoint with verl's model merger and scores it in bf16 and by the
   run's rollout engine; the rollout engine's score matches verl's own validation at that step (the same engine
   on the same weights); a second call scores nothing; a missing data file is refused;
4. **the report**: an embedded run of the same cell in the same store; both runs carry the metric names the
   report reads, and its tables hold both, one row per backend.

About 6 minutes on 2 cores; every verl process runs under the subprocess timeout below (a failing verl run
hangs rather than exits). `run_verl` (a tiny random Llama, tests/vllm_cpu/vllm_tiny.py) serves
test_verl_dapo.py.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import mlflow
import pytest

from vllm_tiny import NUMBERS, save_hf, tiny_model

RUN_TIMEOUT_S = 840  # under the 900 s per-test limit of conftest.py


def _precision() -> str:
    """INT8 where vLLM's CPU build serves it on this CPU (a VNNI dot product or AMX), else bf16: on
    an AVX2-only CPU `quant=int8` is refused at compose (its oneDNN kernel saturates: docs/verl.md,
    "vLLM's CPU build on each CPU kind"; tests/verl/test_translate.py checks the refusal)."""
    from suite.hardware import cpu_features
    from suite.verl.rollout_quant import vllm_cpu_precisions

    return "int8" if "int8" in vllm_cpu_precisions(cpu_features()) else "bf16"


PRECISION = _precision()
# verl's workers are subprocesses, which an emulated CPU kind (conftest.py) does not reach
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(os.environ.get("SUITE_VLLM_CPU_EMULATE")), reason=(
    "SUITE_VLLM_CPU_EMULATE: verl's workers are subprocesses, which the emulation does not reach"))]


def _data(tmp_path):
    import pandas as pd

    from suite.embedded.tasks import make_split, make_task

    task = make_task("arith", 1)
    paths = {}
    for split, n in (("train", 32), ("eval", 8)):
        # data_source "arith": held-out accuracy lands as val-core/arith/..., the embedded key
        rows = [{"data_source": "arith", "prompt": [{"role": "user", "content": ex.prompt}],
                 "reward_model": {"style": "rule", "ground_truth": ex.answer}, "extra_info": {"index": i}}
                for i, ex in enumerate(make_split(task, n, seed=0, split=split))]
        paths[split] = tmp_path / f"{split}.parquet"
        pd.DataFrame(rows).to_parquet(paths[split])
    return paths, task


def run_verl(tmp_path, reward: str, *overrides: str, precision: str = PRECISION, steps: int = 2):
    """`suite run backend=verl backend.device=cpu` of the tiny model on the arith parquet, scored by
    ``reward`` (a python file's text), for ``steps`` RL steps, with ``overrides`` last; (the process,
    its MLflow store)."""
    model = save_hf(tiny_model(0), tmp_path / "model")  # its chat template writes the content alone
    paths, task = _data(tmp_path)
    (tmp_path / "reward.py").write_text(reward)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [
        "run", "backend=verl", "backend.device=cpu", f"backend.python={sys.executable}",
        f"backend.model_path={model}", f"backend.train_files={paths['train']}", f"backend.val_files={paths['eval']}",
        f"backend.reward_fn_path={tmp_path / 'reward.py'}", "backend.n_gpus_per_node=1",
        f"backend.max_prompt_length={task.max_prompt_chars + 2}", "backend.micro_batch_size_per_gpu=4",
        "backend.max_num_batched_tokens=512", f"quant={precision}", "correction=acr",
        "rollout.prompts_per_step=4", "algo.group_size=2", "rollout.max_new_tokens=8", "train.minibatches=1",
        f"steps={steps}", "eval_every=2", "ckpt_every=100", "uaq.s=1.0", f"out_dir={tmp_path / 'runs'}",
        f"tracking.tracking_uri={uri}", *overrides,
    ]
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; from suite.cli import main; sys.argv[0] = 'suite'; main()",
                           *args], cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    return proc, uri


def _suite(*args, cwd, timeout=RUN_TIMEOUT_S):
    return subprocess.run([sys.executable, "-c", "import sys; from suite.cli import main; sys.argv[0] = 'suite'; "
                           "sys.exit(main())", *map(str, args)], cwd=cwd, env=dict(os.environ), capture_output=True,
                          text=True, timeout=timeout)


N_EVAL = 64


def test_a_verl_grpo_run_matches_the_embedded_trainer_scores_in_suite_eval_and_reports_beside_it(tmp_path):
    from suite.config import compose_config
    from suite.embedded.export import export
    from suite.embedded.trainer import EmbeddedRun
    from suite.evaluation import read_results

    cell = [f"task.n_eval={N_EVAL}", "warm_start.steps=300", "threads=2", "uaq.s=1.0", "task.difficulty=1",
            f"warm_start.cache_dir={tmp_path / 'warm'}"]
    cfg = compose_config([*cell, f"out_dir={tmp_path / 'runs'}"])
    paths = export(cfg, tmp_path / "export", progress=False)
    run = EmbeddedRun(cfg, str(tmp_path / "embedded-eval"), progress=False)
    run.build()  # the same cached warm start the export wrote
    embedded = run.evaluate()
    max_prompt = max(len(ex.prompt) for ex in run.eval_set + run.train_pool[:2000])

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["run", "backend=verl", "backend.device=cpu", f"backend.python={sys.executable}",
            "backend.param_dtype=fp32", f"backend.model_path={paths['model']}", f"backend.train_files={paths['train']}",
            f"backend.val_files={paths['test']}", f"backend.reward_fn_path={paths['reward']}",
            "backend.n_gpus_per_node=1", f"backend.max_prompt_length={max_prompt + 2}",
            "backend.micro_batch_size_per_gpu=4", "backend.max_num_batched_tokens=2048", f"quant={PRECISION}",
            "correction=acr", "algo=grpo", "rollout.prompts_per_step=4", "algo.group_size=2", "train.minibatches=1",
            "steps=2", "eval_every=2", "ckpt_every=2", *cell, f"out_dir={tmp_path / 'runs'}",
            f"tracking.tracking_uri={uri}"]
    proc = _suite(*args, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:] + root_cause(tmp_path / "runs")
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if (p / "summary.json").is_file()]

    # 1. the run: tags, verl's metric names, one step time per step
    client = mlflow.tracking.MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    r = runs[0]
    assert (r.data.tags["precision"], r.data.tags["correction"]) == (PRECISION, "acr")
    for key in ("rollout_corr/kl", "timing_s/step", "timing_s/update_weights", "actor/pg_loss",
                "actor/acr_relaxed_frac", "val-core/arith/acc/mean_at_1"):
        assert key in r.data.metrics, key
    assert sorted(m.step for m in client.get_metric_history(r.info.run_id, "timing_s/step")) == [1, 2]
    NUMBERS.append("verl GRPO on vLLM CPU, 2 steps: " + ", ".join(
        f"{k} {r.data.metrics[k]:.3g}" for k in ("timing_s/step", "timing_s/update_weights", "rollout_corr/kl",
                                                  "actor/acr_relaxed_frac")))

    # 2. before RL, verl scores the held-out set as the embedded trainer does
    history = client.get_metric_history(r.info.run_id, "val-core/arith/acc/mean_at_1")
    before = min(history, key=lambda m: m.step)  # verl validates before its first step
    assert before.step == 0, [(m.step, m.value) for m in history]
    verl = before.value
    se = math.sqrt(verl * (1 - verl) / N_EVAL + embedded * (1 - embedded) / N_EVAL)
    NUMBERS.append(f"held-out accuracy before RL, {N_EVAL} prompts, greedy: embedded (fp32) {embedded:.3f}, "
                   f"verl on vLLM CPU ({PRECISION}) {verl:.3f}")
    assert 0.1 < embedded < 0.95, f"the warm start must answer some and miss some ({embedded})"
    assert abs(verl - embedded) <= max(0.05, 2 * se), (verl, embedded, se)

    # 3. suite eval of the step-2 checkpoint, in bf16 and by the run's rollout engine
    proc = _suite("eval", run_dir, "--precision", "bf16,rollout", cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    scores = {s.engine: s for s in read_results(run_dir, 2)}
    assert {s.benchmark for s in scores.values()} == {"arith"} and set(scores) == {"bf16", "rollout"}, scores
    for s in scores.values():
        assert s.n_prompts == N_EVAL and s.protocol.samples == 1 and s.protocol.temperature == 0.0
    assert "merged checkpoint" in scores["bf16"].engine_detail
    if PRECISION == "int8":
        assert "W8A8Int8" in scores["rollout"].engine_detail
    assert not (run_dir / "eval" / "merged").exists()  # removed after scoring
    # the trained policy keeps the warm start's level: above the random model's 0 (measured 0.31-0.42 at 48 prompts)
    assert scores["bf16"].acc > 0.05, scores
    metrics = client.get_run(r.info.run_id).data.metrics  # in MLflow, per benchmark and engine, at the step
    for engine, s in scores.items():
        assert metrics[f"eval/arith/{engine}/acc/mean_at_1"] == pytest.approx(s.acc)
    # the rollout engine on the merged checkpoint is the engine verl validated with at that step: its score
    # matches verl's own val-core (a few near-tie greedy answers may differ across batchings)
    verl_val = metrics["val-core/arith/acc/mean_at_1"]
    got = scores["rollout"].acc
    se = math.sqrt(max(verl_val * (1 - verl_val), 1 / N_EVAL) / N_EVAL)
    assert abs(got - verl_val) <= max(0.05, 2 * se), (got, verl_val)
    NUMBERS.append("suite eval of a verl %s run (2 GRPO steps), bf16 / rollout: arith %.3f / %.3f (%+.1f points)" % (
        PRECISION, scores["bf16"].acc, got, 100 * (got - scores["bf16"].acc)))
    # a second call scores nothing again; a missing data file is refused, nothing written
    proc = _suite("eval", run_dir, "--precision", "bf16,rollout", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and "new score" not in proc.stdout, proc.stdout
    assert "suite eval: merged" not in proc.stdout  # nothing merged, no engine started
    config = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(config.replace(str(paths["test"]), str(tmp_path / "gone.parquet")))
    proc = _suite("eval", run_dir, "--benchmarks", "arith", cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "gone.parquet: no such data file" in proc.stderr, proc.stderr

    # 4. the report: an embedded run of the same cell beside it
    _embedded_run_beside(tmp_path, uri, client.get_run(r.info.run_id))


ERROR_MARKS = ("Traceback (most recent call last)", " ERROR ", "out of memory", "OutOfMemory", "corruption",
               "Segmentation fault", "core dumped", "EngineDeadError", "Worker failed")


def root_cause(runs) -> str:
    """The first error verl's log holds (a dead vLLM engine's own traceback comes long before
    the driver's last lines), so a failure in CI says why the engine died."""
    for log in sorted(runs.glob("*/verl.log")):
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if "Warning" not in line and any(m in line for m in ERROR_MARKS):
                return f"\n--- first error in {log}:\n" + "\n".join(lines[max(0, i - 5):i + 40])
    return ""


def _embedded_run_beside(tmp_path, uri, verl_run):
    """An embedded run of the same cell in the same store: the two backends' runs carry the metric
    names the report reads, and `suite report`'s tables hold both, one row per backend."""
    from suite.config import compose_config
    from suite.embedded.trainer import EmbeddedRun
    from suite.report.data import load_runs
    from suite.report.tables import kl_table

    cfg = compose_config([
        f"quant={PRECISION}", "correction=acr", "algo=grpo", "uaq.s=1.0", "steps=2", "eval_every=2", "ckpt_every=2",
        "rollout.prompts_per_step=4", "algo.group_size=2", "rollout.max_new_tokens=8", "task.difficulty=1",
        "task.n_eval=8", "warm_start.steps=20", "warm_start.batch_size=8", "threads=1",
        f"warm_start.cache_dir={tmp_path / 'warm'}", f"out_dir={tmp_path / 'runs'}", f"tracking.tracking_uri={uri}",
    ])
    EmbeddedRun(cfg, str(tmp_path / "embedded-run"), progress=False).run()
    client = mlflow.tracking.MlflowClient(uri)
    emb = [r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
           if r.data.tags.get("backend") == "embedded"]
    assert len(emb) == 1
    shared = {"rollout_corr/kl", "rollout_corr/k3_kl", "timing_s/step", "timing_s/gen", "timing_s/update_weights",
              "actor/pg_loss", "actor/pg_clipfrac", "actor/acr_relaxed_frac", "val-core/arith/acc/mean_at_1"}
    assert shared <= set(verl_run.data.metrics) and shared <= set(emb[0].data.metrics)
    data = load_runs(uri)
    runs = data.runs.set_index("backend")
    assert sorted(runs.index) == ["embedded", "verl"]
    for backend in ("embedded", "verl"):
        assert runs.loc[backend, "status"] == "FINISHED"
        assert runs.loc[backend, "acc"] == pytest.approx(
            (verl_run if backend == "verl" else emb[0]).data.metrics["val-core/arith/acc/mean_at_1"])
    kl = kl_table(data.runs)
    assert sorted(kl["backend"]) == ["embedded", "verl"], kl.to_string()
    assert kl["kl_last"].notna().all(), kl.to_string()

