"""docs/architecture.md's "What each verb refuses" is the count the refusal tests make."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_refusals_table_is_current():
    spec = importlib.util.spec_from_file_location("refusals_table", ROOT / "scripts" / "refusals_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    table = mod.collect()
    assert sum(table["run"].values()) >= 200 and len(table) >= 10, dict(table)
    assert mod.current() == mod.render(table), "stale: run `python scripts/refusals_table.py --write`"
