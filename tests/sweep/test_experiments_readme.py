"""experiments/README.md's "runs" column is each sweep file's cell count, so it cannot drift (it
once said 18 for ablation_uaq.yaml, which expands to 21)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from suite.sweep.spec import load_sweep

REPO = Path(__file__).resolve().parents[2]
ROWS = re.findall(r"^\| `([\w.]+\.yaml)` \|.*\| (\d+) \|$", (REPO / "experiments" / "README.md").read_text(),
                  flags=re.M)


def test_the_table_lists_the_papers_matrices():
    assert {f for f, _ in ROWS} >= {"quickstart.yaml", "main_table.yaml", "paper_tables.yaml", "ablation_uaq.yaml"}


@pytest.mark.slow
@pytest.mark.parametrize("name, runs", ROWS)
def test_each_row_counts_the_files_cells(name, runs, tmp_path):
    assert len(load_sweep(REPO / "experiments" / name, [f"out_dir={tmp_path}"]).cells) == int(runs)
