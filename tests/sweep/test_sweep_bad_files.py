"""Bad sweep and tune files refused before anything starts: duplicate keys, non-UTF-8 text,
huge matrices (counted, not expanded), non-finite values, `--max-parallel 0`."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from _sweep_helpers import TINY, child_env, write_sweep
from suite.sweep.spec import SweepError, load_sweep


def _tiny_file(tmp_path, body: str) -> str:
    base = "\n".join(f"  - {line}" for line in TINY)
    return str(write_sweep(tmp_path / "s.yaml", f"name: bad\nbase:\n{base}\n{body}"))


def test_a_duplicated_matrix_axis_is_refused_naming_key_and_line(tmp_path, sweep_env):
    path = _tiny_file(tmp_path, "matrix:\n  seed: [0, 1]\n  quant: [int8]\n  seed: [2]\n")
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    msg = str(err.value)
    assert path in msg and "duplicate key 'seed'" in msg and "line" in msg


def test_a_duplicated_top_level_key_is_refused(tmp_path, sweep_env):
    path = _tiny_file(tmp_path, "matrix:\n  seed: [0]\nmatrix:\n  seed: [1]\n")
    with pytest.raises(SweepError, match="duplicate key 'matrix'"):
        load_sweep(path)


def test_a_non_utf8_file_names_the_file(tmp_path, sweep_env):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\nmatrix:\n  seed: [0]\n".encode("latin-1"))
    with pytest.raises(SweepError) as err:
        load_sweep(str(path))
    assert str(path) in str(err.value) and "UTF-8" in str(err.value)


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_a_non_finite_matrix_value_is_refused(tmp_path, sweep_env, value):
    path = _tiny_file(tmp_path, f"matrix:\n  train.lr: [1.0e-4, {value}]\n")
    with pytest.raises(SweepError, match="train.lr.*not a finite number"):
        load_sweep(path)


def test_a_huge_matrix_is_refused_in_seconds_and_the_limit_can_be_raised(tmp_path, sweep_env):
    # 10^6 cells: six axes of ten seeds-like values; counted from the axis lengths, never expanded
    axes = "".join(f"  +tracking.tags.a{i}: [{', '.join(str(v) for v in range(10))}]\n" for i in range(6))
    path = _tiny_file(tmp_path, "matrix:\n" + axes)
    start = time.perf_counter()
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    assert time.perf_counter() - start < 5
    assert "1,000,000 cells" in str(err.value) and "--max-cells" in str(err.value)
    # include entries count too
    small = _tiny_file(tmp_path, "matrix:\n  seed: [0, 1, 2]\ninclude:\n  - {uaq.s: [1.0, 1.25]}\n")
    with pytest.raises(SweepError, match="9 cells"):
        load_sweep(small, ["launcher.max_cells=8"])
    assert len(load_sweep(small, ["launcher.max_cells=9"]).cells) == 9


@pytest.mark.parametrize("line, key", [
    ("launcher.max_parallel=0", "max_parallel"), ("launcher.poll_s=inf", "poll_s"),
    ("launcher.poll_s=0", "poll_s"), ("launcher.max_cells=0", "max_cells"), ("resources.mem_gb=.inf", "mem_gb"),
])
def test_bad_launcher_values_are_refused(tmp_path, sweep_env, line, key):
    path = _tiny_file(tmp_path, "matrix:\n  seed: [0]\n")
    with pytest.raises(SweepError, match=key):
        load_sweep(path, [line])


def test_cli_max_parallel_0_and_max_cells_flags(tmp_path, sweep_env):
    """Through the real command: `--max-parallel 0` is refused (it used to be dropped), `--max-cells`
    lowers (or raises) the limit; exit 2, and nothing is created."""
    path = _tiny_file(tmp_path, "matrix:\n  seed: [0, 1]\n")
    out = tmp_path / "runs"
    for flags, expected in ((["--max-parallel", "0"], "max_parallel=0"), (["--max-cells", "1"], "2 cells")):
        proc = subprocess.run([sys.executable, "-m", "suite.cli", "sweep", path, "--dry-run", *flags,
                               f"out_dir={out}"], capture_output=True, text=True, env=child_env(), timeout=300)
        assert proc.returncode == 2 and expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists() and not (tmp_path / "mlflow.db").exists()


def test_a_bad_tune_file_names_the_file(tmp_path):
    from suite.tune.spec import TuneSpecError, load_tune_file

    dup = tmp_path / "dup.yaml"
    dup.write_text("name: t\nn_trials: 2\nn_trials: 3\n")
    with pytest.raises(TuneSpecError, match="duplicate key 'n_trials'"):
        load_tune_file(str(dup))
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [t\n")
    with pytest.raises(TuneSpecError) as err:
        load_tune_file(str(broken))
    assert str(broken) in str(err.value) and "not valid YAML" in str(err.value)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(TuneSpecError, match="not UTF-8"):
        load_tune_file(str(latin))
