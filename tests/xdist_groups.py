"""pytest plugin: under pytest-xdist (`-n 2`), tests that share a costly fixture run on one worker.

A session or module fixture is built once per worker that runs a test needing it, so a module
split across two workers pays its fixture twice (the tune tests' study, ~50 s, ran twice; the
report tests' sweep and the shipped experiments' compose too). Here
every test that uses one of the project's session or module fixtures joins an `xdist_group`;
tests linked through any shared fixture form one group (union-find), which `loadgroup` (xdist's
`load` schedule plus groups) sends to one worker. Fixtures cheap enough to build on each worker
are listed in `PER_WORKER`. Registered from tests/conftest.py; tests/test_xdist_groups.py checks
that a group really stays on one worker.

xdist names a test's group by appending it to the test's id, which pytest 9.2 no longer lets a
plugin change (the id is derived from another attribute): groups are then silently ignored, which
is why the `test` extra pins pytest below 9.2.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

# Shared fixtures that may be built once per worker: cheap, used all over (grouping every test that
# uses them would put half the suite on one worker), or shared across workers by design.
# (tiny_qwen2: ~6 s, nearly all of it importing transformers, which its tests need anyway.
# slurm_cluster: ~10 s to start; with every SLURM test on one cluster, the preemption test's
# requeued job did not restart within 420 s once (2026-12-03, not investigated), while one cluster
# per worker has passed every run.)
PER_WORKER = {"_one_thread", "mlflow_server", "mlflow_server_uri", "warmstart_cache", "tiny_qwen2", "slurm_cluster"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist runs the group on one worker")
    # `-n 2` means xdist's `load` schedule: on the controller it becomes `loadgroup`, the same
    # schedule plus groups ...
    if getattr(config.option, "dist", None) == "load":
        config.option.dist = "loadgroup"
    # ... and each worker must know it too: a worker appends the group to a test's id (which the
    # controller's schedule reads) only if its `loadgroup` option is set, and it sets that option
    # from the command line, where `--dist` is not given.
    if getattr(config, "workerinput", {}).get("suite_loadgroup"):
        config.option.loadgroup = True


@pytest.hookimpl(optionalhook=True)  # an xdist hook: optional, so tests run without xdist too
def pytest_configure_node(node) -> None:
    node.workerinput["suite_loadgroup"] = node.config.getvalue("dist") == "loadgroup"


def _ours(fixturedef, root: Path) -> bool:
    """A fixture of the project's tests, not one of pytest's or an installed plugin's."""
    try:
        path = Path(inspect.getsourcefile(fixturedef.func)).resolve()
    except TypeError:  # a builtin or C function
        return False
    return path.is_relative_to(root) and not {"site-packages", "dist-packages"} & set(path.parts)


def shared_fixture_keys(item: pytest.Item) -> list[str]:
    """One key per costly fixture instance the test uses: the fixture's name for a session
    fixture, the fixture and its module (or package) otherwise."""
    info = getattr(item, "_fixtureinfo", None)
    root = item.config.rootpath.resolve()
    keys = []
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info else None
        if not defs or name in PER_WORKER or not _ours(defs[-1], root):
            continue
        scope = defs[-1].scope
        if scope == "session":
            keys.append(name)
        elif scope in ("package", "module"):
            where = item.path.parent if scope == "package" else item.path
            keys.append(f"{name}-{where.resolve().relative_to(root)}")
    return keys


@pytest.hookimpl(tryfirst=True)  # before the worker's own hook, which names each test's group from its mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    parent: dict[str, str] = {}

    def root(k: str) -> str:
        while parent.setdefault(k, k) != k:
            k = parent[k]
        return k

    keyed = [(item, shared_fixture_keys(item)) for item in items]
    for _, keys in keyed:
        for k in keys[1:]:
            a, b = sorted((root(keys[0]), root(k)))
            parent[b] = a  # the smaller key names the group
    for item, keys in keyed:
        if keys:
            item.add_marker(pytest.mark.xdist_group(root(keys[0])))
