"""The package's import graph, read from the source (no import runs): circles between modules,
private names imported across modules, modules imported by name that import their caller back,
and package lines per subpackage.

    python scripts/import_graph.py            # a summary
    python scripts/import_graph.py --edges    # and every module -> module edge

A circle is a strongly connected component of more than one module (module-level and
function-level imports alike: both tie the modules' code together). A private name is one
that starts with a single underscore, imported with ``from suite.x import _name`` by a module
other than suite.x. An upward import is one into a backend package (suite.embedded,
suite.verl: what runs a config) or into suite.bench from outside it (the layers below reach a
backend only through suite.backend's contract, by name), or from the shared launch layer
(suite.launch) into one of its users (suite.sweep, suite.tune).

A by-name import is ``importlib.import_module(X)`` in a module: its targets are the package's
module names written as strings in that file (a plugin list) and the f-strings
``f"{package}.suffix"`` there, over the backend packages of ``suite.backend.BACKENDS``. A by-name
loop is such a target that imports the caller back (the caller loads it to stay independent of
it: an import back undoes that). A call back is a backend module importing suite.cell, which
runs the backends and hands each its MLflow run.
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
BACKEND_CALLER = "suite.cell"  # runs a backend and hands it its MLflow run: a backend never imports it


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, modules: set[str], root: Path = ROOT) -> tuple[set[str], list[tuple[str, str]]]:
    """(modules of the package ``path`` imports, [(module, private name)] it imports)."""
    me = module_name(path, root)
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


def backend_packages(root: Path = ROOT) -> list[str]:
    """The values of the ``BACKENDS`` dict literal in suite/backend.py."""
    tree = ast.parse((root / PACKAGE / "backend.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "BACKENDS" and isinstance(node.value, ast.Dict):
            return [v.value for v in node.value.values if isinstance(v, ast.Constant)]
    raise SystemExit("suite/backend.py: no BACKENDS dict literal")


def by_name_targets(path: Path, modules: set[str], packages: list[str], root: Path = ROOT) -> set[str]:
    """The modules ``path`` imports with importlib.import_module (module docstring)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    calls = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "import_module"
                for n in ast.walk(tree))
    if not calls:
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
            found.add(node.value)
        elif isinstance(node, ast.JoinedStr) and len(node.values) == 2 \
                and isinstance(node.values[0], ast.FormattedValue) and isinstance(node.values[1], ast.Constant):
            found |= {f"{pkg}{node.values[1].value}" for pkg in packages} & modules
    found -= {module_name(path, root), PACKAGE, *packages}  # the prog name; the bases the f-strings extend
    return found


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


def measure(root: Path = ROOT) -> dict:
    """The package's graph and what is checked of it (module docstring)."""
    files = sorted((root / PACKAGE).rglob("*.py"))
    modules = {module_name(f, root) for f in files}
    graph, privates, lines, by_name = {}, [], defaultdict(int), {}
    packages = backend_packages(root)
    for f in files:
        me = module_name(f, root)
        graph[me], priv = imports(f, modules, root)
        by_name[me] = by_name_targets(f, modules, packages, root)
        privates += [(me, t, n) for t, n in priv]
        sub = me.split(".")[1] if me.count(".") >= 1 and (root / PACKAGE / me.split(".")[1]).is_dir() else "(top)"
        lines[sub] += len(f.read_text(encoding="utf-8").splitlines())

    def inside(m, pkg):
        return m == pkg or m.startswith(pkg + ".")

    upward = sorted((me, t) for me, ts in graph.items() for t in ts for pkg in UPPER
                    if inside(t, pkg) and not inside(me, pkg) and not any(inside(me, u) for u in UPPER))
    upward += sorted((me, t) for me, ts in graph.items() if inside(me, LAUNCH) for t in ts
                     if any(inside(t, u) for u in ITS_USERS))
    loops = sorted((me, t) for me, ts in by_name.items() for t in ts if me in graph.get(t, ()))
    backends = [f"{PACKAGE}.{p.split('.', 1)[1]}" for p in packages if "." in p]
    callbacks = sorted((me, t) for me, ts in graph.items() if any(inside(me, b) for b in backends)
                       for t in ts if t == BACKEND_CALLER)
    return {"callbacks": callbacks, "modules": modules, "graph": graph, "circles": circles(graph), "upward": upward,
            "privates": sorted(privates), "by_name": by_name, "loops": loops, "lines": dict(lines)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="print every module -> module edge")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    args = ap.parse_args()
    m = measure(args.root)
    graph, comps, upward, privates, by_name, loops, lines = (m[k] for k in (
        "graph", "circles", "upward", "privates", "by_name", "loops", "lines"))
    print(f"modules: {len(m['modules'])}, import edges: {sum(len(v) for v in graph.values())}")
    print(f"circles: {len(comps)}")
    for c in comps:
        print("  " + " <-> ".join(c))
    print(f"upward imports (into {', '.join(UPPER)} from below, or from {LAUNCH} into {', '.join(ITS_USERS)}): "
          f"{len(upward)}")
    for me, t in upward:
        print(f"  {me} -> {t}")
    print(f"private names imported across modules: {len(privates)}")
    for me, target, name in privates:
        print(f"  {me} <- {target}.{name}")
    print(f"imported by name: {sum(len(v) for v in by_name.values())} "
          f"({', '.join(f'{me} -> {len(ts)}' for me, ts in sorted(by_name.items()) if ts)}); "
          f"by-name loops (the target imports its caller back): {len(loops)}")
    for me, t in loops:
        print(f"  {me} -> {t} -> {me}")
    print(f"backends calling back into {BACKEND_CALLER} (which runs them): {len(m['callbacks'])}")
    for me, t in m["callbacks"]:
        print(f"  {me} -> {t}")
    print("package lines: " + ", ".join(f"{k} {v}" for k, v in sorted(lines.items()))
          + f"; total {sum(lines.values())}")
    if args.edges:
        for me in sorted(graph):
            for t in sorted(graph[me]):
                print(f"{me} -> {t}")


if __name__ == "__main__":
    main()
