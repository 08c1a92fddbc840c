"""Writing generated files, or checking the committed copies: what both `generate` commands do.

write_or_check({"a.json": "..."}, Path("dashboards"), check=True, command="dashboards generate")
    -> exit 1 naming a.json when dashboards/a.json is missing or differs byte for byte
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from collector.rules.render import write_files

__all__ = ["stale_files", "write_or_check"]


def stale_files(files: dict[str, str], directory: Path) -> list[str]:
    """Names in `files` whose committed copy in `directory` is missing or differs byte for byte."""
    stale = []
    for name, text in sorted(files.items()):
        path = directory / name
        if not path.is_file() or path.read_bytes() != text.encode("utf-8"):
            stale.append(name)
    return stale


def write_or_check(files: dict[str, str], out: Path, check: bool, command: str) -> None:
    """Write `files` into `out`, or with `check` exit 1 when the copies there are stale."""
    if check:
        stale = stale_files(files, out)
        if stale:
            click.echo(f"stale in {out}: {', '.join(stale)}; run `headroom {command}` and commit", err=True)
            sys.exit(1)
        click.echo(f"{len(files)} files in {out} are up to date")
        return
    try:
        written = write_files(files, out)
    except OSError as exc:
        raise click.ClickException(
            f"cannot write into --out {out} ({exc.strerror}: {exc.filename}); "
            "pass a directory you can write to"
        ) from None
    for path in written:
        click.echo(f"wrote {path}")
