"""Sweep files: expansion, validation, errors that name file/cell/key, the fast composer, and
every shipped experiment. No jobs run here."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from _sweep_helpers import TINY, write_sweep
from suite.config import compose_config, run_id
from suite.sweep.spec import SweepError, format_value, load_sweep, split_overrides

REPO = Path(__file__).resolve().parents[2]


def test_format_value_quotes_everything_but_plain_words():
    assert format_value("int8") == "int8"
    assert format_value(1.5) == "1.5"
    assert format_value(3) == "3"
    assert format_value(True) == "true"
    assert format_value(None) == "null"
    assert format_value("null") == "'null'"  # the string, not None
    assert format_value("$(touch x)") == "'$(touch x)'"
    assert format_value("it's; rm -rf /") == "'it\\'s; rm -rf /'"


def test_split_overrides_routes_launcher_keys():
    cfg, launcher, res = split_overrides(["steps=3", "launcher=slurm", "cluster=h100x8",
                                          "launcher.max_parallel=4", "resources.timeout_min=9"])
    assert cfg == ["steps=3"]
    assert launcher == {"name": "slurm", "profile": "h100x8", "max_parallel": "4"}
    assert res == {"timeout_min": "9"}


def test_matrix_include_exclude_expand_in_file_order(tmp_path, sweep_env):
    path = write_sweep(tmp_path / "s.yaml", {
        "name": "expand",
        "base": {"model": "tiny", "steps": 4},
        "matrix": {"quant": ["bf16", "int8"], "correction": ["naive", "acr"], "seed": [0, 1]},
        "include": [{"quant": "fp8", "train.lr": [4.5e-5, 6e-5]}],  # crossed with correction x seed
        "exclude": [{"quant": "bf16", "correction": "acr"}],
    })
    sw = load_sweep(path, ["steps=5"])
    got = [(c.axes["quant"], c.axes["correction"], c.axes["seed"], c.axes.get("train.lr")) for c in sw.cells]
    assert got[:6] == [("bf16", "naive", "0", None), ("bf16", "naive", "1", None),
                       ("int8", "naive", "0", None), ("int8", "naive", "1", None),
                       ("int8", "acr", "0", None), ("int8", "acr", "1", None)]
    assert len(got) == 6 + 2 * 2 * 2
    assert got[6] == ("fp8", "naive", "0", "4.5e-05")
    for c in sw.cells:
        assert c.cfg.steps == 5  # the CLI override replaced the base value
        assert c.run_id == run_id(c.cfg)
        assert c.run_dir == os.path.join(os.path.abspath("runs"), c.run_id)
        assert c.command()[:2] == ["suite", "run"]
    assert [c.index for c in sw.cells] == list(range(len(sw.cells)))
    assert sw.state_dir == os.path.join(os.path.abspath("runs"), "_sweeps", "expand")
    assert sw.cells[6].cfg.train.lr == 4.5e-5 and sw.cells[6].cfg.quant.precision == "fp8"


@pytest.mark.slow
def test_fast_composer_equals_compose_config(tmp_path, sweep_env):
    """The cached-Hydra path gives exactly compose_config's config, groups and values mixed."""
    path = write_sweep(tmp_path / "s.yaml", {
        "name": "same",
        "base": TINY + ["+tracking.tags.note=hello", "algo.clip_high=0.3"],
        "matrix": {"quant": ["int8", "w4a16"], "algo": ["grpo", "dapo", "ppo"], "correction": ["tis", "acr"],
                   "uaq.s": [1, 1.25], "correction.aligned_forward": [False, True]},
    })
    sw = load_sweep(path)
    assert len(sw.cells) == 2 * 3 * 2 * 2 * 2
    for c in sw.cells[::5]:
        ref = compose_config(c.overrides)
        assert OmegaConf.to_yaml(ref) == OmegaConf.to_yaml(c.cfg), c.overrides
        assert isinstance(c.cfg.uaq.s, float)  # `1` became 1.0 through the typed schema
        assert run_id(ref) == c.run_id


def _sweep_files() -> list[str]:
    files = sorted(glob.glob(str(REPO / "experiments" / "*.yaml")))
    # tune files (suite tune, docs/tuning.md) have a `study:` key and their own format
    return [f for f in files if "study" not in (yaml.safe_load(open(f)) or {})]


