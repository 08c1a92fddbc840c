"""Fixtures for sidecar tests: a fake upstream and a real sidecar, both on loopback."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from collector.serving import ServerHandle, serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar
from fake_upstream import FakeUpstream


@dataclass
class Rig:
    fake: FakeUpstream
    upstream: ServerHandle
    sidecar: ServerHandle
    app: object

    @property
    def url(self) -> str:
        return self.sidecar.url

    def rows(self, sql: str = "SELECT * FROM requests ORDER BY admitted_at", params=()) -> list[dict]:
        """Flush the writer, then read rows through the sidecar's own store."""
        assert self.app.state.writer.flush(), "log writer did not flush in time"
        return self.app.state.batch_sink.query_dicts(sql, params)

    def metrics(self) -> dict[tuple, float]:
        """{(sample name, sorted label items): value} from a live /metrics scrape."""
        text = httpx.get(self.url + "/metrics").text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


@contextlib.contextmanager
def sidecar_rig(tmp_path, **config):
    """Start FakeUpstream and a sidecar in front of it; stop both (flushing the log) at exit."""
    fake = FakeUpstream()
    upstream = serve_in_thread(fake, timeout_graceful_shutdown=1)
    cfg = SidecarConfig(upstream=upstream.url, db_path=str(tmp_path / "log.duckdb"),
                        instance="test", jobs=False, **config)
    app = build_sidecar(cfg)
    sidecar = serve_in_thread(app, timeout_graceful_shutdown=5)
    try:
        yield Rig(fake, upstream, sidecar, app)
    finally:
        sidecar.stop()
        upstream.stop()


def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.01):
    """Poll `predicate` until it returns truthy or the deadline passes (then AssertionError)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


def gauge_values(metrics: dict, name: str) -> list[float]:
    return [value for (sample, _), value in metrics.items() if sample == name]


CHAT = {"model": "m1", "stream": True,
        "messages": [{"role": "user", "content": "tell me a long story please"}]}
