"""Bad sweep files, tune files and verb flags, by class: each exits 2 with a message naming the
key or flag and its value (and, where there is one, the allowed domain), no traceback, and
nothing created: no run dir, no sweep state, no MLflow store, no Optuna study, nothing submitted.

(`suite run` configs have their own table: tests/test_bad_inputs.py.) Rows go through the CLI's
entry point in-process (`suite.cli.main`), from an empty working directory where every default
output (runs/, mlflow.db, reports/, bench_results/) would land; one row per class also runs
as a real `python -m suite.cli` process.
"""

from __future__ import annotations

import json
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suite.cli import main

TINY = ["model=tiny", "steps=1", "eval_every=1", "ckpt_every=1", "task.n_eval=4", "warm_start.steps=0", "threads=1"]
_BASE = "base: [" + ", ".join(TINY) + "]\n"

# (class, argv with FILE standing for the file written from `text`, file text or None, what the message names)
BAD: list[tuple[str, list[str], str | None, list[str]]] = []


def _sweep(cls: str, rows: list[tuple[str, list[str]]], *, base: bool = True, flags: tuple[str, ...] = ()) -> None:
    for body, names in rows:
        BAD.append((cls, ["sweep", "FILE", *flags], (("name: bad\n" + _BASE) if base else "") + body, names))


# --- sweep files ---------------------------------------------------------------------------
_sweep("sweep matrix", [
    ("matrix: {seed: []}\n", ["seed", "no values"]),
    ("matrix: {seed: {a: 1}}\n", ["seed", "must be a list"]),
    ("matrix: {nosuch.key: [1]}\n", ["nosuch.key", "no such key"]),
    ("matrix: {train.lr: [1.0e-4, .inf]}\n", ["train.lr", "inf"]),
    ("matrix: {train.lr: [.nan]}\n", ["train.lr", "nan"]),
    ("matrix: {uaq.s: [-.inf]}\n", ["uaq.s", "inf"]),
    ("matrix: {train.lr: [-1.0e-3]}\n", ["train.lr", "-0.001"]),
    ("matrix: {train.lr: [fast]}\n", ["train.lr", "fast"]),
    ("matrix: {quant: [int9]}\n", ["quant", "int9"]),
    ("matrix: {train.epochs: [1.5]}\n", ["train.epochs", "1.5"]),
    ("matrix: {algo.gamma: [1.5]}\n", ["algo.gamma", "1.5"]),
    ("matrix: {algo.group_size: [0]}\n", ["algo.group_size", "0"]),
    ("matrix: {train.grad_clip: [-1]}\n", ["train.grad_clip", "-1"]),
    ("matrix: {seed: [[0, 1]]}\n", ["seed", "scalar"]),
    ("matrix: {seed: [0, 0]}\n", ["seed", "more than once"]),
    ("matrix: [seed, quant]\n", ["matrix", "mapping"]),
    ("matrix: {seed: [0]}\ninclude: [{nosuch: 1}]\n", ["nosuch", "no such key"]),
    ("matrix: {seed: [0, 1]}\nexclude: [{seed: 7}]\n", ["exclude", "matches no cell"]),
    ("matrix: {}\n", ["matrix is empty"]),
    ("matrix: {seed: [0, 1, 2]}\nlauncher: {max_cells: 2}\n", ["3 cells", "max_cells"]),
])
# a cell's backend package missing here (this environment has verl, not vLLM: the README's install)
if importlib.util.find_spec("vllm") is None:
    _sweep("sweep file", [("name: bad\nbase: [backend=verl, backend.model_path=/m, backend.train_files=/t, "
                           "backend.val_files=/v, quant=int8]\nmatrix: {seed: [0]}\n",
                           ["cell 0", "backend=verl needs vllm", "nothing was submitted"])], base=False)
