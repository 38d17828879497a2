"""docs/config.md names every config group, option and key: it is what scripts/config_reference.py
generates from the config store, so a new option or key cannot go undocumented."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_config_reference_is_current():
    text = _generator().render()
    assert (ROOT / "docs" / "config.md").read_text() == text, "stale: run `python scripts/config_reference.py --write`"


def test_it_names_every_group_option_and_key():
    from suite.config import known_keys
    from suite.hydra_compat import config_groups

    text = (ROOT / "docs" / "config.md").read_text()
    for group, options in config_groups().items():
        for option in options:
            assert f"| {group} | {option}" in text, (group, option)
    keys = known_keys()
    leaves = [k for k in keys if not any(other.startswith(f"{k}.") for other in keys)]
    missing = [k for k in leaves if f"`{k}`" not in text]
    assert not missing, missing
    # a field's comment reaches its row (the default's "why" is the point of the reference)
    assert "| `uaq.s` | `1.5` | UAQ invariant scale" in text
