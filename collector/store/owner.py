"""Reading a request log that another process owns, through that process: the single-box path.

DuckDB lets one process open a file read-write and nobody else open it at all (docs/domain.md
§11), so while `headroom run --db headroom.duckdb` serves, `headroom report --db headroom.duckdb`
cannot open the file. The owner therefore leaves two files beside the database:

    headroom.duckdb.owner   {"url": "http://127.0.0.1:9100/headroom", "proxy": "http://127.0.0.1:9100",
                             "token": "file", "pid": 4242}
    headroom.duckdb.token   the bearer token of those routes (mode 0600), where "token" is "file";
                            "env" means the owner took HEADROOM_TOKEN, which the reader needs too

and serves the store's routes under `url` (docs/store.md, "Reading while the sidecar
runs"). `open_request_log(db)` opens the file read-only when nobody holds it, and otherwise asks
the owner for a consistent copy (GET <url>/v1/snapshot: DuckDB's COPY FROM DATABASE into a
temporary file), which it opens read-only and deletes on close. Every reader (the passive curve,
the weekly report, the alert backtest) then runs its own SQL on a RequestStore as before.

A reader that needs only the published estimates (`headroom integrations keda|gateway|llm-d
--db`) copies nothing: `read_published(db)` decides over the file read-only when nobody holds it,
and otherwise asks the owner what it publishes (GET <url>/v1/query/estimate, the same decision
its gauges show: `published_from_owner`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from collector.store.arrow import ARROW_STREAM_TYPE, Rows, rows_to_ipc

if TYPE_CHECKING:  # imported where used: serving processes never load httpx for this, and a
    import httpx  # --lake sidecar (its token, service.auth) never loads DuckDB

    from collector.store.db import RequestStore
    from collector.store.decision import Published  # lazy: decision loads DuckDB (see the imports)

__all__ = [
    "Owner",
    "OwnerError",
    "TOKEN_ENV",
    "token_file_for",
    "owner_file_for",
    "write_owner",
    "remove_owner",
    "find_owner",
    "open_request_log",
    "fetch_snapshot",
    "published_from_owner",
    "read_published",
    "send_rows",
    "is_lock_error",
]

TOKEN_ENV = "HEADROOM_TOKEN"
SNAPSHOT_TIMEOUT_S = 120.0
QUERY_TIMEOUT_S = 60.0
INGEST_TIMEOUT_S = 60.0


class OwnerError(RuntimeError):
    """The database is held by a process that cannot be asked (no owner file, refused, gone)."""


@dataclass(frozen=True)
class Owner:
    """Where the process holding a database serves its routes, and the token they want."""

    url: str  # base of the store routes, e.g. http://127.0.0.1:9100/headroom
    proxy: str | None  # the sidecar's own base URL (its OpenAI proxy), when the owner is a sidecar
    token: str


def token_file_for(db_path: str | os.PathLike[str] | None) -> Path | None:
    """Where a generated token lives: `<db>.token` beside the database, None for :memory:."""
    if db_path is None or str(db_path) == ":memory:":
        return None
    return Path(f"{db_path}.token")


def owner_file_for(db_path: str | os.PathLike[str]) -> Path:
    """`headroom.duckdb` -> `headroom.duckdb.owner`."""
    return Path(f"{db_path}.owner")


def write_owner(
    db_path: str | os.PathLike[str], url: str, proxy: str | None = None, *, token_in_file: bool = True
) -> Path:
    """Record (atomically) that this process serves `db_path`'s routes at `url`, and where its token is."""
    path = owner_file_for(db_path)
    temporary = path.with_name(path.name + ".tmp")
    record = {"url": url, "proxy": proxy, "token": "file" if token_in_file else "env", "pid": os.getpid()}
    temporary.write_text(json.dumps(record) + "\n")
    os.replace(temporary, path)
    return path