_sweep("sweep file", [
    ("matrix: {seed: [0]}\nbogus: 1\n", ["bogus", "allowed"]),
    ("name: ''\n" + _BASE + "matrix: {seed: [0]}\n", ["name", "required"]),
    ("name: a/b\n" + _BASE + "matrix: {seed: [0]}\n", ["name", "a/b"]),
    ("name: bad\nbase: model=tiny\nmatrix: {seed: [0]}\n", ["base", "list"]),
    ("name: bad\nbase: [nosuch=1]\nmatrix: {seed: [0]}\n", ["nosuch", "no such key"]),
    ("name: bad\nbase: [train.lr=.inf, steps=1]\nmatrix: {seed: [0]}\n", ["train.lr", "inf"]),
    ("name: bad\n" + _BASE + "matrix: {seed: [0]}\nname: again\n", ["duplicate key 'name'"]),
    ("name: [unclosed\n", ["FILE", "not valid YAML", "at line 2, column 1"]),
    ("- a\n- b\n", ["FILE", "must be a mapping"]),
    ("", ["FILE", "must be a mapping"]),
    ("name: bad\n" + _BASE + "matrix: {seed: [0]}\ndescription: [1]\n", ["description", "string"]),
    ("name: bad\n" + _BASE + "matrix: {seed: [0]}\nbase: [steps=2]\n", ["duplicate key 'base'"]),
], base=False)
# a cell its task cannot serve (suite.embedded.config) is refused before anything is submitted
_sweep("sweep task", [
    ("matrix: {rollout.max_new_tokens: [16, 100000]}\n", ["cell 1", "rollout.max_new_tokens", "100000", "[1, 244]"]),
    ("matrix: {task: [arith, word], task.difficulty: [4]}\n", ["cell 1", "task.difficulty", "task=word", "1, 2, 3"]),
    ("matrix: {seed: [0]}\ninclude: [{task.difficulty: 1, task.n_eval: 76}]\n",
     ["cell 1", "task.n_eval", "76", "[1, 75]"]),
    ("matrix: {task: [word, arith], warm_start.flaw_op: ['/']}\n", ["cell 1", "warm_start.flaw_op", "task=arith"]),
    ("matrix: {rollout.prompts_per_step: [4, 20001]}\n", ["cell 1", "rollout.prompts_per_step", "[1, 20000]"]),
])
_sweep("sweep task --dry-run", [
    ("matrix: {rollout.max_new_tokens: [32, 250]}\n", ["cell 1", "rollout.max_new_tokens", "250", "[1, 244]"]),
    ("matrix: {task: [word], task.difficulty: [3, 4]}\n", ["cell 1", "task.difficulty", "1, 2, 3"]),
    ("matrix: {seed: [0]}\ninclude: [{task.n_eval: 2918}]\n", ["cell 1", "task.n_eval", "2918", "[1, 2917]"]),
    ("matrix: {seed: [0]}\ninclude: [{warm_start.flaw_op: '/'}]\n", ["cell 1", "warm_start.flaw_op", "'/'"]),
    ("matrix: {task.difficulty: [2, 1]}\ninclude: [{task.n_eval: 100}]\n", ["cell 3", "task.n_eval", "100", "[1, 75]"]),
], flags=("--dry-run",))
# an out_dir the file system cannot hold: refused before the matrix is printed or anything is created
_sweep("sweep task --dry-run", [("name: bad\nbase: [" + ", ".join([*TINY, "out_dir=" + "d" * 300]) + "]\n"
                                 "matrix: {seed: [0]}\n", ["out_dir", "300 bytes", "allows 255"])],
       base=False, flags=("--dry-run",))
