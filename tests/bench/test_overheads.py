"""benchmarks/overheads.py (a development benchmark, not installed): the sweep file it writes, the
meter, and a short real measurement."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import overheads  # noqa: E402  (benchmarks/ is a directory of scripts, not a package)

main = overheads.main


def test_grid_has_1000_distinct_cells():
    cells = overheads.grid_cells(1000)
    assert len(cells) == 1000 and len({tuple(c.values()) for c in cells}) == 1000
    assert cells[0] == {"quant": "fp32", "correction": "naive", "uaq.s": "1.0", "seed": "0"}
    assert cells[1]["seed"] == "1" and cells[10]["uaq.s"] == "1.25"  # seed varies fastest


def test_meter_counts_outermost_calls_only():
    class Logger:
        def outer(self):
            return self.inner() + 1

        def inner(self):
            return 1

    meter = overheads._Meter()
    with overheads.metered(Logger, ("outer", "inner"), meter):
        assert Logger().outer() == 2
        Logger().inner()
    assert meter.calls == 2 and meter.seconds > 0
    assert Logger.outer.__name__ == "outer"  # restored afterwards
    Logger().outer()
    assert meter.calls == 2


@pytest.mark.slow  # a real run, a real sqlite store, `suite report`: ~40 s on 2 quiet cores
def test_overheads_short_run(tiny_run, tmp_path, capsys):
    pytest.importorskip("suite.sweep.spec")
    pytest.importorskip("suite.report.cli")
    rc = main(["--json", "--cells", "6", "--runs", "5", "--api-runs", "2", "--report-steps", "2",
               "--no-notebook",
               "--repeats", "1", "--warmup", "0", "--run-overrides", " ".join(tiny_run),
               "--tracking-uri", f"sqlite:///{tmp_path / 'bench.db'}", "--out", str(tmp_path / "out")])
    assert rc == 0
    out, err = capsys.readouterr()
    rows = {r["item"]: r for r in json.loads(out)}
    sweep = rows["sweep expand + validate"]
    assert sweep["n"] == 6 and sweep["per_item_ms"] == pytest.approx(1e3 * sweep["seconds"] / 6)
    wall, ml, js = rows["run wall time"], rows["MLflow logging (sqlite)"], rows["JSONL logging"]
    assert wall["n"] == 4 and 0 < ml["seconds"] < wall["seconds"] and 0 < js["seconds"] < wall["seconds"]
    assert ml["share_of_run"] == pytest.approx(ml["seconds"] / wall["seconds"])
    assert rows["suite report --no-notebook"]["n"] == 5 and rows["suite report --no-notebook"]["seconds"] > 0
    assert rows["MLflow: write runs (MlflowClient)"]["n"] == 2
    # 2 runs written through MLflow, 3 copied inside the store: the report reads all 5, finished
    assert "suite report: 5 FINISHED" in err


def test_bad_options(capsys):
    assert main(["--parts", "sweep,disk", "--no-mlflow"]) == 2
    assert "--parts='disk' is not allowed; choose from: sweep, mlflow, report" in capsys.readouterr().err
    assert main(["--cells", "1001", "--no-mlflow"]) == 2
    assert "--cells=1001 must be in 1..1000" in capsys.readouterr().err