# Files whose cells run on vLLM's CPU build: they need a CPU kind whose vLLM serves their rollouts
# (int8: a VNNI dot product or AMX), and on another kind every such cell is refused by name.
VLLM_CPU_FILES = {"study_cross_backend.yaml": "int8"}


@pytest.fixture(scope="module")
def shipped() -> dict[str, object]:
    """Every experiment file, loaded once: path -> its Sweep, or the SweepError that refused it."""
    out: dict[str, object] = {}
    for path in _sweep_files():
        try:
            out[path] = load_sweep(path)
        except SweepError as e:
            out[path] = e
    return out


@pytest.mark.parametrize("path", _sweep_files(), ids=os.path.basename)
@pytest.mark.slow
def test_every_experiment_composes_and_validates(path, shipped):
    """STYLE.md: one test composes every YAML under experiments/; every cell validates (a file of
    vLLM CPU cells, on a CPU kind that cannot serve them: refused naming what it needs)."""
    from suite.hardware import cpu_features
    from suite.verl.rollout_quant import vllm_cpu_precisions

    text = open(path).read()
    first = text.splitlines()[0]
    assert first.startswith("# suite sweep experiments/"), "each file starts with the command that runs it"
    assert "Laptop" in text and "Cluster" in text, "and its expected duration on a laptop and a cluster"
    needs = VLLM_CPU_FILES.get(os.path.basename(path))
    sw = shipped[path]
    if needs and needs not in vllm_cpu_precisions(cpu_features()):
        assert isinstance(sw, SweepError), f"composed on a CPU kind whose vLLM cannot serve {needs}"
        assert f"quant.precision: '{needs}' is not served by vLLM's CPU build" in str(sw)
        return
    assert not isinstance(sw, SweepError), sw
    assert len(sw.cells) >= 2
    assert len({c.run_id for c in sw.cells}) == len(sw.cells)


def test_a_vllm_cpu_study_is_refused_by_name_on_a_cpu_kind_that_cannot_serve_it(monkeypatch):
    """The other branch of the test above, on every machine: on an AVX2-only CPU (no VNNI, no AMX)
    the cross-backend study's INT8 verl cells are refused before anything runs."""
    import suite.hardware
    from suite.hardware import CpuFeatures

    monkeypatch.setattr(suite.hardware, "cpu_features", lambda: CpuFeatures(False, False, False))
    with pytest.raises(SweepError, match=r"quant.precision: 'int8' is not served by vLLM's CPU build "
                                         r"\(backend.device=cpu\) on this CPU .*it needs a VNNI dot product"):
        load_sweep(str(REPO / "experiments" / "study_cross_backend.yaml"))


@pytest.mark.slow
def test_shipped_experiments_have_the_issue_axes(shipped):
    by = {Path(p).stem: sw for p, sw in shipped.items()}
    assert {"quickstart", "main_table", "ablation_uaq", "ablation_acr", "kl_drift", "qarl_tbpo",
            "throughput"} <= set(by)
    mt = by["main_table"]
    assert {c.cfg.quant.precision for c in mt.cells} == {"bf16", "int8", "fp8"}
    assert {c.cfg.correction.mode for c in mt.cells} == {"naive", "tis", "acr"}
    assert {c.cfg.algo.name for c in mt.cells} == {"grpo", "dapo", "ppo"}
    uaq = by["ablation_uaq"]
    assert {(c.cfg.uaq.s, c.cfg.train.lr, c.cfg.train.lr_factor, c.cfg.uaq.group_lr_s) for c in uaq.cells} == {
        (1.0, 3e-5, 1.0, 1.0), (1.25, 3e-5, 1.0, 1.0), (1.5, 3e-5, 1.0, 1.0), (2.0, 3e-5, 1.0, 1.0),
        (1.0, 3e-5, 1.5, 1.0), (1.0, 3e-5, 2.0, 1.0), (1.0, 3e-5, 1.0, 1.5)}
    assert len(uaq.cells) == 21
    assert {c.cfg.correction.mode for c in by["ablation_acr"].cells} == {"naive", "bypass", "tis", "acr"}
    assert {c.cfg.quant.precision for c in by["kl_drift"].cells} == {"bf16", "int8", "fp8", "w4a16"}
    q = by["qarl_tbpo"]
    assert {(c.cfg.quant.precision, c.cfg.correction.mode, c.cfg.correction.aligned_forward) for c in q.cells} == {
        ("w4a16", "naive", False), ("w4a16", "naive", True), ("w4a16", "tbpo", False), ("w4a16", "tbpo", True),
        ("bf16", "naive", False), ("bf16", "tbpo", False)}
    schemes = by["qarl_schemes"]
    assert {(c.cfg.quant.precision, c.cfg.correction.mode, c.cfg.correction.aligned_forward)
            for c in schemes.cells} == {
        ("int8", "tbpo", True), ("fp8", "tbpo", True), ("w4a16", "tbpo", True), ("bf16", "tbpo", False)}
    tp = by["qarl_throughput"]
    assert {(c.cfg.correction.mode, c.cfg.correction.aligned_forward) for c in tp.cells} == {
        ("naive", False), ("naive", True), ("tbpo", False), ("tbpo", True)}


