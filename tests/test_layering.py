"""Layers that point one way: which of collector's packages may import which, read from the source.

Every module's imports are read with `ast`, those inside functions included, so an import moved
into a function to dodge a cycle is still an edge here. The allowed direction is the table below;
docs/design.md ("Package layout") shows the same table, and a test keeps the two equal.
"""

from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "collector"

# package -> the packages it may import. Root modules that hold no wiring (catalog, record, tokens,
# inflight, sse, timewin, serving, upstream, tasks, exposition, terminal, capacity, the version) are open to
# every package; entry points (cli, demo) to none.
ALLOWED: dict[str, set[str]] = {
    "sources": set(),
    "store": set(),
    "lake": {"store"},
    "rules": set(),
    "analysis": {"store", "sources", "lake"},
    "report": {"store", "analysis", "lake"},
    "sim": {"analysis", "store"},
    "dashboards": {"rules"},
    "alerts": {"rules"},
    "integrations": {"rules", "store", "alerts", "lake"},
    "service": {"store", "analysis", "report"},
    "sidecar": {"store", "sources", "analysis", "report", "service", "lake"},
    "backtest": {"sim", "analysis", "alerts", "rules", "store", "lake"},
}
FOUNDATION = {
    "__init__",
    "catalog",
    "record",
    "tokens",
    "inflight",
    "sse",
    "timewin",
    "serving",
    "upstream",
    "tasks",
    "exposition",
    "terminal",
    "capacity",
    "goodput",
    "engine_timings",
}
ENTRY_POINTS = {"cli", "demo"}


def _modules() -> dict[str, ast.Module]:
    """{'collector.sidecar.app': its AST, ...} for every module of the package."""
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = ast.parse(path.read_text(), str(path))
    return found


MODULES = _modules()


def _imported(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, imported module) for every import in `tree`, at any depth.

    `from collector.store import estimates` imports the module collector.store.estimates.
    """
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found.extend(
                (node.lineno, f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
                for alias in node.names
            )
    return found


def _area(module: str) -> str:
    """'collector.sidecar.app' -> 'sidecar'; 'collector.catalog' -> 'catalog'; 'collector' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _edges() -> dict[tuple[str, str], list[str]]:
    """{(from area, to area): ['collector/x.py:12 imports collector.y', ...]} between different areas."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, tree in MODULES.items():
        for line, target in _imported(tree):
            if target != "collector" and not target.startswith("collector."):
                continue
            source_area, target_area = _area(module), _area(target)
            if source_area != target_area:
                where = f"{module.replace('.', '/')}.py:{line} imports {target}"
                edges.setdefault((source_area, target_area), []).append(where)
    return edges


EDGES = _edges()


def test_imports_are_absolute():
    relative = [
        f"{module}:{node.lineno}"
        for module, tree in MODULES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert not relative, "write `from collector.x import y`, so this test can follow every import"


def test_the_allowed_table_itself_has_no_cycle():
    try:
        tuple(TopologicalSorter(ALLOWED).static_order())
    except CycleError as exc:
        pytest.fail(f"the allowed-dependency table has a cycle: {exc.args[1]}")


def test_every_package_is_in_the_table():
    packages = {path.parent.name for path in PACKAGE_DIR.glob("*/__init__.py")}
    assert packages == set(ALLOWED), "add the new package to ALLOWED here and in docs/design.md"


def test_every_root_module_is_a_foundation_or_an_entry_point():
    roots = {path.stem for path in PACKAGE_DIR.glob("*.py")}
    assert roots == FOUNDATION | ENTRY_POINTS, "name the new root module in FOUNDATION or ENTRY_POINTS"


def test_packages_import_only_what_the_table_allows():
    wrong = [
        where
        for (source, target), places in sorted(EDGES.items())
        if source in ALLOWED and target in ALLOWED and target not in ALLOWED[source]
        for where in places
    ]
    assert not wrong, "imports against the layering (docs/design.md, 'Package layout'):\n" + "\n".join(wrong)


def test_packages_import_no_entry_point_and_foundations_import_no_package():
    wrong = [
        where
        for (source, target), places in sorted(EDGES.items())
        if (source in ALLOWED and target in ENTRY_POINTS)
        or (source in FOUNDATION and (target in ALLOWED or target in ENTRY_POINTS))
        for where in places
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_packages():
    graph = {
        area: {target for (source, target) in EDGES if source == area and target in ALLOWED}
        for area in ALLOWED
    }
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        cycle = exc.args[1]
        places = [p for a, b in zip(cycle, cycle[1:]) for p in EDGES[(a, b)]]
        pytest.fail("import cycle " + " -> ".join(cycle) + ":\n" + "\n".join(places))


def _local_imports(tree: ast.Module) -> list[ast.stmt]:
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [n for f in functions for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_every_function_local_import_says_why():
    """A lazy import (for `--help` speed, or a heavy optional library) carries a comment that says so.

    The comment is on the import's line, or above the block of imports (and blank lines) it is in.
    """
    missing = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in _local_imports(ast.parse("\n".join(lines))):
            index = node.lineno - 1
            while index > 0 and re.match(r"\s*$|\s*(from \S+ )?import ", lines[index - 1]):
                index -= 1
            above = lines[index - 1].strip() if index > 0 else ""
            if "#" not in lines[node.lineno - 1] and not above.startswith("#"):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not missing, "function-local imports without a comment saying why:\n" + "\n".join(missing)


def _documented_table() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("### Allowed dependencies", 1)[1].split("\n#", 1)[0]
    table = {}
    for row in re.findall(r"^\| `(\w+)` \|(.*)\|\s*$", section, re.MULTILINE):
        table[row[0]] = set(re.findall(r"`(\w+)`", row[1]))
    return table


def test_docs_design_shows_the_same_table():
    assert _documented_table() == ALLOWED


def _module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def test_every_module_serves_the_product():
    """No module under collector/ is there only for the tests (they keep theirs in tests/support):
    each is reachable from the `headroom` entry point (collector.cli, its lazy command table) through
    imports, those inside functions included, or from a test-free name given as a string."""
    modules = _module_names()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            found = []
            if isinstance(node, ast.ImportFrom) and node.module:
                found = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            edges[name].update(m for m in found if m in modules)
        # the lazy command table ("collector.sim.cli:sim") and child processes (`-m module`)
        edges[name].update(m for m in re.findall(r"[\"'](collector(?:\.\w+)+)[\":']", source) if m in modules)
    for name in list(modules):  # a package's modules reach its __init__
        edges[name].update(p for p in modules if name.startswith(p + "."))
    reached, todo = set(), ["collector.cli"]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(edges[name])
    assert "collector.sidecar.wiring" in reached and "collector.sim.app" in reached  # not vacuous
    assert sorted(set(modules) - reached) == []


SIDECAR_MAX_LINES = 450


def test_no_sidecar_module_is_over_450_lines():
    """A sidecar module past 450 lines holds more than one thing: cut it along a seam (as server.py
    gave the descriptor budget and the per-address bounds their own modules, and upstream.py its
    pooled connection), never by deleting its docs."""
    long = {
        str(path.relative_to(ROOT)): count
        for path in sorted((PACKAGE_DIR / "sidecar").rglob("*.py"))
        if (count := len(path.read_text().splitlines())) > SIDECAR_MAX_LINES
    }
    assert not long, f"over {SIDECAR_MAX_LINES} lines, split along a seam: {long}"
