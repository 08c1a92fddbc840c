"""The documented surface is pinned, and only it: the CLI (every command and its options), the
metric catalog (names, types, labels), the request-log schema (columns and SQL types) and the
names of the documented modules (the estimate value, the record, the catalog, the engine sources'
extension point). tests/fixtures/public_api.json holds them; changing one is a visible change
(regenerate with UPDATE_PUBLIC_API=1 and review the diff). Internal modules are not pinned (that
pinned churn: re-pinned in 43 of 195 commits), but each declares `__all__` and every name it lists
exists."""

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


# the modules docs/design.md and docs/capacity.md present as what others build on
DOCUMENTED_MODULES = ("collector.capacity", "collector.catalog", "collector.record", "collector.sources")


def _cli() -> dict[str, list[str]]:
    """{"headroom run": ["--db", ...], ...}: every command and its options, as --help shows them."""
    import click

    from collector.cli import main

    found: dict[str, list[str]] = {}

    def walk(command: click.Command, path: str, context: click.Context | None) -> None:
        found[path] = sorted(opt for p in command.params for opt in p.opts if opt.startswith("-"))
        if isinstance(command, click.Group):
            here = click.Context(command, parent=context, info_name=path.split()[-1])
            for name in command.list_commands(here):
                child = command.get_command(here, name)
                if child is not None and not child.hidden:
                    walk(child, f"{path} {name}", here)

    walk(main, "headroom", None)
    return found


def _surface() -> dict[str, object]:
    from collector.catalog import CATALOG
    from collector.store.schema import COLUMNS

    return {
        "cli": _cli(),
        "metrics": {m.name: [m.type, *m.labels] for m in CATALOG},
        "record": [list(column) for column in COLUMNS],
        "modules": {m: sorted(importlib.import_module(m).__all__) for m in DOCUMENTED_MODULES},
    }


def test_the_documented_surface_is_the_pinned_one():
    surface = json.loads(json.dumps(_surface()))
    if os.environ.get("UPDATE_PUBLIC_API") == "1":
        PINNED.write_text(json.dumps(surface, indent=1, sort_keys=True) + "\n")
    assert surface == json.loads(PINNED.read_text()), (
        "the documented surface changed; see this module's docstring"
    )


def test_the_pin_is_not_vacuous():
    surface = _surface()
    cli, metrics = surface["cli"], surface["metrics"]
    assert isinstance(cli, dict) and "--db" in cli["headroom run"] and "--levels" in cli["headroom probe"]
    assert isinstance(metrics, dict) and "headroom_capacity_knee_tokens" in metrics
    assert ["request_id", "VARCHAR NOT NULL"] in surface["record"]


def test_every_listed_name_exists():
    absent = [
        f"{module}.{name}"
        for package in _public_api().values()
        for module in package
        for name in importlib.import_module(module).__all__
        if not hasattr(importlib.import_module(module), name)
    ]
    assert absent == []