_sweep("sweep launcher", [
    ("matrix: {seed: [0]}\nlauncher: {name: pbs}\n", ["launcher.name", "pbs", "local, slurm"]),
    ("matrix: {seed: [0]}\nlauncher: {max_parallel: 0}\n", ["max_parallel", "0", "> 0"]),
    ("matrix: {seed: [0]}\nlauncher: {max_parallel: -1}\n", ["max_parallel", "-1", "> 0"]),
    ("matrix: {seed: [0]}\nlauncher: {max_parallel: two}\n", ["max_parallel", "two"]),
    ("matrix: {seed: [0]}\nlauncher: {poll_s: .inf}\n", ["poll_s", "inf", "finite"]),
    ("matrix: {seed: [0]}\nlauncher: {poll_s: 0}\n", ["poll_s", "0", "> 0"]),
    ("matrix: {seed: [0]}\nlauncher: {poll_s: 1.0e+12}\n", ["poll_s", "1000000000000.0", "86400"]),
    ("matrix: {seed: [0]}\nlauncher: {max_cells: 0}\n", ["max_cells", "0", "> 0"]),
    ("matrix: {seed: [0]}\nlauncher: {max_requeue: -1}\n", ["max_requeue", ">= 0"]),
    ("matrix: {seed: [0]}\nlauncher: {bogus: 1}\n", ["bogus"]),
    ("matrix: {seed: [0]}\nlauncher: local\n", ["launcher"]),
    ("matrix: {seed: [0]}\nlauncher: {name: slurm, profile: nosuch}\n", ["nosuch", "profile"]),
    ("matrix: {seed: [0]}\nlauncher: {name: slurm, profile: '../../etc/x'}\n", ["../../etc/x"]),
    ("matrix: {seed: [0]}\nresources: {timeout_min: -5}\n", ["timeout_min", "-5", "> 0"]),
    ("matrix: {seed: [0]}\nresources: {mem_gb: .nan}\n", ["mem_gb", "nan"]),
    ("matrix: {seed: [0]}\nresources: {cpus_per_task: 0}\n", ["cpus_per_task", "0"]),
    ("matrix: {seed: [0]}\nresources: {gpus_per_node: -1}\n", ["gpus_per_node", ">= 0"]),
    ("matrix: {seed: [0]}\nresources: {bogus: 1}\n", ["bogus"]),
    ("matrix: {seed: [0]}\nresources: {nodes: 2}\n", ["nodes", "2"]),
])


# --- tune files ----------------------------------------------------------------------------
def _tune(cls: str, rows: list[tuple[str, list[str]]]) -> None:
    for body, names in rows:
        BAD.append((cls, ["tune", "FILE"], body, names))


def _tune_file(space: str = "  uaq.s: {type: float, low: 1.0, high: 2.0}\n", **top: str) -> str:
    fields = {"study": "t", "storage": "sqlite:///optuna.db", "out_dir": "runs", "base": json.dumps(TINY),
              "objective": "{metric: val-core/arith/acc/mean@1, direction: maximize}", "n_trials": "2",
              "parallelism": "1", **top}
    return "".join(f"{k}: {v}\n" for k, v in fields.items() if v is not None) + "space:\n" + space


