"""One reader entry for both request logs: a DuckDB file (`--db`) or the fleet's table (`--catalog --lake`).

Importing this module loads neither pyiceberg nor the table: a reader without `--lake` never needs
the `[lake]` extra.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:  # imported where used: a command's --help loads no DuckDB through reader_options
    from collector.store.db import RequestStore

__all__ = ["open_log", "reader_options", "reader_window", "catalog_option", "MISSING_LAKE_EXTRA"]

MISSING_LAKE_EXTRA = "reading the fleet's table needs pyiceberg: pip install 'llm-headroom[lake]'"
F = TypeVar("F", bound=Callable[..., Any])


# --catalog beside --lake on a command that reads or writes the fleet's tables (the lake's own
# `lake commit` requires it and says more; a sidecar's says what it publishes from it)
catalog_option = click.option(
    "--catalog",
    "catalog_uri",
    envvar="HEADROOM_CATALOG",
    metavar="URI",
    help="With --lake: the Iceberg catalog (sqlite:///path.db, postgresql://..., http(s):// REST) "
    "[env: HEADROOM_CATALOG].",
)


def reader_options(function: F) -> F:
    """--lake, --catalog and --table on a reader command (the table instead of --db)."""
    function = click.option(
        "--table",
        "lake_table",
        default="headroom.requests",
        show_default=True,
        help="The Iceberg table, with --lake.",
    )(function)
    function = catalog_option(function)
    function = click.option(
        "--lake",
        "lake_uri",
        metavar="URI",
        help="Read the fleet's Iceberg table (`headroom lake commit`) in this lake instead of --db.",
    )(function)
    return function


def reader_window(
    db: str | None, lake_uri: str | None, since: datetime | None, until: datetime | None
) -> datetime:
    """A reader command's window end (`until`, else now), once it has checked its arguments: one
    log (--db or --lake, not both, not neither) and a window that is not empty (a window without
    a start is never empty)."""
    from collector.timewin import utc_now  # noqa: PLC0415 - a command's --help imports nothing more

    if (db is None) == (lake_uri is None):
        raise click.UsageError("give --db PATH or --lake URI (with --catalog), one of them")
    end = until or utc_now()
    if since is not None and end <= since:
        raise click.BadParameter(
            f"the window is empty: --since {since:%Y-%m-%dT%H:%M}Z is not before --until {end:%Y-%m-%dT%H:%M}Z",
            param_hint="--since",
        )
    return end


@contextlib.contextmanager
def open_log(
    db: str | None,
    catalog_uri: str | None = None,
    lake_uri: str | None = None,
    *,
    table: str = "headroom.requests",
    since: datetime | None = None,
    until: datetime | None = None,
) -> Iterator[RequestStore]:
    """A read-only RequestStore: the fleet's table when `lake_uri` is given, else the file `db`.

    With a lake, only rows admitted in [since, until) are read (the table is pruned by day).
    Raises ValueError for a missing --catalog or extra, FileNotFoundError when there is nothing to
    read (no file, no table yet), and what open_request_log raises.
    """
    if lake_uri:
        if not catalog_uri:
            raise ValueError("--lake needs --catalog (or HEADROOM_CATALOG): the table's catalog URI")
        try:
            from collector.lake.read import open_lake_log  # lazy: pyiceberg, the [lake] extra
        except ImportError as exc:
            raise ValueError(f"{MISSING_LAKE_EXTRA} ({exc})") from None
        with open_lake_log(catalog_uri, lake_uri, table=table, since=since, until=until) as store:
            yield store
        return
    if db is None:
        raise ValueError("give --db PATH, or --lake URI with --catalog URI")
    from collector.store.owner import open_request_log  # lazy: DuckDB (see TYPE_CHECKING above)

    with open_request_log(db) as store:
        yield store
