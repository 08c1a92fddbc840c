"""Tables for people: readable in an 80-120 column terminal and whole when piped.

rich sizes a table to the terminal, and off a terminal it assumes 80 columns and cuts headers
(`┃ co… ┃ n ┃ req… ┃`). Here headers are never cut: each column is at least as wide as the longest
line of its header (a long header breaks onto two lines instead), borders are light, and piped
output gets a console wide enough that nothing is squashed.

    console = output_console()          # a terminal: its width; a pipe or file: 200 columns
    table = compact_table("levels", ["conc", "n", "TTFT ms\\np50/p95"])
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

__all__ = ["output_console", "compact_table", "PIPE_WIDTH"]

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
