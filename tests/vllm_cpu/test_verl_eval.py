"""`suite eval` of a verl run on vLLM's CPU build: an INT8 (bf16 where vLLM CPU serves no INT8) verl cell,
started from the embedded export of a warm start and trained 2 GRPO steps, then its checkpoint merged by
verl's model merger and scored per benchmark in bf16 and by the run's rollout engine. Two benchmarks stand
in for the papers' (the arith task's held-out sets at difficulty 1 and 2, data sources arith-d1 and
arith-d2, graded by the task's own verify). The rollout engine's score must match verl's own validation at
that step (the same engine on the same weights); the bf16 score is the trained policy's, and the
difference between the two is the INT8 engine's own error. About 7 minutes on 2 cores."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from test_verl_grpo import PRECISION, RUN_TIMEOUT_S, root_cause
from vllm_tiny import NUMBERS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(os.environ.get("SUITE_VLLM_CPU_EMULATE")), reason=(
    "SUITE_VLLM_CPU_EMULATE: verl's workers are subprocesses, which the emulation does not reach"))]

N_EVAL = 48
REWARD = '''
import re

from suite.embedded.tasks import make_task
from suite.embedded.traces import Example

TASKS = {}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # the held-out sets are <task>-d<level>; the exported training set is the task's own name
    m = re.fullmatch(r"(\\w+)-d(\\d)", data_source)
    name, level = (m.group(1), int(m.group(2))) if m else (data_source, int((extra_info or {}).get("difficulty", 1)))
    task = TASKS.setdefault((name, level), make_task(name, level))
    return float(task.verify(solution_str, Example(prompt="", response="", answer=str(ground_truth))))
'''


def _suite(*args, cwd, timeout=RUN_TIMEOUT_S):
    return subprocess.run([sys.executable, "-c", "import sys; from suite.cli import main; sys.argv[0] = 'suite'; "
                           "sys.exit(main())", *map(str, args)], cwd=cwd, env=dict(os.environ), capture_output=True,
                          text=True, timeout=timeout)


def _held_out(tmp_path):
    """arith-d1 and arith-d2: each level's held-out prompts, in one parquet."""
    import pandas as pd

    from suite.embedded.tasks import make_split, make_task
    from suite.embedded.trainer import EVAL_SEED

    rows = []
    for level in (1, 2):
        for i, ex in enumerate(make_split(make_task("arith", level), N_EVAL, EVAL_SEED, "eval")):
            rows.append({"data_source": f"arith-d{level}", "prompt": [{"role": "user", "content": ex.prompt}],
                         "reward_model": {"style": "rule", "ground_truth": ex.answer}, "extra_info": {"index": i}})
    path = tmp_path / "held_out.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_suite_eval_scores_a_verl_run_in_bf16_and_by_its_rollout_engine(tmp_path):
    from suite.config import compose_config
    from suite.embedded.export import export
    from suite.evaluation import read_results

    cell = [f"task.n_eval={N_EVAL}", "warm_start.steps=300", "threads=2", "uaq.s=1.0", "task.difficulty=1",
            f"warm_start.cache_dir={tmp_path / 'warm'}"]
    paths = export(compose_config([*cell, f"out_dir={tmp_path / 'runs'}"]), tmp_path / "export", progress=False)
    (tmp_path / "reward.py").write_text(REWARD)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["run", "backend=verl", "backend.device=cpu", f"backend.python={sys.executable}",
            "backend.param_dtype=fp32", f"backend.model_path={paths['model']}", f"backend.train_files={paths['train']}",
            f"backend.val_files={_held_out(tmp_path)}", f"backend.reward_fn_path={tmp_path / 'reward.py'}",
            "backend.n_gpus_per_node=1", "backend.max_prompt_length=32", "backend.micro_batch_size_per_gpu=4",
            "backend.max_num_batched_tokens=2048", f"quant={PRECISION}", "correction=acr", "algo=grpo",
            "rollout.prompts_per_step=4", "algo.group_size=2", "train.minibatches=1", "steps=2", "eval_every=2",
            "ckpt_every=2", *cell, f"out_dir={tmp_path / 'runs'}", f"tracking.tracking_uri={uri}"]
    proc = _suite(*args, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:] + root_cause(tmp_path / "runs")
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if (p / "summary.json").is_file()]

    proc = _suite("eval", run_dir, "--precision", "bf16,rollout", cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    scores = {(s.benchmark, s.engine): s for s in read_results(run_dir, 2)}
    assert set(scores) == {(b, e) for b in ("arith-d1", "arith-d2") for e in ("bf16", "rollout")}, scores
    for s in scores.values():
        assert s.n_prompts == N_EVAL and s.protocol.samples == 1 and s.protocol.temperature == 0.0
    assert "merged checkpoint" in scores[("arith-d1", "bf16")].engine_detail
    if PRECISION == "int8":
        assert "W8A8Int8" in scores[("arith-d1", "rollout")].engine_detail
    assert not (run_dir / "eval" / "merged").exists()  # removed after scoring
    # the trained policy learned the warm start's level: above the random model's 0 (at least 3 of 48 right;
    # measured 0.31-0.42 here, and an exported 300-step warm start scores 0.25 in test_cross_backend.py)
    assert scores[("arith-d1", "bf16")].acc > 0.05, scores

    # in MLflow, per benchmark and engine, at the checkpoint's step
    import mlflow

    rid = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    metrics = mlflow.tracking.MlflowClient(uri).get_run(rid).data.metrics
    for (bench, engine), s in scores.items():
        assert metrics[f"eval/{bench}/{engine}/acc/mean_at_1"] == pytest.approx(s.acc)

    # the rollout engine on the merged checkpoint is the engine verl validated with at that step: its score
    # matches verl's own val-core (a few near-tie greedy answers may differ across batchings)
    for level in (1, 2):
        verl_val = metrics[f"val-core/arith-d{level}/acc/mean_at_1"]
        got = scores[(f"arith-d{level}", "rollout")].acc
        se = math.sqrt(max(verl_val * (1 - verl_val), 1 / N_EVAL) / N_EVAL)
        assert abs(got - verl_val) <= max(0.05, 2 * se), (level, got, verl_val)
    gap = {b: scores[(b, "rollout")].acc - scores[(b, "bf16")].acc for b in ("arith-d1", "arith-d2")}
    NUMBERS.append("suite eval of a verl %s run (2 GRPO steps), bf16 / rollout: " % PRECISION + ", ".join(
        f"{b} {scores[(b, 'bf16')].acc:.3f} / {scores[(b, 'rollout')].acc:.3f} ({100 * g:+.1f} points)"
        for b, g in gap.items()))

    # a second call scores nothing again; a missing data file is refused, nothing written
    proc = _suite("eval", run_dir, "--precision", "bf16,rollout", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and "new score" not in proc.stdout, proc.stdout
    assert "suite eval: merged" not in proc.stdout  # nothing merged, no engine started
    config = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(config.replace(str(_held_out(tmp_path)), str(tmp_path / "gone.parquet")))
    proc = _suite("eval", run_dir, "--benchmarks", "arith-d1", cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "gone.parquet: no such data file" in proc.stderr, proc.stderr


# DeepScaleR's five benchmarks, as `suite data prepare` names them: a base model's row pairs with all five
DEEPSCALER_5 = ("aime2024", "numina_amc_aime", "HuggingFaceH4/MATH-500", "minerva_math", "olympiadbench")


def test_suite_eval_model_scores_a_base_model_and_its_row_pairs_in_the_papers_layout(tmp_path):
    """`suite eval --model PATH recipe=qurl-deepscaler ...`: a model that is no run (here the embedded export of a
    warm start, in a directory named as the 1.5B distill the published Base (SFT) row is about) scored on
    DeepScaleR's five benchmarks with the recipe's protocol (Avg@32 at T 0.6, top_p 0.95; a 24-token budget
    instead of 32K for the tiny model), graded by the suite's math grader; its scores land in MLflow as a
    correction=base run that QuRL Table 3's Base (SFT) row pairs with in the paper's layout. The grader of each
    benchmark is recorded beside its score."""
    import shutil

    import pandas as pd

    from suite.config import compose_config
    from suite.embedded.export import export
    from suite.evaluation import read_results
    from suite.report import tables as T
    from suite.report.data import load_runs
    from suite.report.paper import load_paper
    from suite.scoring import grader_for

    cell = ["task.n_eval=8", "warm_start.steps=100", "threads=2", "uaq.s=1.0", "task.difficulty=1",
            f"warm_start.cache_dir={tmp_path / 'warm'}"]
    paths = export(compose_config([*cell, f"out_dir={tmp_path / 'runs'}"]), tmp_path / "export", progress=False)
    model = tmp_path / "DeepSeek-R1-Distill-Qwen-1.5B-tiny"
    shutil.copytree(paths["model"], model)
    rows = [{"data_source": ds, "prompt": [{"role": "user", "content": f"{i}+{i}="}],
             "reward_model": {"style": "rule", "ground_truth": str(2 * i)}, "extra_info": {"index": i}}
            for ds in DEEPSCALER_5 for i in range(2)]
    val = tmp_path / "five.parquet"
    pd.DataFrame(rows).to_parquet(val)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    over = ["recipe=qurl-deepscaler", f"backend.val_files={val}", "backend.device=cpu",
            f"backend.python={sys.executable}", "backend.max_prompt_length=32", "backend.val_max_new_tokens=24",
            "backend.n_gpus_per_node=1", "backend.max_num_batched_tokens=2048", "backend.micro_batch_size_per_gpu=4",
            f"out_dir={tmp_path / 'runs'}", f"tracking.tracking_uri={uri}"]
    proc = _suite("eval", "--model", model, *over, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("base-")]
    scores = {s.benchmark: s for s in read_results(run_dir, 0) if s.metric_name == "mean@32"}
    assert set(scores) == set(DEEPSCALER_5)
    for s in scores.values():
        assert (s.step, s.engine, s.n_prompts) == (0, "bf16", 2)
        assert (s.protocol.samples, s.protocol.temperature, s.protocol.top_p, s.protocol.max_new_tokens) == (
            32, 0.6, 0.95, 24)
        assert s.grader == grader_for(s.benchmark).label() and "as given" in s.engine_detail
    assert {s.metric_name for s in read_results(run_dir, 0)} == {"mean@32", "mean@1", "pass@32"}
    assert not (run_dir / "eval" / "merged").exists() and model.is_dir()  # the given model is left as it is

    loaded = load_runs(uri, experiment="suite")
    grid = T.layout(T.paper_vs_main(T.eval_scores(loaded.runs), load_paper()["main"]), "QuRL", "table3")
    grid = grid.set_index("")
    mean5 = 100 * sum(s.acc for s in scores.values()) / 5
    assert grid.loc["Base (SFT), BF16", "Avg."] == f"48.80 | ours {mean5:.1f} (n=1)", grid
    assert "ours" not in grid.loc["QuRL, INT8", "Avg."]  # a base model pairs with the base row only
    NUMBERS.append("suite eval --model (tiny export as a 1.5B base, DeepScaleR's 5 at Avg@32): " + ", ".join(
        f"{b} {s.acc:.3f}" for b, s in scores.items()))
