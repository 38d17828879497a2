"""Tune-file loading and search-space checks: bad spaces fail before any trial starts."""

import os
import subprocess
import sys

import pytest

from suite.config import compose_config
from suite.tune.spec import TuneSpecError, check_against_config, load_tune_file
from suite.tune.study import distributions, grid_space

GOOD = """
study: t
storage: sqlite:///{db}
out_dir: {out}
base: [model=tiny]
space:
  uaq.s: {{type: float, low: 1.0, high: 2.0}}
  algo.clip_high: {{type: float, low: 0.1, high: 0.5, step: 0.1}}
  train.minibatches: {{type: int, low: 1, high: 4, log: true}}
  correction.mode: {{type: categorical, choices: [acr, tis]}}
objective: {{metric: val-core/arith/acc/mean@1, direction: maximize}}
pruner: {{name: none}}
"""


def write(tmp_path, text=GOOD, **fmt):
    p = tmp_path / "tune.yaml"
    p.write_text(text.format(db=tmp_path / "optuna.db", out=tmp_path / "runs", **fmt))
    return str(p)


def test_good_file_loads_and_builds_distributions(tmp_path):
    spec = load_tune_file(write(tmp_path))
    base = check_against_config(spec, compose_config)
    assert base.model.preset == "tiny"
    d = distributions(spec)
    assert (d["uaq.s"].low, d["uaq.s"].high, d["uaq.s"].log) == (1.0, 2.0, False)
    assert d["train.minibatches"].log and d["train.minibatches"].low == 1
    assert d["correction.mode"].choices == ("acr", "tis")
    assert spec.sampler.name == "tpe"  # the default sampler


def test_grid_space_enumerates_steps_and_choices(tmp_path):
    text = GOOD.replace("uaq.s: {{type: float, low: 1.0, high: 2.0}}",
                        "uaq.s: {{type: float, low: 1.0, high: 2.0, step: 0.5}}")
    text = text.replace(", log: true", "")
    spec = load_tune_file(write(tmp_path, text), ["sampler.name=grid"])
    g = grid_space(spec)
    assert g["uaq.s"] == [1.0, 1.5, 2.0]
    assert g["algo.clip_high"] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert g["train.minibatches"] == [1, 2, 3, 4]
    assert g["correction.mode"] == ["acr", "tis"]


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("uaq.s: {{type: float, low: 1.0, high: 2.0}}", "uaq.s: {{type: float, low: 2.0, high: 1.0}}",
         "space.uaq.s: empty range: low=2.0 must be < high=1.0"),
        ("uaq.s: {{type: float, low: 1.0, high: 2.0}}", "uaq.s: {{type: float, low: 1.5, high: 1.5}}",
         "space.uaq.s: empty range"),
        ("uaq.s: {{type: float, low: 1.0, high: 2.0}}", "uaq.s: {{type: float, low: 0.0, high: 2.0, log: true}}",
         "space.uaq.s.low: log=true needs low > 0, got 0.0"),
        ("uaq.s: {{type: float, low: 1.0, high: 2.0}}", "uaq.s: {{type: float, low: -1.0, high: 2.0, log: true}}",
         "space.uaq.s.low: log=true needs low > 0"),
        ("correction.mode: {{type: categorical, choices: [acr, tis]}}",
         "correction.mode: {{type: categorical, choices: []}}",
         "space.correction.mode.choices: a categorical parameter needs a non-empty list"),
        ("uaq.s: {{type: float, low: 1.0, high: 2.0}}", "uaq.s: {{type: normal, low: 1.0, high: 2.0}}",
         "space.uaq.s.type: 'normal' is not allowed; choose one of: float, int, categorical"),
        ("train.minibatches: {{type: int, low: 1, high: 4, log: true}}",
         "train.minibatches: {{type: int, low: 1.5, high: 4}}",
         "space.train.minibatches.low: an int parameter needs integer bounds"),
        ("pruner: {{name: none}}", "pruner: {{name: hyperband}}",
         "pruner.name: 'hyperband' is not allowed; choose one of: none, median, successive_halving"),
        ("pruner: {{name: none}}", "pruner: {{name: none}}\nsampler: {{name: cmaes}}",
         "sampler.name: 'cmaes' is not allowed; choose one of: tpe, random, grid"),
        ("direction: maximize", "direction: up", "objective.direction: 'up' is not allowed"),
    ],
)
def test_bad_space_fails_at_load_naming_parameter_and_key(tmp_path, old, new, message):
    assert old in GOOD
    with pytest.raises(TuneSpecError) as e:
        load_tune_file(write(tmp_path, GOOD.replace(old, new)))
    assert message in str(e.value)


