"""Each package's public names are pinned: every module's `__all__`, by package, equals
tests/fixtures/public_api.json, and every name listed exists. Adding, removing or renaming a
public name is then a visible change (regenerate with UPDATE_PUBLIC_API=1 and review the diff)."""

from __future__ import annotations

import ast
import importlib
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINNED = ROOT / "tests" / "fixtures" / "public_api.json"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _declared(path: Path) -> list[str] | None:
    """The module's `__all__` as written (read with ast: no import), None when it has none."""
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
            return sorted(ast.literal_eval(node.value))
    return None


def _public_api() -> dict[str, dict[str, list[str]]]:
    """{package: {module: sorted __all__}}; root modules are the package 'collector'."""
    api: dict[str, dict[str, list[str]]] = {}
    for path in sorted((ROOT / "collector").rglob("*.py")):
        names = _declared(path)
        if names is None:
            continue
        module = _module_name(path)
        package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
        api.setdefault(package, {})[module] = names
    return api


def test_every_module_declares_its_public_names():
    missing = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "collector").rglob("*.py")
        if p.name != "__init__.py" and _declared(p) is None
    ]
    assert not missing, f"give these modules an __all__: {missing}"


def test_each_packages_public_names_are_the_pinned_ones():
    api = _public_api()
    if os.environ.get("UPDATE_PUBLIC_API") == "1":
        PINNED.write_text(json.dumps(api, indent=1, sort_keys=True) + "\n")
    assert api == json.loads(PINNED.read_text()), "public names changed; see this module's docstring"


def test_every_listed_name_exists():
    absent = [
        f"{module}.{name}"
        for package in _public_api().values()
        for module in package
        for name in importlib.import_module(module).__all__
        if not hasattr(importlib.import_module(module), name)
    ]
    assert absent == []
