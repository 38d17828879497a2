"""The package's import graph, read from the source (no import runs): circles between modules,
private names imported across modules, and package lines per subpackage.

    python scripts/import_graph.py            # a summary
    python scripts/import_graph.py --edges    # and every module -> module edge

A circle is a strongly connected component of more than one module (module-level and
function-level imports alike: both tie the modules' code together). A private name is one
that starts with a single underscore, imported with ``from suite.x import _name`` by a module
other than suite.x. An upward import is one into a backend package (suite.embedded,
suite.verl: what runs a config) or into suite.bench from outside it (the layers below reach a
backend only through suite.backend's contract, by name), or from the shared launch layer
(suite.launch) into one of its users (suite.sweep, suite.tune).
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "suite"
UPPER = ("suite.embedded", "suite.verl", "suite.bench")  # nothing outside them imports them
LAUNCH, ITS_USERS = "suite.launch", ("suite.sweep", "suite.tune")  # the shared launch layer imports neither


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, modules: set[str]) -> tuple[set[str], list[tuple[str, str]]]:
    """(modules of the package ``path`` imports, [(module, private name)] it imports)."""
    me = module_name(path)
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found, private = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    found.add(_known(alias.name, modules))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = me.split(".") if is_pkg else me.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            if base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in modules else _known(base, modules)
                found.add(target)
                if alias.name.startswith("_") and not alias.name.startswith("__") and target != me:
                    private.append((target, alias.name))
    found.discard(me)
    found.discard("")
    return found, private


def _known(name: str, modules: set[str]) -> str:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="print every module -> module edge")
    args = ap.parse_args()
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    modules = {module_name(f) for f in files}
    graph, privates, lines = {}, [], defaultdict(int)
    for f in files:
        me = module_name(f)
        graph[me], priv = imports(f, modules)
        privates += [(me, t, n) for t, n in priv]
        sub = me.split(".")[1] if me.count(".") >= 1 and (ROOT / PACKAGE / me.split(".")[1]).is_dir() else "(top)"
        lines[sub] += len(f.read_text(encoding="utf-8").splitlines())
    comps = circles(graph)
    def inside(m, pkg):
        return m == pkg or m.startswith(pkg + ".")

    upward = sorted((me, t) for me, ts in graph.items() for t in ts for pkg in UPPER
                    if inside(t, pkg) and not inside(me, pkg) and not any(inside(me, u) for u in UPPER))
    upward += sorted((me, t) for me, ts in graph.items() if inside(me, LAUNCH) for t in ts
                     if any(inside(t, u) for u in ITS_USERS))
    print(f"modules: {len(modules)}, import edges: {sum(len(v) for v in graph.values())}")
    print(f"circles: {len(comps)}")
    for c in comps:
        print("  " + " <-> ".join(c))
    print(f"upward imports (into {', '.join(UPPER)} from below, or from {LAUNCH} into {', '.join(ITS_USERS)}): "
          f"{len(upward)}")
    for me, t in upward:
        print(f"  {me} -> {t}")
    print(f"private names imported across modules: {len(privates)}")
    for me, target, name in sorted(privates):
        print(f"  {me} <- {target}.{name}")
    print("package lines: " + ", ".join(f"{k} {v}" for k, v in sorted(lines.items()))
          + f"; total {sum(lines.values())}")
    if args.edges:
        for me in sorted(graph):
            for t in sorted(graph[me]):
                print(f"{me} -> {t}")


if __name__ == "__main__":
    main()
