"""The package's import graph (scripts/import_graph.py): no circles, no upward imports, no private
names across modules, no module imported by name that imports its caller back, no backend calling
back into suite.cell. The detector itself is checked on a small package that has each fault."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(graph)


def test_the_package_has_none_of_the_faults():
    m = graph.measure()
    assert len(m["modules"]) > 100
    assert m["circles"] == [] and m["upward"] == [] and m["privates"] == []
    assert m["loops"] == [] and m["callbacks"] == []
    # the by-name imports are found: the backends' modules and the verbs' plugins
    assert {"suite.embedded.backend", "suite.verl.backend"} <= m["by_name"]["suite.backend"]
    assert {"suite.embedded.config", "suite.verl.config"} <= m["by_name"]["suite.config"]
    assert "suite.sweep.cli" in m["by_name"]["suite.cli"]


def test_each_fault_is_found_in_a_package_that_has_it(tmp_path):
    def write(rel: str, text: str) -> None:
        path = tmp_path / "suite" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))

    write("__init__.py", "")
    write("backend.py", """
        import importlib
        from suite.contract import RunSummary
        BACKENDS = {"embedded": "suite.embedded"}
        def get(name):
            return importlib.import_module(f"{BACKENDS[name]}.backend")
        """)
    write("contract.py", "RunSummary = dict\n")
    write("cell.py", "from suite.backend import get\n")
    write("embedded/__init__.py", "")
    write("embedded/backend.py", "from suite.backend import get\nfrom suite.cell import get as again\n")
    write("a.py", "from suite.b import _hidden\n")
    write("b.py", "from suite.a import x\n_hidden = 1\n")
    m = graph.measure(tmp_path)
    assert m["by_name"]["suite.backend"] == {"suite.embedded.backend"}
    assert m["loops"] == [("suite.backend", "suite.embedded.backend")]
    assert m["callbacks"] == [("suite.embedded.backend", "suite.cell")]
    assert ["suite.a", "suite.b"] in m["circles"]
    assert ("suite.a", "suite.b", "_hidden") in m["privates"]
    assert ("suite.cell", "suite.embedded.backend") not in m["upward"]  # by name, not an import edge
