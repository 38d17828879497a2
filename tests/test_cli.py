"""The `suite` command line as Hydra users expect it (`--cfg job|hydra|all`, config groups in
`-h`, `-m` refused naming `suite sweep`), and every example that the help texts and the docs give:
each parses, names files that exist, and the cheap ones run (`suite run` with `--cfg job`, sweeps
with `--dry-run`, `suite status` / `cancel`), through `suite.cli.main` in-process."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from suite.cli import build_parser, main
from suite.config import compose_config
from suite.hardware import cpu_features

REPO = Path(__file__).resolve().parent.parent


def _run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [["--cfg"], ["--cfg", "job"], ["--cfg", "quant=fp8"], ["--cfg", "job", "quant=fp8"]])
def test_cfg_job_prints_the_resolved_run_config(argv, capsys):
    code, out, _ = _run(capsys, "run", *argv)
    want = compose_config(["quant=fp8"] if "quant=fp8" in argv else [])
    from omegaconf import OmegaConf

    assert code == 0 and yaml.safe_load(out) == OmegaConf.to_container(want, resolve=True)


def test_cfg_hydra_prints_hydras_config_with_the_chosen_options(capsys):
    code, out, _ = _run(capsys, "run", "--cfg", "hydra", "quant=fp8", "algo=dapo")
    hydra = yaml.safe_load(out)["hydra"]
    assert code == 0 and hydra["runtime"]["choices"]["quant"] == "fp8" and hydra["runtime"]["choices"]["algo"] == "dapo"
    assert hydra["job"]["name"] == "suite"
    code, out, _ = _run(capsys, "run", "--cfg", "all", "quant=fp8")
    both = yaml.safe_load(out)
    assert code == 0 and both["quant"]["precision"] == "fp8" and both["hydra"]["runtime"]["choices"]["quant"] == "fp8"


def test_run_help_lists_every_config_group_and_its_options(capsys):
    from suite.config import ALGOS
    from suite.core.losses import CORRECTIONS
    from suite.core.quant import QUANTIZERS
    from suite.embedded.model import PRESETS

    code, out, _ = _run(capsys, "run", "-h")
    groups = dict(re.findall(r"^  (\w+) +(\S.*)$", out.split("\nconfig groups")[1], flags=re.M))
    assert code == 0
    # each against the registry that defines the options, not against Hydra's listing
    assert set(groups["quant"].split(" | ")) == set(QUANTIZERS)
    assert set(groups["correction"].split(" | ")) == set(CORRECTIONS)
    assert set(groups["algo"].split(" | ")) == set(ALGOS)
    assert set(groups["model"].split(" | ")) == set(PRESETS)
    assert groups["backend"] == "embedded | verl" and groups["task"] == "arith | word" and groups["regime"] == "paper"


@pytest.mark.parametrize("verb", ["run", "sweep", "status", "cancel", "eval"])
def test_every_verb_taking_overrides_lists_the_groups_from_a_fresh_process(verb):
    # a fresh interpreter: in-process, this module has imported suite.config (which registers the
    # groups) already, which once hid an empty listing under `suite run -h`
    proc = subprocess.run([sys.executable, "-m", "suite.cli", verb, "-h"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    groups = dict(re.findall(r"^  (\w+) +(\S.*)$", proc.stdout.split("\nconfig groups")[1], flags=re.M))
    assert groups["quant"] == "bf16 | fp32 | fp8 | int8 | w4a16 | wa16", groups
    assert groups["algo"] == "dapo | grpo | ppo", groups
    assert "docs/config.md" in proc.stdout


def test_options_may_sit_among_the_overrides(capsys):
    from omegaconf import OmegaConf

    code, out, _ = _run(capsys, "run", "--cfg", "job", "model=small", "--no-progress", "seed=3", "uaq.s=1.0")
    cfg = yaml.safe_load(out)
    assert code == 0 and cfg["model"]["preset"] == "small" and cfg["seed"] == 3 and cfg["uaq"]["s"] == 1.0
    assert cfg == OmegaConf.to_container(compose_config(["model=small", "seed=3", "uaq.s=1.0"]), resolve=True)
    code, _, err = _run(capsys, "run", "seed=3", "--bogus", "uaq.s=1.0")
    assert code == 2 and "unrecognized arguments: --bogus" in err


def test_help_texts_speak_to_users_not_about_internals(capsys):
    texts = []
    for verb in ([], ["run"], ["sweep"], ["status"], ["cancel"], ["report"], ["bench"], ["tune"], ["sync"], ["uaq"]):
        texts.append(_run(capsys, *verb, "-h")[1])
    for text in texts:
        assert not re.search(r"_PLUGINS|imports nothing heavy|registered in|suite\.\w+\.\w+", text), text


# --------------------------------------------------------------------------- examples

def _examples_in(text: str) -> list[str]:
    """`suite ...` command lines of a help text or a Markdown code block, comments cut."""
    lines = []
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.startswith("suite ") and not ln.startswith("suite —"):
            lines.append(ln.split("  #")[0].split(" # ")[0].strip())
    return lines


def _help_examples() -> list[str]:
    p = build_parser()
    texts = [p.description or ""]
    sub = next(a for a in p._actions if a.__class__.__name__ == "_SubParsersAction")
    texts += [sp.description or "" for sp in sub.choices.values()]
    return sorted(set(ex for t in texts for ex in _examples_in(t)))


def _doc_examples() -> list[str]:
    found = []
    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", md.read_text(), flags=re.S):
            found += _examples_in(block.replace("\\\n", " "))
    return sorted(set(found))


# placeholders a reader fills in: parsed only when concrete
_PLACEHOLDER = re.compile(r"RUN_ID|RUN_DIR|\.\.\.|<|IN OUT|FILE\b")


def _check_example(line: str, tmp_path: Path, capsys) -> None:
    argv = shlex.split(line)[1:]
    assert argv, line
    if _PLACEHOLDER.search(line):
        return
    for a in argv:  # a file an example names exists
        if a.startswith(("experiments/", "slurm/")):
            assert (REPO / a).exists(), f"{line}: {a} does not exist"
    argv = [str(REPO / a) if a.startswith("experiments/") else a for a in argv]
    build_parser().parse_args(argv)  # every option it shows exists
    verb = argv[0]
    if verb == "run":
        code, out, err = _run(capsys, "run", "--cfg", "job", *argv[1:])
        if {"backend.device=cpu", "quant=int8"} <= set(argv) and not cpu_features().int8_dot_exact:
            # docs/verl.md says so beside the example: vLLM's CPU INT8 needs VNNI or AMX
            assert code == 2 and "quant.precision: 'int8' is not served by vLLM's CPU build" in err, (line, err)
            return
    elif verb == "sweep":
        code, out, err = _run(capsys, *argv, "--dry-run")
    elif verb in ("status", "cancel"):
        code, out, err = _run(capsys, *argv)
    else:
        return  # report / bench / tune / sync / uaq take minutes or data: parsed above
    assert code == 0, f"{line}:\n{out}\n{err}"


@pytest.mark.parametrize("line", _help_examples())
@pytest.mark.slow
def test_every_help_example_works(line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    _check_example(line, tmp_path, capsys)


@pytest.mark.parametrize("line", _doc_examples())
@pytest.mark.slow
def test_every_docs_example_works(line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    _check_example(line, tmp_path, capsys)


def test_the_examples_cover_every_verb():
    verbs = {shlex.split(x)[1] for x in _help_examples() + _doc_examples()}
    assert verbs >= {"run", "sweep", "status", "cancel", "report", "bench", "tune", "sync"}, verbs


@pytest.mark.slow
def test_a_sweep_command_prints_no_warning(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    proc = subprocess.run([sys.executable, "-m", "suite.cli", "sweep", str(REPO / "experiments/quickstart.yaml"),
                           "--dry-run", "steps=3"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr


def test_every_verb_has_its_own_description():
    """`suite VERB -h` describes that verb: every verb has a description, and status / cancel are no longer
    described as the sweep."""
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    descriptions = {name: (p.description or "").strip() for name, p in sub.choices.items()}
    assert all(descriptions.values()), [n for n, d in descriptions.items() if not d]
    assert len({descriptions[v] for v in ("sweep", "status", "cancel")}) == 3
    assert descriptions["status"].startswith("The state of each cell") and "changes nothing" in descriptions["status"]
    assert descriptions["cancel"].startswith("Cancel what a sweep has queued or running")


def test_the_group_listing_is_cached_per_source_and_equals_a_fresh_one(tmp_path, monkeypatch):
    """`-h` reads the config-group listing from the cache once it was composed; the cache is keyed by the
    package's source files, so an edit lists the groups afresh (a stale listing is never shown)."""
    from suite import cli_common

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fresh = cli_common._groups_help_text()
    assert cli_common.groups_help() == fresh  # composed, then written
    (cached,) = (tmp_path / "suite").glob("groups-help-*.txt")
    assert cached.read_text() == fresh and cached.name == f"groups-help-{cli_common._source_key()}.txt"
    cached.write_text("a listing of the source as it was")
    assert cli_common.groups_help() == "a listing of the source as it was"  # read, not composed
    monkeypatch.setattr(cli_common, "_source_key", lambda: "0123456789abcdef")  # the source changed
    assert cli_common.groups_help() == fresh