def test_grid_needs_a_step_for_floats(tmp_path):
    with pytest.raises(TuneSpecError, match=r"space\.uaq\.s\.step: sampler=grid needs a step"):
        load_tune_file(write(tmp_path), ["sampler.name=grid"])


def test_mistyped_field_fails_naming_it(tmp_path):
    with pytest.raises(TuneSpecError, match="hihg"):
        load_tune_file(write(tmp_path, GOOD.replace("high: 2.0}}", "hihg: 2.0}}")))


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("uaq.s:", "uaq.scale:", "space.uaq.scale: unknown parameter key 'uaq.scale'"),
        ("uaq.s:", "algo:", "space.algo: 'algo' is a config group: search it with type: categorical"),
        ("uaq.s:", "uaq:", "space.uaq: unknown parameter key 'uaq'"),  # a section, not a value
        ("correction.mode: {{type: categorical, choices: [acr, tis]}}",
         "quant: {{type: categorical, choices: [int8, fp8]}}",
         None),  # a config group searched by its options
        ("correction.mode: {{type: categorical, choices: [acr, tis]}}",
         "quant: {{type: categorical, choices: [int8, int3]}}",
         "space.quant: value 'int3' is refused by the run config"),
        ("uaq.s: {{type: float, low: 1.0, high: 2.0}}", "uaq.s: {{type: float, low: 0.001, high: 2.0, log: true}}",
         None),
        ("correction.mode: {{type: categorical, choices: [acr, tis]}}",
         "correction.mode: {{type: categorical, choices: [acr, fancy]}}",
         "space.correction.mode: value 'fancy' is refused by the run config: correction.mode='fancy' is not allowed"),
        ("algo.clip_high: {{type: float, low: 0.1, high: 0.5, step: 0.1}}",
         "algo.clip_low: {{type: float, low: 0.1, high: 1.5}}",
         "space.algo.clip_low: value 1.5 is refused by the run config: algo.clip_low: must be in (0, 1)"),
        ("base: [model=tiny]", "base: [model=tiny, task=word]",
         "objective.metric: 'val-core/arith/acc/mean@1' is not logged by task.name=word"),
    ],
)
@pytest.mark.slow
def test_space_checked_against_run_config(tmp_path, old, new, message):
    spec = load_tune_file(write(tmp_path, GOOD.replace(old, new)))
    if message is None:  # valid: passes
        check_against_config(spec, compose_config)
        return
    with pytest.raises(TuneSpecError) as e:
        check_against_config(spec, compose_config)
    assert message in str(e.value)


@pytest.mark.slow
def test_cli_bad_space_exits_before_any_trial(tmp_path):
    path = write(tmp_path, GOOD.replace("uaq.s:", "uaq.scale:"))
    p = subprocess.run([sys.executable, "-m", "suite.cli", "tune", path], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    assert "space.uaq.scale: unknown parameter key 'uaq.scale'" in p.stderr
    # nothing was created: no study storage, no trial directory
    assert not (tmp_path / "optuna.db").exists()
    assert not (tmp_path / "runs").exists()


def _tune_files() -> list[str]:
    import glob

    import yaml

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = sorted(glob.glob(os.path.join(repo, "experiments", "*.yaml")))
    return [f for f in files if "study" in (yaml.safe_load(open(f)) or {})]


@pytest.mark.parametrize("path", _tune_files(), ids=os.path.basename)
@pytest.mark.slow
def test_shipped_tune_files_load_and_compose(path):
    text = open(path).read()
    assert text.splitlines()[0].startswith("# suite tune experiments/"), "starts with the command that runs it"
    assert "Laptop" in text and "Cluster" in text, "and how long it takes on a laptop and a cluster"
    spec = load_tune_file(path)
    base = check_against_config(spec, compose_config)
    # trials land in the store `suite run` and the README's `mlflow ui` use, not one of their own
    assert base.tracking.tracking_uri == compose_config([]).tracking.tracking_uri


def test_tune_uaq_searches_the_issue_parameters():
    spec = load_tune_file([f for f in _tune_files() if f.endswith("tune_uaq.yaml")][0])
    assert {"uaq.s", "algo.clip_low", "algo.clip_high", "correction.tis_cap", "train.lr"} <= set(spec.space)
    assert spec.space["train.lr"].log and spec.sampler.name == "tpe" and spec.pruner.name == "median"