# --------------------------------------------------------------------------- 100 malformed inputs


def _good() -> dict:
    return {"name": "bad", "base": list(TINY), "matrix": {"quant": ["bf16", "int8"]}}


def _with(**changes) -> dict:
    d = _good()
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return d


_DROP = object()


def _malformed() -> list[tuple[str, object, list[str], str]]:
    """(id, sweep file data or text, CLI overrides, text the error must contain)."""
    cases = []
    # unknown axis (10)
    for key in ["nosuch", "quant.nosuch", "model.depth", "algo.gama", "train.learning_rate", "rollout.n",
                "uaq.scale", "task.level", "tracking.uri", "warm_start.epochs"]:
        cases.append((f"unknown-axis-{key}", _with(matrix={key: [1, 2]}), [], key.split(".")[-1]))
    # bad value of a group or a field (14)
    for key, val in [("quant", "int7"), ("correction", "acrr"), ("algo", "ppo2"), ("task", "mathx"),
                     ("model", "huge"), ("backend", "jax"), ("uaq.s", -1.0), ("uaq.s", 0), ("task.difficulty", 9),
                     ("rollout.top_p", 1.5), ("train.lr", 0), ("algo.agg", "sum"), ("train.autocast", "fp16"),
                     ("quant.fp8_granularity", "row")]:
        cases.append((f"bad-value-{key}-{val}", _with(matrix={key: [val]}), [], key))
    # type errors (10)
    for key, val in [("seed", "abc"), ("steps", "many"), ("uaq.s", "fast"), ("rollout.max_new_tokens", "ten"),
                     ("correction.aligned_forward", "maybe"), ("task.n_eval", 1.5), ("train.epochs", "two"),
                     ("algo.group_size", "eight"), ("rollout.temperature", "hot"), ("eval_every", "often")]:
        cases.append((f"type-{key}", _with(matrix={key: [val]}), [], key.split(".")[-1]))
    # axis values that are not scalars / axes that are not lists (6)
    cases += [
        ("axis-mapping", _with(matrix={"quant": {"a": "b"}}), [], "quant"),
        ("axis-nested-list", _with(matrix={"seed": [[0, 1]]}), [], "seed"),
        ("axis-dict-value", _with(matrix={"seed": [{"x": 1}]}), [], "seed"),
        ("matrix-list", _with(matrix=["quant=int8"]), [], "matrix"),
        ("matrix-string", _with(matrix="quant: int8"), [], "matrix"),
        ("axis-bad-key", _with(matrix={"quant;rm -rf /": ["int8"]}), [], "quant;rm"),
    ]
    # empty matrix (6)
    cases += [
        ("empty-matrix", _with(matrix={}), [], "empty"),
        ("empty-axis", _with(matrix={"quant": []}), [], "quant"),
        ("no-matrix", _with(matrix=_DROP), [], "empty"),
        ("null-matrix", _with(matrix=None), [], "empty"),
        ("all-excluded", _with(exclude=[{"quant": ["bf16", "int8"]}]), [], "empty"),
        ("empty-include-only", _with(matrix=_DROP, include=[]), [], "empty"),
    ]
    # unknown launcher and bad launcher settings (8)
    cases += [
        ("launcher-pbs", _with(launcher={"name": "pbs"}), [], "launcher.name"),
        ("launcher-cli", _good(), ["launcher=kubernetes"], "launcher.name"),
        ("launcher-flag-typo", _good(), ["launcher.max_paralel=2"], "max_paralel"),
        ("launcher-zero", _with(launcher={"max_parallel": 0}), [], "max_parallel"),
        ("launcher-type", _with(launcher={"max_parallel": "many"}), [], "max_parallel"),
        ("launcher-not-mapping", _with(launcher="slurm"), [], "launcher"),
        ("launcher-unknown-key", _with(launcher={"name": "local", "queue": "gpu"}), [], "queue"),
        ("launcher-requeue", _with(launcher={"max_requeue": -1}), [], "max_requeue"),
    ]
    # unknown or bad profile (6)
    cases += [
        ("profile-missing", _with(launcher={"name": "slurm", "profile": "nosuch"}), [], "nosuch"),
        ("profile-cli", _good(), ["launcher=slurm", "cluster=h100x9"], "h100x9"),
        ("profile-path", _good(), ["launcher=slurm", "cluster=/nonexistent/p.yaml"], "p.yaml"),
        ("profile-traversal", _good(), ["launcher=slurm", "cluster=../../etc/passwd"], "profile"),
        ("profile-injection", _good(), ["launcher=slurm", "cluster=$(touch x)"], "profile"),
        ("profile-bad-partition", _good(), ["launcher=slurm", "cluster=@BADPROFILE@"], "partition"),
    ]
    # cells that compose but conflict (8)
    cases += [
        ("tbpo-ppo", _with(matrix={"correction": ["tbpo"], "algo": ["ppo", "grpo"]}), [], "correction.mode"),
        ("aligned-fp32", _with(matrix={"quant": ["fp32"], "correction.aligned_forward": [True]}), [],
         "correction.aligned_forward"),
        ("dynamic-ppo", _with(matrix={"algo": ["ppo"], "algo.dynamic_sampling": [True]}), [], "algo.dynamic_sampling"),
        ("overlong", _with(matrix={"algo.overlong_buffer": [16, 32]}), [], "algo.overlong_buffer"),
        ("minibatches", _with(matrix={"train.minibatches": [3]}), [], "train.minibatches"),
        ("group-size-1", _with(matrix={"algo.group_size": [1]}), [], "algo.group_size"),
        ("two-stores", _with(matrix={"quant": ["int8"], "tracking.experiment": ["a", "b"]}), [], "cell 1"),
        ("multinode-embedded", _with(resources={"nodes": 2}), [], "nodes"),
    ]
    # bad include / exclude (10)
    cases += [
        ("include-not-list", _with(include={"quant": "fp8"}), [], "include"),
        ("include-empty-entry", _with(include=[{}]), [], "include[0]"),
        ("include-list-entry", _with(include=[["quant=fp8"]]), [], "include[0]"),
        ("include-bad-value", _with(include=[{"quant": "fp9"}]), [], "quant"),
        ("include-unknown-key", _with(include=[{"nosuch": 1}]), [], "nosuch"),
        ("exclude-not-list", _with(exclude={"quant": "bf16"}), [], "exclude"),
        ("exclude-unknown-axis", _with(exclude=[{"seed": 0}]), [], "seed"),
        ("exclude-no-match", _with(exclude=[{"quant": "int9"}]), [], "exclude[0]"),
        ("exclude-empty", _with(exclude=[{}]), [], "exclude[0]"),
        ("exclude-string", _with(exclude=["quant=bf16"]), [], "exclude[0]"),
    ]
    # duplicate cells (5)
    cases += [
        ("dup-values", _with(matrix={"quant": ["int8", "int8"]}), [], "more than once"),
        ("dup-nonsemantic", _with(matrix={"quant": ["int8"], "tracking.console_every": [1, 2]}), [], "same run"),
        ("dup-include", _with(include=[{"quant": "int8"}]), [], "same run"),
        ("dup-run-name", _with(matrix={"quant": ["int8"], "tracking.run_name": ["a", "b"]}), [], "same run"),
        ("dup-outdir", _with(matrix={"quant": ["int8"], "warm_start.cache_dir": ["/tmp/a", "/tmp/b"]}), [],
         "same run"),
    ]
    # file-level errors (13)
    cases += [
        ("no-name", _with(name=_DROP), [], "name"),
        ("bad-name", _with(name="my sweep"), [], "name"),
        ("injection-name", _with(name="$(touch x)"), [], "name"),
        ("unknown-top-key", _with(matrx={"quant": ["int8"]}), [], "matrx"),
        ("not-yaml", "name: [unclosed\n", [], "YAML"),
        ("top-list", "- a\n- b\n", [], "mapping"),
        ("base-string", _with(base="model=tiny"), [], "base"),
        ("base-no-equals", _with(base=["model"]), [], "base[0]"),
        ("base-and-axis", _with(base=TINY + ["quant=int8"]), [], "quant"),
        ("cli-sets-axis", _good(), ["quant=fp8"], "quant"),
        ("cli-unknown-key", _good(), ["nosuch=1"], "nosuch"),
        ("cli-no-equals", _good(), ["steps"], "steps"),
        ("cli-bad-value", _good(), ["task=mathx"], "task"),
    ]
    # resources (4)
    cases += [
        ("resources-unknown", _with(resources={"gpus": 8}), [], "gpus"),
        ("resources-negative", _with(resources={"timeout_min": -5}), [], "timeout_min"),
        ("resources-type", _with(resources={"mem_gb": "lots"}), [], "mem_gb"),
        ("resources-cli", _good(), ["resources.cpus_per_task=0"], "cpus_per_task"),
    ]
    return cases