_tune("tune space", [
    (_tune_file("  uaq.s: {type: float, low: 2.0, high: 1.0}\n"), ["space.uaq.s", "2.0", "1.0"]),
    (_tune_file("  uaq.s: {type: float, low: 1.5, high: 1.5}\n"), ["space.uaq.s", "1.5"]),
    (_tune_file("  train.lr: {type: float, low: 0.0, high: 1.0e-3, log: true}\n"), ["space.train.lr", "log"]),
    (_tune_file("  uaq.s: {type: float, low: .nan, high: 2.0}\n"), ["space.uaq.s", "nan"]),
    (_tune_file("  uaq.s: {type: float, low: 1.0, high: .inf}\n"), ["space.uaq.s", "inf"]),
    (_tune_file("  uaq.s: {type: double, low: 1.0, high: 2.0}\n"),
     ["space.uaq.s", "double", "float, int, categorical"]),
    (_tune_file("  train.minibatches: {type: int, low: 1.5, high: 4}\n"), ["space.train.minibatches", "1.5"]),
    (_tune_file("  correction.mode: {type: categorical, choices: []}\n"), ["space.correction.mode", "choices"]),
    (_tune_file("  correction.mode: {type: categorical, choices: [acr, acr]}\n"), ["space.correction.mode", "acr"]),
    (_tune_file("  uaq.scale: {type: float, low: 1.0, high: 2.0}\n"), ["space.uaq.scale", "unknown parameter key"]),
    (_tune_file("  algo.clip_low: {type: float, low: 0.1, high: 1.5}\n"), ["space.algo.clip_low", "1.5"]),
    (_tune_file("  train.lr: {type: float, low: -1.0, high: 1.0e-3}\n"), ["space.train.lr", "-1"]),
    (_tune_file("  quant: {type: categorical, choices: [int8, int9]}\n"), ["space.quant", "int9"]),
    (_tune_file("  uaq.s: {type: float, low: 1.0, high: 2.0, step: -0.1}\n"), ["space.uaq.s", "step"]),
    (_tune_file("  uaq.s: {type: float, low: 1.0, high: 2.0, bogus: 1}\n"), ["space.uaq.s", "bogus"]),
    (_tune_file(""), ["space"]),
])
_tune("tune objective", [
    (_tune_file(objective="{metric: val-core/arith/acc/mean@1, direction: maximise}"),
     ["objective.direction", "maximise", "maximize, minimize"]),
    (_tune_file(objective="{metric: '', direction: maximize}"), ["objective.metric"]),
    (_tune_file(objective="{metric: nosuch/metric, direction: maximize}", pruner="{name: none}"),
     ["objective.metric", "nosuch/metric", "val-core"]),
    (_tune_file(objective="{metric: accuracy, direction: maximize}", pruner="{name: none}"),
     ["objective.metric", "accuracy", "namespaces"]),
    (_tune_file(objective="{metric: val-core/arith/acc/mean@1, direction: maximize, goal: 1}"), ["goal"]),
    (_tune_file(objective="{metric: train/acc, direction: maximize}", pruner="{name: median}"),
     ["pruner", "train/acc"]),
])
_tune("tune file", [
    (_tune_file(n_trials="0"), ["n_trials", "0", ">= 1"]),
    (_tune_file(n_trials="many"), ["n_trials", "many"]),
    (_tune_file(parallelism="0"), ["parallelism", "0", ">= 1"]),
    (_tune_file(poll_s=".inf"), ["poll_s", "inf"]),
    (_tune_file(poll_s="1.0e+12"), ["poll_s", "1000000000000.0", "86400"]),
    (_tune_file(poll_s="0"), ["poll_s", "0"]),
    (_tune_file(sampler="{name: cmaes}"), ["sampler.name", "cmaes", "tpe, random, grid"]),
    (_tune_file(pruner="{name: hyperband}"), ["pruner.name", "hyperband", "none, median, successive_halving"]),
    (_tune_file(pruner="{name: median, interval_steps: 0}"), ["pruner.interval_steps", ">= 1"]),
    (_tune_file(launcher="{name: pbs}"), ["launcher.name", "pbs", "local, slurm"]),
    (_tune_file(storage="not-a-url"), ["storage", "not-a-url"]),
    (_tune_file(storage="nosuchdb:///optuna.db"), ["storage", "nosuchdb:///optuna.db", "SQLAlchemy"]),
    (_tune_file(storage="postgresql+nosuchdriver://u@h/db"), ["storage", "postgresql+nosuchdriver"]),
    (_tune_file(study="''"), ["study"]),
    (_tune_file(bogus="1"), ["bogus"]),
    (_tune_file(base="[nosuch=1]"), ["nosuch"]),
    ("study: t\nstudy: u\n" + _tune_file(study=None), ["duplicate key 'study'"]),
    ("study: [unclosed\n", ["FILE"]),
])


# --- verb flags ----------------------------------------------------------------------------
def _flags(cls: str, rows: list[tuple[list[str], list[str]]], text: str | None = None) -> None:
    for argv, names in rows:
        BAD.append((cls, argv, text, names))


