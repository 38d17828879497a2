"""`suite eval --model` on vLLM's CPU build: a model that is no run, scored on DeepScaleR's five benchmarks by
the recipe's protocol and the suite's math grader, its row paired in QuRL's layout. (`suite eval` of a verl
run's checkpoint is checked on the run test_verl_grpo.py makes.)"""

from __future__ import annotations

import os
import sys

import pytest
from test_verl_grpo import _suite
from vllm_tiny import NUMBERS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(os.environ.get("SUITE_VLLM_CPU_EMULATE")), reason=(
    "SUITE_VLLM_CPU_EMULATE: verl's workers are subprocesses, which the emulation does not reach"))]

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
