"""The module maps in the docs name the modules that exist, every one of them.

Two maps, each checked against the files on disk when the test runs:

    docs/design.md, "Package layout"   the first code block of §3: one line per package (`name/`) or
                                       module (`name.py`), nested by two spaces a level, under
                                       `collector/`; a package's line stands for its __init__.py
    collector/sidecar/__init__.py      its docstring: one indented `name.py  what it holds` line per
                                       module of collector/sidecar/

Either fails naming the modules the map misses and the names it has that are gone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "collector"
DESIGN = ROOT / "docs" / "design.md"

ENTRY = re.compile(r"^(?P<indent> *)(?P<name>[A-Za-z_]\w*(?:\.py|/))(?:\s|$)")


def _on_disk() -> set[str]:
    """'collector/', 'collector/sidecar/', 'collector/sidecar/app.py', ... as the tree is now.

    Packages are the folders with an __init__.py; modules every other .py file.
    """
    found = set()
    for path in PACKAGE_DIR.rglob("*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py":
            found.add(relative.removesuffix("__init__.py"))
        else:
            found.add(relative)
    return found


def _design_map(text: str) -> list[str]:
    """The paths the map in `text` (docs/design.md) names, in its order (a path twice is there twice)."""
    section = text.split("## 3. Package layout", 1)[1]
    block = section.split("```", 2)[1]  # the first code block of the section
    names: list[str] = []
    folders: list[str] = []  # folders[depth] is the folder a line at depth + 1 lives in
    for line in block.splitlines():
        entry = ENTRY.match(line)
        if entry is None:
            continue  # the fence's tail, blank lines
        indent, name = len(entry["indent"]), entry["name"]
        assert indent % 2 == 0, f"design.md map: indent by two spaces a level: {line!r}"
        depth = indent // 2
        assert depth <= len(folders), f"design.md map: a line deeper than its package: {line!r}"
        path = "".join(folders[:depth]) + name
        names.append(path)
        if name.endswith("/"):
            folders[depth:] = [name]
    return names


def _sidecar_map() -> list[str]:
    """The module names collector/sidecar/__init__.py's docstring lists, in its order."""
    tree = ast.parse((PACKAGE_DIR / "sidecar" / "__init__.py").read_text())
    docstring = ast.get_docstring(tree) or ""
    return re.findall(r"^\s+(\w+\.py)\s", docstring, re.MULTILINE)


def _difference(documented: list[str], actual: set[str]) -> str:
    missing = sorted(actual - set(documented))
    gone = sorted(set(documented) - actual)
    twice = sorted({name for name in documented if documented.count(name) > 1})
    return "\n".join(
        [f"missing from the map: {name}" for name in missing]
        + [f"in the map, not on disk: {name}" for name in gone]
        + [f"in the map twice: {name}" for name in twice]
    )


def test_design_map_names_every_module_and_no_other():
    documented = _design_map(DESIGN.read_text())
    assert documented and documented[0] == "collector/", "the map starts at collector/"
    problems = _difference(documented, _on_disk())
    assert not problems, "docs/design.md, 'Package layout', disagrees with collector/:\n" + problems


def test_sidecar_map_names_every_module_and_no_other():
    actual = {path.name for path in (PACKAGE_DIR / "sidecar").glob("*.py")} - {"__init__.py"}
    problems = _difference(_sidecar_map(), actual)
    assert not problems, "collector/sidecar/__init__.py's map disagrees with collector/sidecar/:\n" + problems


def test_the_design_map_reader_follows_nesting():
    """The reader itself: a package's modules nest under it, a shallower line leaves it."""
    lines = ["collector/", "  a.py", "  pkg/", "    b.py", "  c.py"]
    sample = (
        "## 3. Package layout\n\n```\n" + "\n".join(f"{line}   what it holds" for line in lines) + "\n```\n"
    )
    assert _design_map(sample) == [
        "collector/",
        "collector/a.py",
        "collector/pkg/",
        "collector/pkg/b.py",
        "collector/c.py",
    ]