def remove_owner(db_path: str | os.PathLike[str]) -> None:
    """Remove the owner file if this process wrote it (a newer owner's file stays)."""
    path = owner_file_for(db_path)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def is_lock_error(exc: BaseException) -> bool:
    """True when DuckDB refuses the file because someone holds it: another process (its lock), or
    this one (an embedded sidecar: 'same database file with a different configuration')."""
    import duckdb  # lazy: see the imports

    text = str(exc).lower()
    return isinstance(exc, duckdb.Error) and ("lock" in text or "same database file" in text)


def find_owner(db_path: str | os.PathLike[str]) -> Owner:
    """The owner of a locked database, from `<db>.owner` and the token; OwnerError says what is missing."""
    path = owner_file_for(db_path)
    try:
        record = json.loads(path.read_text())
        url = str(record["url"])
    except (OSError, ValueError, KeyError, TypeError):
        raise OwnerError(
            f"another process holds {db_path} and left no readable {path.name} (a sidecar of "
            "this release writes one); stop it, or restart it with this release"
        ) from None
    token_path = token_file_for(db_path)
    if record.get("token") == "env":
        token = os.environ.get(TOKEN_ENV, "").strip()
        where = f"set {TOKEN_ENV} as it is set for the process serving it"
    else:
        token = token_path.read_text().strip() if token_path is not None and token_path.exists() else ""
        where = f"make {token_path} readable to this user"
    if not token:
        raise OwnerError(f"{db_path} is served at {url}, but its token was not found: {where}")
    return Owner(url=url.rstrip("/"), proxy=record.get("proxy"), token=token)


def fetch_snapshot(owner: Owner, destination: Path, *, transport: httpx.BaseTransport | None = None) -> Path:
    """Download the owner's consistent copy of its database to `destination`."""
    import httpx  # lazily: serving processes never fetch a snapshot

    headers = {"Authorization": f"Bearer {owner.token}"}
    try:
        with (
            httpx.Client(timeout=SNAPSHOT_TIMEOUT_S, transport=transport) as client,
            client.stream("GET", f"{owner.url}/v1/snapshot", headers=headers) as response,
        ):
            if response.status_code == 401:
                raise OwnerError(f"{owner.url} refused the token; set {TOKEN_ENV} to the owner's")
            if response.status_code != 200:
                response.read()
                raise OwnerError(
                    f"{owner.url}/v1/snapshot answered HTTP {response.status_code}: {response.text[:200]}"
                )
            with destination.open("wb") as handle:
                for chunk in response.iter_bytes():
                    handle.write(chunk)
    except httpx.HTTPError as exc:
        raise OwnerError(
            f"cannot reach the owner of the database at {owner.url} ({type(exc).__name__}); is it "
            "still running? Remove the stale .owner file if it is not"
        ) from None
    return destination