MALFORMED = _malformed()


def test_there_are_at_least_100_malformed_cases():
    assert len(MALFORMED) >= 100, len(MALFORMED)
    assert len({c[0] for c in MALFORMED}) == len(MALFORMED)


@pytest.mark.slow
def test_malformed_sweeps_fail_before_anything_is_created(tmp_path, monkeypatch, capsys, sweep_env):
    """Each malformed file or override: `suite sweep` exits 2 with an error naming the file, the
    key (and the cell where one is at fault), and creates no state dir, job or MLflow store."""
    from suite.cli import main

    monkeypatch.chdir(tmp_path)
    bad_profile = tmp_path / "badprofile.yaml"
    bad_profile.write_text("partition: $(touch pwned)\n")
    failures = []
    for case_id, data, cli, expect in MALFORMED:
        cli = [a.replace("@BADPROFILE@", str(bad_profile)) for a in cli]
        path = write_sweep(tmp_path / "files" / f"{case_id}.yaml", data)
        with pytest.raises(SystemExit) as exc:
            main(["sweep", str(path), *cli, f"out_dir={tmp_path / 'out'}"] if "out_dir" not in " ".join(cli)
                 else ["sweep", str(path), *cli])
        err = capsys.readouterr().err
        if exc.value.code != 2 or str(path) not in err or expect not in err:
            failures.append(f"{case_id}: exit {exc.value.code}: {err.strip()[:300]}")
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "out").exists(), "a malformed sweep created its state dir"
    assert not (tmp_path / "mlflow.db").exists(), "a malformed sweep touched MLflow"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "x").exists()


@pytest.mark.slow
def test_error_names_file_cell_and_key(tmp_path, sweep_env):
    path = write_sweep(tmp_path / "conflict.yaml", {
        "name": "conflict", "base": TINY, "matrix": {"algo": ["grpo", "ppo"], "correction": ["acr", "tbpo"]}})
    with pytest.raises(SweepError) as exc:
        load_sweep(path)
    msg = str(exc.value)
    assert str(path) in msg and "cell 3 (algo=ppo correction=tbpo)" in msg and "correction.mode" in msg


def test_include_entry_overrides_a_base_value_for_its_cells(tmp_path, sweep_env):
    path = write_sweep(tmp_path / "inc.yaml", {
        "name": "inc", "base": [*TINY, "train.lr=3e-5"], "matrix": {"seed": [0, 1]},
        "include": [{"seed": 0, "train.lr": 6e-5}]})
    sw = load_sweep(path)
    assert [(c.cfg.seed, c.cfg.train.lr) for c in sw.cells] == [(0, 3e-5), (1, 3e-5), (0, 6e-5)]
    assert sum("train.lr" in o for o in sw.cells[2].overrides) == 1  # the base entry is dropped there
