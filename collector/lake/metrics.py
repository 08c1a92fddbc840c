"""The lake committer's own /metrics (`headroom lake commit --metrics-listen HOST:PORT`).

After each pass: the time it finished (when it raised nothing), the files, rows and quarantined
files it counted, and the backlog: staged files the table does not hold, and per writer the age
of the oldest of them. A pass that failed still counts what it did before failing, and lists the
lake against the marks the committer last read, so a committer that cannot reach its catalog
shows files waiting while its last success grows old (HeadroomLakeCommitStalled).
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from collector.catalog import spec
from collector.exposition import new_registry
from collector.serving import parse_listen

__all__ = ["CommitterMetrics"]

log = logging.getLogger(__name__)


class CommitterMetrics:
    """The committer's metrics in their own registry; `serve` exports them over HTTP."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else new_registry()
        r = self.registry
        self.files = Counter(*_named("headroom_lake_commit_files_total"), registry=r)
        self.rows = Counter(*_named("headroom_lake_commit_rows_total"), registry=r)
        self.quarantined = Counter(*_named("headroom_lake_quarantined_files_total"), registry=r)
        self.held = Gauge(*_named("headroom_lake_quarantine_files"), registry=r)
        self.waiting = Gauge(*_named("headroom_lake_staged_files_waiting"), registry=r)
        self.lag = Gauge(*_named("headroom_lake_commit_lag_seconds"), labelnames=("writer",), registry=r)
        self.last_success: Gauge | None = None  # absent until the first success
        self._seen = (0, 0, 0)

    def counted(self, files: int, rows: int, quarantined: int) -> None:
        """Count a pass's running totals (CommitResult's): what they grew by since the last call
        in this pass (`pass_begins` starts a pass at 0)."""
        before = self._seen
        self.files.inc(max(0, files - before[0]))
        self.rows.inc(max(0, rows - before[1]))
        self.quarantined.inc(max(0, quarantined - before[2]))
        self._seen = (files, rows, quarantined)

    def pass_begins(self) -> None:
        self._seen = (0, 0, 0)

    def succeeded(self, now: float | None = None) -> None:
        if self.last_success is None:
            self.last_success = Gauge(
                *_named("headroom_lake_commit_last_success_timestamp_seconds"), registry=self.registry
            )
        self.last_success.set(time.time() if now is None else now)

    def backlog(
        self, waiting: dict[str, tuple[int, float]], quarantine: int, now: float | None = None
    ) -> None:
        """Set the backlog gauges: {writer: (files, oldest mtime)} and the files in quarantine/."""
        at = time.time() if now is None else now
        self.waiting.set(sum(count for count, _ in waiting.values()))
        self.lag.clear()
        for writer, (_, oldest) in waiting.items():
            self.lag.labels(writer=writer).set(max(0.0, at - oldest))
        self.held.set(quarantine)

    def serve(self, listen: str) -> None:
        """Serve /metrics on HOST:PORT (ValueError for a malformed address)."""
        host, port = parse_listen(listen, "--metrics-listen")
        start_http_server(port, addr=host, registry=self.registry)
        log.info("lake committer metrics on http://%s:%d/metrics", host, port)


def _named(name: str) -> tuple[str, str]:
    """(name as prometheus_client takes it, help): a counter's `_total` is its own to add."""
    entry = spec(name)
    bare = entry.name[: -len("_total")] if entry.type == "counter" else entry.name
    return bare, entry.help