def published_from_owner(owner: Owner, *, transport: httpx.BaseTransport | None = None) -> list[Published]:
    """What the owner publishes (GET <url>/v1/query/estimate: collector.store.decision's published
    estimates, as its gauges show them), each with its reason; nothing of the database is copied.

    Raises OwnerError with one line naming the cause: the owner unreachable, the token refused,
    another answer than 200, or an answer that is not the route's {"rows": [estimate, ...]}.
    """
    import httpx  # lazily: serving processes never ask an owner

    from collector.capacity import CapacityEstimate  # lazy: as the other imports
    from collector.store.decision import Published  # lazy: decision loads DuckDB (see the imports)

    route = f"{owner.url}/v1/query/estimate"
    try:
        with httpx.Client(timeout=QUERY_TIMEOUT_S, transport=transport) as client:
            response = client.get(route, headers={"Authorization": f"Bearer {owner.token}"})
    except httpx.HTTPError as exc:
        raise OwnerError(
            f"cannot reach the owner of the database at {owner.url} ({type(exc).__name__}); is it "
            "still running? Remove the stale .owner file if it is not"
        ) from None
    if response.status_code == 401:
        raise OwnerError(f"{owner.url} refused the token; set {TOKEN_ENV} to the owner's")
    if response.status_code != 200:
        raise OwnerError(f"{route} answered HTTP {response.status_code}: {response.text[:200]}")
    try:
        rows = response.json()["rows"]
        return [
            Published(
                CapacityEstimate.from_dict({k: v for k, v in row.items() if k != "published_because"}),
                str(row.get("published_because") or ""),
            )
            for row in rows
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise OwnerError(
            f"{route} answered something other than published estimates ({type(exc).__name__}: {exc})"
        ) from None


def _open_unheld(db_path: str | os.PathLike[str]) -> RequestStore | None:
    """`db_path` opened read-only, or None while another process (its owner) holds it.

    Raises FileNotFoundError when the file does not exist and duckdb.Error when it is not a
    database headroom wrote.
    """
    import duckdb  # lazy: see the imports

    from collector.store.db import RequestStore  # lazy: DuckDB (see the imports)

    if not Path(db_path).is_file():
        raise FileNotFoundError(f"{db_path} does not exist; pass the request log a sidecar wrote")
    try:
        return RequestStore(Path(db_path), read_only=True)
    except duckdb.Error as exc:
        if not is_lock_error(exc):
            raise
        return None


def read_published(db_path: str | os.PathLike[str]) -> list[Published]:
    """The published estimates of the request log `db_path` (collector.store.decision), each with
    its reason: decided over the file opened read-only when nobody holds it, else the owner's
    answer (published_from_owner), never a copy of the database.

    Raises FileNotFoundError when the file does not exist, OwnerError when its owner cannot be
    asked, and duckdb.Error when it is not a database headroom wrote.
    """
    from collector.store.decision import published_estimates  # lazy: DuckDB (see the imports)

    store = _open_unheld(db_path)
    if store is None:
        return published_from_owner(find_owner(db_path))
    try:
        return published_estimates(store)
    finally:
        store.close()


def send_rows(owner: Owner, rows: Rows, *, transport: httpx.BaseTransport | None = None) -> int:
    """POST `rows` to the owner's ingest route as one Arrow IPC stream; returns the rows it inserted.

    Idempotent by request_id, so a batch sent again after a lost answer adds nothing. Raises
    OwnerError with one line naming the cause: the owner unreachable, the token refused, the rows
    refused.
    """
    import httpx  # lazily: serving processes never send rows to an owner

    if not rows:
        return 0
    headers = {"Authorization": f"Bearer {owner.token}", "Content-Type": ARROW_STREAM_TYPE}
    try:
        with httpx.Client(timeout=INGEST_TIMEOUT_S, transport=transport) as client:
            response = client.post(f"{owner.url}/v1/ingest", content=rows_to_ipc(rows), headers=headers)
    except httpx.HTTPError as exc:
        raise OwnerError(
            f"cannot reach the owner of the database at {owner.url} ({type(exc).__name__}); is it "
            "still running? Remove the stale .owner file if it is not"
        ) from None
    if response.status_code == 401:
        raise OwnerError(f"{owner.url} refused the token; set {TOKEN_ENV} to the owner's")
    if response.status_code != 200:
        raise OwnerError(f"{owner.url}/v1/ingest answered HTTP {response.status_code}: {response.text[:200]}")
    inserted: int = response.json()["inserted"]
    return inserted


@contextlib.contextmanager
def open_request_log(db_path: str | os.PathLike[str]) -> Iterator[RequestStore]:
    """A read-only RequestStore on `db_path`: the file itself, or the owner's snapshot while it is held.

    Raises FileNotFoundError when the file does not exist, OwnerError when its owner cannot be
    asked, and duckdb.Error when it is not a database headroom wrote.
    """
    from collector.store.db import RequestStore  # lazy: DuckDB (see the imports)

    store = _open_unheld(db_path)
    if store is not None:
        try:
            yield store
        finally:
            store.close()
        return
    directory = Path(tempfile.mkdtemp(prefix="headroom-snapshot-"))
    try:
        snapshot = fetch_snapshot(find_owner(db_path), directory / "snapshot.duckdb")
        store = RequestStore(snapshot, read_only=True)
        try:
            yield store
        finally:
            store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
