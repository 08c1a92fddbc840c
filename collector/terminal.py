"""Tables for people: readable in an 80-120 column terminal and whole when piped.

rich sizes a table to the terminal, and off a terminal it assumes 80 columns and cuts headers
(`┃ co… ┃ n ┃ req… ┃`). Here headers are never cut: each column is at least as wide as the longest
line of its header (a long header breaks onto two lines instead), borders are light, and piped
output gets a console wide enough that nothing is squashed.

    console = output_console()          # a terminal: its width; a pipe or file: 200 columns
    table = compact_table("levels", ["conc", "n", "TTFT ms\\np50/p95"])

The output convention every command follows (docs/design.md, "Command line"): `--json PATH` writes
the command's result as JSON, `-` to stdout (the text for people then goes to stderr):

    with json_output(json_path):        # stdout is stderr inside when json_path is "-"
        ...print for people...
    write_json(json_path, data)
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

import click
import orjson
from rich import box
from rich.console import Console
from rich.table import Table

__all__ = ["output_console", "compact_table", "PIPE_WIDTH", "json_output", "write_json", "JSON_HELP"]

_JSON_STDOUT: contextvars.ContextVar[TextIO | None] = contextvars.ContextVar("json_stdout", default=None)
JSON_HELP = "Write the result as JSON to PATH ('-': stdout, and the text goes to stderr)."

PIPE_WIDTH = 200


def output_console(*, stderr: bool = False) -> Console:
    """A Console for command output: the terminal's width, or PIPE_WIDTH when not a terminal."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=PIPE_WIDTH)


def compact_table(
    title: str | None, headers: Sequence[str], *, caption: str | None = None, wrap: Sequence[str] = ()
) -> Table:
    """A right-aligned table whose headers are never cut; cells of columns in `wrap` may wrap."""
    table = Table(
        title=title,
        caption=caption,
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
        collapse_padding=True,
    )
    for header in headers:
        table.add_column(
            header,
            justify="right",
            no_wrap=header not in wrap,
            min_width=max(len(line) for line in header.split("\n")),
        )
    return table


@contextlib.contextmanager
def json_output(json_path: str | None) -> Iterator[None]:
    """With `--json -`, what the block prints for people goes to stderr: stdout carries the JSON only."""
    if json_path != "-":
        yield
        return
    token = _JSON_STDOUT.set(sys.stdout)  # write_json inside the block still reaches stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_STDOUT.reset(token)


def write_json(json_path: str, data: object, *, option: str = "--json", printed: str = "") -> None:
    """`data` as indented, key-sorted JSON to the file json_path (its directory created), or stdout for '-'.

    A path that cannot be written is one ClickException; `printed` ("the estimate is printed above, ")
    tells what was not lost."""
    text = (
        orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
        + b"\n"
    )
    if json_path == "-":
        stdout = _JSON_STDOUT.get() or sys.stdout
        stdout.write(text.decode())
        stdout.flush()
        return
    try:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_bytes(text)
    except OSError as exc:
        raise click.ClickException(
            f"cannot write {option} {json_path} ({exc.strerror}); {printed}pass a path in a writable "
            "directory, or - for stdout"
        ) from None
