"""StoreShipper: a BatchSink that POSTs request-log batches to `headroom store` without losing them.

Each batch is sent with retries and exponential backoff. When the store stays unreachable the
batch goes to a bounded on-disk spool; while anything is spooled, new batches join the spool (no
waiting in the writer thread) and a background thread replays it, oldest first, with backoff,
once the store answers again. Ingest is idempotent by request_id, so a batch resent after a lost
reply creates no duplicates. A full spool raises RowsDropped("spool_full", n).

It lives with the store, not the sidecar, because both the sidecar (`headroom run --store-url`,
behind its LogWriter) and the probe (`headroom probe --store-url`) ship rows through it, and the
sidecar depends on the analysis package the probe is part of.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import httpx
import orjson

from collector.store.spool import Spool
from collector.store.writer import RowsDropped

__all__ = ["StoreShipper", "DEFAULT_SPOOL_DIR"]

DEFAULT_SPOOL_DIR = "headroom-spool"  # beside the working directory, like the default headroom.duckdb

log = logging.getLogger(__name__)
_RETRYABLE = {408, 425, 429, 500, 502, 503, 504}
_NOT_YET = {401, 403}  # a token problem: keep the rows until the operator fixes it


class _Rejected(Exception):
    """The store refused the payload itself (400/413/422): resending cannot help."""


class StoreShipper:
    """POST batches to `<url>/v1/ingest` with a bearer token; spool to `spool_dir` when it fails."""

    def __init__(self, url: str, token: str | None, spool_dir=None, *, max_spool_bytes: int = 256 * 2**20,
                 max_attempts: int = 3, backoff_initial_s: float = 0.2, backoff_max_s: float = 10.0,
                 timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"store url {url!r} must start with http:// or https://, e.g. http://127.0.0.1:9200")
        if not token:
            log.warning("no store token given (--store-token or HEADROOM_TOKEN); the store will answer 401 "
                        "and rows will wait in the spool")
        self.ingest_url = url.rstrip("/") + "/v1/ingest"
        self.spool = Spool(spool_dir if spool_dir is not None else DEFAULT_SPOOL_DIR, max_spool_bytes)
        self.max_attempts, self.backoff_initial_s, self.backoff_max_s = max_attempts, backoff_initial_s, backoff_max_s
        self._client = httpx.Client(timeout=timeout_s, transport=transport,
                                    headers={"Authorization": f"Bearer {token or ''}",
                                             "Content-Type": "application/json"})
        self.sent_rows = self.spooled_rows = self.replayed_rows = 0
        self._replay_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._replay_loop, name="store-shipper-replay", daemon=True)
        self._thread.start()

    # --- BatchSink -----------------------------------------------------------------------------
    def write_batch(self, rows: Sequence[dict]) -> None:
        """Send `rows` now, or spool them; raises RowsDropped when they can be neither."""
        if not rows:
            return
        payload = orjson.dumps({"rows": list(rows)})
        if not self.spool.files():
            try:
                if self._send_with_retry(payload):
                    self.sent_rows += len(rows)
                    return
            except _Rejected as exc:
                raise RowsDropped("store_rejected", len(rows)) from exc
        self._spool(payload, len(rows))

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the replay thread after one last replay attempt; rows left stay on disk."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        self.replay()
        self._client.close()

    # --- sending ---------------------------------------------------------------------------------
    def _post(self, payload: bytes) -> bool:
        """One attempt: True accepted, False retry later; raises _Rejected when resending is useless."""
        try:
            response = self._client.post(self.ingest_url, content=payload)
        except httpx.HTTPError as exc:
            log.debug("store unreachable at %s: %s", self.ingest_url, exc)
            return False
        if response.status_code == 200:
            return True
        if response.status_code in _NOT_YET:
            log.error("store at %s refused the token (HTTP %s); spooling until it is fixed",
                      self.ingest_url, response.status_code)
            return False
        if response.status_code in _RETRYABLE:
            return False
        raise _Rejected(f"HTTP {response.status_code}: {response.text[:200]}")

    def _send_with_retry(self, payload: bytes) -> bool:
        delay = self.backoff_initial_s
        for attempt in range(self.max_attempts):
            if self._post(payload):
                return True
            if attempt + 1 < self.max_attempts and self._stop.wait(delay):
                break
            delay = min(delay * 2, self.backoff_max_s)
        return False

    def _spool(self, payload: bytes, rows: int) -> None:
        if not self.spool.put(payload, rows):
            raise RowsDropped("spool_full", rows)
        self.spooled_rows += rows
        self._wake.set()

    # --- replay ------------------------------------------------------------------------------------
    def replay(self) -> int:
        """Send spooled payloads oldest first until one fails; returns rows delivered."""
        delivered = 0
        with self._replay_lock:
            for path in self.spool.files():
                try:
                    if not self._post(path.read_bytes()):
                        break
                except _Rejected as exc:
                    log.error("store rejected spooled batch %s (%s); discarding it", path.name, exc)
                    self.spool.remove(path)
                    continue
                delivered += self.spool.rows_in(path)
                self.spool.remove(path)
        self.replayed_rows += delivered
        return delivered

    def _replay_loop(self) -> None:
        delay = self.backoff_initial_s
        while not self._stop.is_set():
            if not self.spool.files():
                self._wake.wait(5.0)
                self._wake.clear()
                delay = self.backoff_initial_s
                continue
            if self._stop.wait(delay):
                break
            self.replay()
            delay = self.backoff_initial_s if not self.spool.files() else min(delay * 2, self.backoff_max_s)
