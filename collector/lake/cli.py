"""`headroom lake commit|maintain|import`: the committer, the upkeep and the one-box import."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # the [lake] extra loads when a command runs
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from collector.lake.layout import Lake
    from collector.lake.metrics import CommitterMetrics

__all__ = ["lake", "catalog_options"]

_MISSING_EXTRA = "the lake commands need pyiceberg: pip install 'llm-headroom[lake]'"


def catalog_options(function: Any) -> Any:
    """--catalog, --lake, --table and --catalog-property, shared by every lake command."""
    function = click.option(
        "--catalog-property",
        "catalog_properties",
        multiple=True,
        metavar="KEY=VALUE",
        help="A property for the catalog (a REST catalog's credential, warehouse, s3.region...); repeatable.",
    )(function)
    function = click.option(
        "--table", default="headroom.requests", show_default=True, help="The Iceberg table (namespace.name)."
    )(function)
    function = click.option(
        "--lake",
        "lake_uri",
        required=True,
        envvar="HEADROOM_LAKE",
        metavar="URI",
        help="Where the sidecars stage files (`headroom run --lake`): a directory, file:// or s3://... "
        "[env: HEADROOM_LAKE].",
    )(function)
    function = click.option(
        "--catalog",
        "catalog_uri",
        required=True,
        envvar="HEADROOM_CATALOG",
        metavar="URI",
        help="sqlite:///path.db, postgresql://user@host/db, or a REST catalog's http(s):// URL "
        "[env: HEADROOM_CATALOG; keep passwords out of the command line].",
    )(function)
    return function


def _properties(pairs: tuple[str, ...]) -> dict[str, str]:
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--catalog-property")
        found[key] = value
    return found


def _open(catalog_uri: str, lake_uri: str, pairs: tuple[str, ...]) -> tuple[Any, Any]:
    try:
        # lazy: pyiceberg (the [lake] extra) loads when the command runs, not for --help
        from collector.lake.layout import Lake
        from collector.lake.table import open_catalog  # lazy: pyiceberg, the [lake] extra
    except ImportError as exc:
        raise click.ClickException(f"{_MISSING_EXTRA} ({exc})") from None
    try:
        lake_location = Lake.parse(lake_uri)
        return open_catalog(catalog_uri, lake_location, properties=_properties(pairs)), lake_location
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except Exception as exc:  # sqlalchemy or the REST client: the catalog cannot be reached
        raise click.ClickException(f"cannot open --catalog ({type(exc).__name__}: {exc})") from None


@click.group("lake")
def lake() -> None:
    """The fleet's request log on Apache Iceberg: commit staged files, maintain the table, import.

    \b
    Examples:
      headroom lake commit --catalog sqlite:///lake/catalog.db --lake /data/lake
      HEADROOM_CATALOG=postgresql://headroom@db/iceberg headroom lake commit --lake s3://logs/headroom --every 30
      headroom lake maintain --catalog sqlite:///lake/catalog.db --lake /data/lake --retention-days 400
      headroom lake import --catalog sqlite:///lake/catalog.db --lake /data/lake --db headroom.duckdb

    Everything these commands write to a local lake (Iceberg metadata, whose column bounds name
    tenants; compacted data files; a sqlite catalog) is the owner's alone, as the sidecars'
    staged files are: files 0600, folders 0700.
    """
    from collector.lake.layout import private_files  # lazy: pyarrow loads when a command runs

    private_files()


@lake.command("commit")
@catalog_options
@click.option(
    "--every",
    type=click.FloatRange(1),
    metavar="SECONDS",
    help="Run as a loop: commit, then wait this long (30 keeps rows visible within 2 minutes "
    "of their request with the sidecar's 60 s roll). Without it: one pass.",
)
@click.option(
    "--metrics-listen",
    metavar="HOST:PORT",
    help="Serve the committer's own /metrics here (last success, files committed and quarantined, "
    "rows, files waiting, lag per writer), e.g. 0.0.0.0:9101; with --every.",
)
def commit(
    catalog_uri: str,
    lake_uri: str,
    table: str,
    catalog_properties: tuple[str, ...],
    every: float | None,
    metrics_listen: str | None,
) -> None:
    """Register the files the sidecars staged in the Iceberg table (creating it on first use).

    \b
    Examples:
      headroom lake commit --catalog sqlite:///lake/catalog.db --lake /data/lake
      headroom lake commit --catalog postgresql://headroom@db/iceberg --lake s3://logs/headroom --every 30 \\
        --metrics-listen 0.0.0.0:9101
      headroom lake commit --catalog https://polaris:8181/api/catalog --catalog-property warehouse=logs \\
        --catalog-property credential=ID:SECRET --lake s3://logs/headroom

    Idempotent: a file is added once, however often this runs, and two committers at once are
    safe (the catalog lets one commit win; the other reloads and retries). Each staged file is
    checked on its own: a bad one (unreadable, a schema the table does not take, a sequence far
    ahead of its writer) is moved to quarantine/ in the lake and named in the log, and every good
    file is committed in the same pass. One pass exits 1 when it quarantined a file.
    """
    # lazy: pyiceberg (the [lake] extra) loads when the command runs, not for --help
    from collector.lake.metrics import CommitterMetrics

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    catalog, location = _open(catalog_uri, lake_uri, catalog_properties)
    metrics = CommitterMetrics()
    if metrics_listen is not None:
        try:
            metrics.serve(metrics_listen)
        except (ValueError, OSError) as exc:
            raise click.UsageError(str(exc)) from None
    stop = threading.Event()
    last: Table | None = None
    while True:
        set_aside, last = _commit_pass(catalog, location, table, metrics, every, last)
        if every is None:
            if set_aside:
                raise click.ClickException(f"{set_aside} staged files quarantined (named above)")
            return
        if stop.wait(every):
            return


def _commit_pass(
    catalog: Catalog,
    location: Lake,
    table: str,
    metrics: CommitterMetrics,
    every: float | None,
    last: Table | None,
) -> tuple[int, Table | None]:
    """One pass with its metrics; returns the files it quarantined and the table as last read.
    A failure raises without --every, else is reported and the loop goes on."""
    from collector.lake.table import CommitResult, commit_staged  # lazy: pyiceberg, the [lake] extra

    result = CommitResult(table=last)
    metrics.pass_begins()

    def progress(r: CommitResult) -> None:
        metrics.counted(r.files, r.rows, len(r.quarantined))
        click.echo(f"committed {r.files} files, {r.rows} rows ({r.pending} staged files left)", err=True)

    try:
        commit_staged(catalog, location, table, on_commit=progress, result=result)
    except Exception as exc:  # the catalog or the lake is away: say so; the loop tries again
        metrics.counted(result.files, result.rows, len(result.quarantined))
        _backlog(metrics, location, result.table)
        if every is None:
            raise click.ClickException(f"commit failed ({type(exc).__name__}: {exc})") from None
        click.echo(f"commit failed ({type(exc).__name__}: {exc}); retrying in {every:g} s", err=True)
        return len(result.quarantined), result.table
    metrics.counted(result.files, result.rows, len(result.quarantined))
    metrics.succeeded()
    _backlog(metrics, location, result.table)
    click.echo(
        f"{table}: {result.files} files, {result.rows} rows in {result.commits} commits"
        f" ({result.conflicts} conflicts retried, {len(result.quarantined)} files quarantined,"
        f" {len(result.unreadable)} unreadable left staged)",
        err=True,
    )
    return len(result.quarantined), result.table


def _backlog(metrics: CommitterMetrics, location: Lake, iceberg: Table | None) -> None:
    """The backlog gauges against the marks last read; left as they were when the lake is away too."""
    from collector.lake.table import backlog, quarantined_files  # lazy: pyiceberg, the [lake] extra

    if iceberg is None:
        return
    try:
        metrics.backlog(backlog(location, iceberg), quarantined_files(location))
    except Exception as exc:
        logging.getLogger(__name__).warning("cannot list the lake for the backlog (%s)", exc)


@lake.command("maintain")
@catalog_options
@click.option(
    "--seal-hours",
    default=2.0,
    show_default=True,
    type=click.FloatRange(0),
    help="A day is sealed this long after it ends (late rows).",
)
@click.option(
    "--min-files",
    default=2,
    show_default=True,
    type=click.IntRange(2),
    help="Compact a sealed day holding at least this many files.",
)
@click.option(
    "--snapshot-age",
    default=6.0,
    show_default=True,
    type=click.FloatRange(0),
    metavar="HOURS",
    help="Expire snapshots older than this.",
)
@click.option(
    "--retention-days", type=click.IntRange(1), help="Delete days older than this [default: keep every day]."
)
@click.option(
    "--memory-mb",
    default=2_048,
    show_default=True,
    type=click.IntRange(64),
    help="DuckDB's memory for compacting one day; past it the sort spills to a temporary directory "
    "(a 100 M-row day: 2.5 GB peak, BENCHMARKS.md §9b).",
)
def maintain_command(
    catalog_uri: str,
    lake_uri: str,
    table: str,
    catalog_properties: tuple[str, ...],
    seal_hours: float,
    min_files: int,
    snapshot_age: float,
    retention_days: int | None,
    memory_mb: int,
) -> None:
    """Compact sealed days, expire old snapshots, drop days past retention, delete unreferenced files.

    \b
    Examples:
      headroom lake maintain --catalog sqlite:///lake/catalog.db --lake /data/lake
      headroom lake maintain --catalog postgresql://headroom@db/iceberg --lake s3://logs/headroom --retention-days 400

    Each sealed day becomes one file sorted by model and admission time, each request_id once.
    Safe while `lake commit` runs: a day that gained files meanwhile is read again.
    """
    # lazy: pyiceberg (the [lake] extra) loads when the command runs, not for --help
    from collector.lake.table import maintain

    catalog, location = _open(catalog_uri, lake_uri, catalog_properties)
    result = maintain(
        catalog,
        location,
        table,
        seal_hours=seal_hours,
        min_files=min_files,
        snapshot_age=timedelta(hours=snapshot_age),
        retention_days=retention_days,
        memory_mb=memory_mb,
        on_day=lambda day, before, _after: click.echo(f"compacted {day}: {before} files -> 1", err=True),
    )
    click.echo(
        f"{table}: {len(result.days_compacted)} days compacted ({result.files_before} files -> "
        f"{result.files_after}, {result.duplicates_dropped} repeated rows dropped), "
        f"{result.snapshots_expired} snapshots expired, {result.days_deleted} days past retention "
        f"deleted, {result.files_removed} unreferenced files removed",
        err=True,
    )


@lake.command("import")
@catalog_options
@click.option(
    "--db",
    "db_path",
    required=True,
    type=click.Path(dir_okay=False),
    metavar="PATH",
    help="A one-box DuckDB request log (`headroom run --db`).",
)
def import_command(
    catalog_uri: str, lake_uri: str, table: str, catalog_properties: tuple[str, ...], db_path: str
) -> None:
    """Add a one-box DuckDB request log's sealed days (before today, UTC) to the fleet's table.

    \b
    Examples:
      headroom lake import --catalog sqlite:///lake/catalog.db --lake /data/lake --db headroom.duckdb

    A day is known by what it holds (its instance names and request ids), not by the file's
    path: importing the same file again adds nothing, days sealed since are added, and a second
    box's log at the same path adds its own days. Works while the sidecar owning the file runs
    (through its snapshot, as `headroom report --db` reads).
    """
    # lazy: pyiceberg (the [lake] extra) loads when the command runs, not for --help
    from collector.lake.table import import_duckdb
    from collector.store.owner import OwnerError, open_request_log
    from collector.store.schema import COLUMN_NAMES

    catalog, location = _open(catalog_uri, lake_uri, catalog_properties)
    today = datetime.now(UTC).date()
    try:
        with open_request_log(db_path) as store:
            found = store.query(
                "SELECT DISTINCT CAST(timezone('UTC', admitted_at) AS DATE) AS day FROM requests "
                "WHERE admitted_at < ? ORDER BY day",
                [datetime(today.year, today.month, today.day, tzinfo=UTC)],
            )
            days: list[tuple[date, Any]] = []
            columns = ", ".join(COLUMN_NAMES)
            sealed: list[date] = [row[0] for row in found if row[0] is not None]
            for done, day in enumerate(sealed, 1):
                click.echo(f"reading {day} ({done}/{len(sealed)})", err=True)
                start = datetime(day.year, day.month, day.day, tzinfo=UTC)
                sql = f"SELECT {columns} FROM requests WHERE admitted_at >= ? AND admitted_at < ?"
                days.append((day, store.arrow(sql, [start, start + timedelta(days=1)])))
    except (FileNotFoundError, OwnerError) as exc:
        raise click.ClickException(f"--db {db_path}: {exc}") from None
    result = import_duckdb(catalog, location, days, table)
    click.echo(
        f"{table}: {len(days)} sealed days read, {result.files} files and {result.rows} rows added", err=True
    )
