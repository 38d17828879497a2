"""`suite sweep --dry-run` sizes a sweep: cells, parallelism, the estimated time per cell and in
all (figures computed by hand below), and on SLURM a preview of the sbatch script and of each
cell's command, with nothing of a launch created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from suite.cli import main

REPO = Path(__file__).resolve().parents[2]
GSM8K = ["backend=verl", "recipe=qurl-gsm8k", "backend.model_path=/m", "backend.train_files=/t.parquet",
         "backend.val_files=/v.parquet"]


def _dry(capsys, *argv) -> str:
    code = main(["sweep", *argv, "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_paper_tables_on_a_cluster_runs_as_wide_as_the_profile_with_an_estimate_and_a_preview(tmp_path, capsys):
    out = _dry(capsys, str(REPO / "experiments" / "paper_tables.yaml"), *GSM8K, "launcher=slurm", "cluster=h100x8",
               f"out_dir={tmp_path}")
    # the file's max_parallel: 1 sizes the laptop; the array takes the profile's array_parallelism
    assert "33 cells, launcher slurm (profile h100x8), at most 8 at once" in out
    # qurl-gsm8k: 10-20 H100-hours a 435-step run, 8 GPUs a job -> 1.25-2.5 h a cell; 33 cells 8 at once:
    # 33 x 1.25 / 8 = 5.16 h packed, 5 waves x 2.5 h = 12.5 h at most
    assert "estimate per cell: 1.2 h to 2.5 h (33 cells; recipe qurl-gsm8k: ~10-20 H100-hours" in out
    assert "estimate in all: 5.2 h to 12.5 h (33 cells, 8 at once: 5 waves)" in out
    preview = tmp_path / "_sweeps" / "paper_tables" / "dry-run"
    script = (preview / "sbatch.sh").read_text()
    for line in ("#SBATCH --array=0-32%8", "#SBATCH --gpus-per-node=8", "#SBATCH --job-name=paper_tables",
                 "#SBATCH --time=720", "#SBATCH --signal=USR2@300", "-m submitit.core._submit"):
        assert line in script, line
    commands = (preview / "commands.sh").read_text()
    assert commands.count("python3 -m verl.trainer.main_ppo") == 33 and "trainer.n_gpus_per_node=8" in commands
    # the table names the short command a job runs; nothing of a launch exists
    assert "$ suite run backend=verl recipe=qurl-gsm8k" in out and "main_ppo" not in out
    assert sorted(p.name for p in (tmp_path / "_sweeps" / "paper_tables").iterdir()) == ["dry-run"]


def test_max_parallel_on_the_command_line_caps_the_array(tmp_path, capsys):
    out = _dry(capsys, str(REPO / "experiments" / "paper_tables.yaml"), *GSM8K, "launcher=slurm", "cluster=h100x8",
               "--max-parallel", "3", f"out_dir={tmp_path}")
    assert "at most 3 at once" in out and "(33 cells, 3 at once: 11 waves)" in out
    assert "#SBATCH --array=0-32%3" in (tmp_path / "_sweeps" / "paper_tables" / "dry-run" / "sbatch.sh").read_text()


def test_an_embedded_estimate_is_this_machines_measured_step_time(tmp_path, capsys):
    from suite.config import compose_config, run_id

    sweep = tmp_path / "s.yaml"
    base = ["model=tiny", "steps=40", "eval_every=10", f"out_dir={tmp_path / 'runs'}"]
    sweep.write_text(yaml.safe_dump({"name": "s", "base": base, "matrix": {"seed": [0, 1, 2]},
                                     "launcher": {"max_parallel": 2}}))
    out = _dry(capsys, str(sweep))
    assert "estimate per cell: none for 3 cells" in out and "run some first, e.g. `--only seed=0`" in out
    # a finished run of the same model and rollout here (another seed): its timings are the measure
    cfg = compose_config([*base, "seed=9"])
    run = tmp_path / "runs" / run_id(cfg)
    run.mkdir(parents=True)
    from omegaconf import OmegaConf

    OmegaConf.save(cfg, run / "config.yaml")
    rows = [{"step": i, "metrics": {"timing_s/step": s}} for i, s in enumerate([1.0, 3.0, 2.0], 1)]
    rows.append({"step": 4, "metrics": {"timing_s/testing": 30.0}})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text("{}")
    out = _dry(capsys, str(sweep))
    # median 2.0 s a step x 40 steps + (40 // 10 + 2) evaluations x 30 s = 260 s = 4.33 min a cell
    assert "estimate per cell: 4 min (3 cells; 2.00 s a step measured here" in out, out
    # three cells, two at once: 2 waves of 4.33 min at most, 3 x 4.33 / 2 = 6.5 min packed
    assert "estimate in all: 6 min to 9 min (3 cells, 2 at once: 2 waves)" in out, out


@pytest.mark.parametrize("only, cells", [("seed=0", 11), ("seed=0,2", 22), ("quant=bf16", 3),
                                         # one key twice is either value, as seed=0,2 is; two keys are both
                                         (("seed=0", "seed=2"), 22), (("seed=0", "quant=bf16"), 1)])
def test_only_narrows_the_matrix_keeping_cell_indices(only, cells, tmp_path, capsys):
    flags = [a for o in ((only,) if isinstance(only, str) else only) for a in ("--only", o)]
    out = _dry(capsys, str(REPO / "experiments" / "paper_tables.yaml"), f"out_dir={tmp_path}", *flags)
    assert f"paper_tables: {cells} cells" in out
    if only == "quant=bf16":  # the first three cells of the full matrix, indices 0-2
        assert [ln.split()[0] for ln in out.splitlines() if ln[:1].isdigit()] == ["0", "1", "2"]
    if only == "seed=0":  # every third cell of the full matrix
        assert [ln.split()[0] for ln in out.splitlines() if ln[:1].isdigit()][:3] == ["0", "3", "6"]