_GOOD_SWEEP = "name: ok\n" + _BASE + "matrix: {seed: [0]}\n"
_flags("sweep/status/cancel flags", [
    (["sweep", "FILE", "--max-parallel", "0"], ["max_parallel", "0", "> 0"]),
    (["sweep", "FILE", "--max-parallel", "-3"], ["max_parallel", "-3", "> 0"]),
    (["sweep", "FILE", "--max-parallel", "two"], ["--max-parallel", "two"]),
    (["sweep", "FILE", "--max-cells", "0"], ["max_cells", "0", "> 0"]),
    (["sweep", "FILE", "--launcher", "pbs"], ["--launcher", "pbs", "local", "slurm"]),
    (["sweep", "FILE", "--launcher", "slurm", "--profile", "nosuch"], ["nosuch", "profile"]),
    (["sweep", "FILE", "--bogus"], ["--bogus"]),
    (["sweep", "FILE", "train.lr=inf"], ["train.lr", "inf"]),
    (["sweep", "FILE", "nosuch=1"], ["nosuch"]),
    (["sweep", "FILE", "launcher.poll_s=-1"], ["poll_s", "-1"]),
    (["sweep", "FILE", "resources.timeout_min=0"], ["timeout_min", "0"]),
    (["sweep", "nosuch.yaml"], ["nosuch.yaml", "no such sweep file"]),
    (["sweep", "FILE", "--only", "nosuch=1"], ["--only", "'nosuch' is not an axis", "seed"]),
    (["sweep", "FILE", "--only", "seed=7"], ["--only", "seed=7 is in no cell", "its values: 0"]),
    (["sweep", "FILE", "--only", "seed"], ["--only", "KEY=VALUE"]),
    (["sweep", "FILE", "seed=1"], ["seed=1", "matrix axis", "--only seed=1"]),
    (["status", "FILE", "--max-parallel", "0"], ["max_parallel", "0"]),
    (["status", "nosuch.yaml"], ["nosuch.yaml"]),
    (["cancel", "nosuch.yaml"], ["nosuch.yaml"]),
    (["cancel", "FILE", "--launcher", "pbs"], ["--launcher", "pbs"]),
], _GOOD_SWEEP)
_flags("tune flags", [
    (["tune", "FILE", "n_trials=0"], ["n_trials", "0"]),
    (["tune", "FILE", "parallelism=-1"], ["parallelism", "-1"]),
    (["tune", "FILE", "nosuch=1"], ["nosuch"]),
    (["tune", "FILE", "--bogus"], ["--bogus"]),
    (["tune", "nosuch.yaml"], ["nosuch.yaml"]),
], _tune_file())
_flags("report flags", [
    (["report", "--resamples", "10"], ["--resamples", "10", "2000"]),
    (["report", "--resamples", "many"], ["--resamples", "many"]),
    (["report", "--ci-seed", "x"], ["--ci-seed", "x"]),
    (["report", "--paper", "nosuch-dir"], ["nosuch-dir", "paper_main.csv"]),
    (["report", "--tracking-uri", "sqlite:///typo.db"], ["typo.db", "no MLflow store"]),
    (["report", "--experiment", "suite"], ["no MLflow store"]),
    (["report", "nosuch.yaml"], ["nosuch.yaml"]),
    (["report", "--bogus"], ["--bogus"]),
])
_flags("bench flags", [
    (["bench", "rollout", "--repeats", "0", "--no-mlflow"], ["--repeats", "0", ">= 1"]),
    (["bench", "rollout", "--warmup", "-1", "--no-mlflow"], ["--warmup", "-1", ">= 0"]),
    (["bench", "rollout", "--threads", "-2", "--no-mlflow"], ["--threads", "-2", ">= 0"]),
    (["bench", "rollout", "--batch", "0", "--no-mlflow"], ["--batch", "0", ">= 1"]),
    (["bench", "rollout", "--batch", "eight", "--no-mlflow"], ["--batch", "eight"]),
    (["bench", "rollout", "--precisions", "int9", "--no-mlflow"], ["--precisions", "int9"]),
    (["bench", "rollout", "--models", "huge", "--no-mlflow"], ["--models", "huge"]),
    (["bench", "rollout", "--kernels", "fast", "--no-mlflow"], ["--kernels", "fast"]),
    (["bench", "rollout", "--int8-gemms", "vnni", "--no-mlflow"], ["--int8-gemms", "vnni", "packed"]),
    (["bench", "rollout", "--repeats", "x"], ["--repeats", "x"]),
    (["bench", "nosuch"], ["nosuch"]),
    # no vLLM at the interpreter: refused before anything prints, runs or is logged, whatever --device says
    (["bench", "vllm", "--vllm-python", "IN/no-python", "--device", "cpu"],
     ["--vllm-python", "no-python", "vLLM is not installed there"]),
    (["bench", "vllm", "--vllm-python", "IN/no-python"], ["--vllm-python", "no-python", "not installed"]),
])
_flags("uaq/sync flags", [
    (["uaq", "apply", "--s", "0", "IN", "OUT"], ["--s", "0"]),
    (["uaq", "apply", "--s", "-1.5", "IN", "OUT"], ["--s", "-1.5"]),
    (["uaq", "apply", "--s", "inf", "IN", "OUT"], ["--s", "inf"]),
    (["uaq", "apply", "--s", "nan", "IN", "OUT"], ["--s", "nan"]),
    (["uaq", "apply", "--s", "big", "IN", "OUT"], ["--s", "big"]),
    (["uaq", "apply", "--s", "1.5", "--verify-layers", "-1", "IN", "OUT"], ["--verify-layers", "-1"]),
    (["uaq", "redo", "--s", "1.5", "IN", "OUT"], ["redo", "apply", "undo"]),
    (["uaq", "apply", "--s", "1.5", "nosuch-in", "OUT"], ["nosuch-in"]),
    (["sync", "nosuch-run-dir"], ["nosuch-run-dir", "no such run directory"]),
    (["sync", "FILE"], ["FILE", "not a run directory"]),
    (["sync", "--bogus", "x"], ["--bogus"]),
], "not a run dir\n")

_EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
_flags("sweep/status/cancel flags", [  # a misspelt sweep file
    (["sweep", str(_EXPERIMENTS / "quikstart.yaml"), "--dry-run"],
     ["quikstart.yaml: no such sweep file; did you mean", str(_EXPERIMENTS / "quickstart.yaml")]),
    (["status", str(_EXPERIMENTS / "ablation_uaq.yml")], ["did you mean", str(_EXPERIMENTS / "ablation_uaq.yaml")]),
])

_flags("run --warm-start-only", [
    (["run", "--warm-start-only", "backend=verl", "backend.model_path=IN", "backend.train_files=IN",
      "backend.val_files=IN"], ["--warm-start-only", "backend=verl", "allowed: backend=embedded"]),
    (["run", "--warm-start-only", "warm_start.steps=-1"], ["warm_start.steps", "-1"]),
    (["run", "--warm-start-only", "warm_start.steps=many"], ["warm_start.steps", "many"]),
    (["run", "--warm-start-only", "warm_start.lr=0"], ["warm_start.lr", "0"]),
    (["run", "--warm-start-only", "model=huge"], ["model", "huge"]),
    (["run", "--warm-start-only", "nosuch=1"], ["nosuch"]),
])


def _cases():
    return [pytest.param(cls, argv, text, names, id=f"{cls}:{i}") for i, (cls, argv, text, names) in enumerate(BAD)]


def test_the_tables_count_by_class():
    from collections import Counter

    counts = Counter(cls for cls, *_ in BAD)
    assert sum(counts.values()) >= 120, counts
    assert all(n >= 5 for n in counts.values()), counts


@pytest.fixture
def work(empty_cwd):
    return empty_cwd / "work"


def _argv(argv: list[str], text: str | None, work: Path) -> tuple[list[str], str]:
    path = ""
    if text is not None:
        path = str(work / "input.yaml")
        Path(path).write_text(text, encoding="utf-8")
    in_dir = work / "IN"
    if "IN" in argv:
        in_dir.mkdir(exist_ok=True)
    return [path if a == "FILE" else str(in_dir) if a == "IN" else str(work / "OUT") if a == "OUT" else a
            for a in argv], path


def _created(work: Path, path: str, tmp_path: Path) -> list[str]:
    keep = {Path(path).name, "IN"} if path else {"IN"}
    return sorted(set(os.listdir(work)) - keep) + (["cache"] if (tmp_path / "cache").exists() else [])


def _message(err: str) -> list[str]:
    """The refusal's lines, argparse's usage lines (printed before its one-line error) aside."""
    lines = err.strip().splitlines()
    if lines and lines[0].startswith("usage:"):
        lines = [line for line in lines if not line.startswith((" ", "usage:"))]
    return lines


@pytest.mark.parametrize("cls, argv, text, names", _cases())
def test_bad_input_exits_2_naming_it_and_creates_nothing(cls, argv, text, names, work, tmp_path, capsys):
    args, path = _argv(argv, text, work)
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    for n in names:
        assert (path if n == "FILE" else n) in err, (n, err)
    assert "Traceback" not in err and len(_message(err)) == 1, err
    assert _created(work, path, tmp_path) == [], err


def _one_per_class():
    seen: dict[str, tuple] = {}
    for cls, argv, text, names in BAD:
        seen.setdefault(cls, (argv, text, names))
    return [pytest.param(argv, text, names, id=cls) for cls, (argv, text, names) in seen.items()]


@pytest.mark.parametrize("argv, text, names", _one_per_class())
@pytest.mark.slow
def test_bad_input_through_a_real_process(argv, text, names, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    args, path = _argv(argv, text, work)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["SUITE_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-m", "suite.cli", *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    for n in names:
        assert (path if n == "FILE" else n) in proc.stderr, (n, proc.stderr)
    assert "Traceback" not in proc.stderr and _created(work, path, tmp_path) == [], proc.stderr
