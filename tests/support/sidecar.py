"""A real sidecar (build_sidecar, served by uvicorn) in front of the fake upstream, on loopback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from collector.serving import ServerHandle, serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar, sidecar_state
from support.upstream import FakeUpstream
from support.waiting import patient, wait_until

__all__ = ["Rig", "sidecar_rig", "gauge_values", "live_gauges", "wait_until", "CHAT"]


@dataclass
class Rig:
    fake: FakeUpstream
    sidecar: ServerHandle
    app: Any
    token: str | None = None  # the sidecar's token (its <db>.token): what makes a request the probe's

    def probe_marks(self, run_id: str, **more: str | bytes) -> dict[str, str | bytes]:
        """The headers `headroom probe` sends through this sidecar: its marks and the token."""
        assert self.token is not None, "this rig's sidecar has no token"
        marks: dict[str, str | bytes] = {"X-Headroom-Source": "probe", "X-Headroom-Run-Id": run_id}
        return {**marks, "X-Headroom-Probe-Token": self.token, **more}

    @property
    def upstream(self) -> FakeUpstream:
        return self.fake

    @property
    def url(self) -> str:
        return self.sidecar.url

    def rows(
        self, sql: str = "SELECT * FROM requests ORDER BY admitted_at", params: tuple[Any, ...] = ()
    ) -> list[dict[str, Any]]:
        """Flush the writer, then read rows through the sidecar's own store."""
        assert sidecar_state(self.app).writer.flush(patient(30)), "log writer did not flush in time"
        return sidecar_state(self.app).batch_sink.query_dicts(sql, params)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """{(sample name, sorted label items): value} from a live /metrics scrape."""
        text = httpx.get(self.url + "/metrics", timeout=patient(5)).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


@contextlib.contextmanager
def sidecar_rig(tmp_path: Path, **config: Any) -> Iterator[Rig]:
    """Start the fake upstream and a sidecar in front of it; stop both (flushing the log) at exit."""
    fake = FakeUpstream()
    settings: dict[str, Any] = {
        "db_path": str(tmp_path / "log.duckdb"),
        "instance": "test",
        "jobs": False,
        "engine": "none",  # no engine polling: the fake upstream has no /metrics
    }
    cfg = SidecarConfig(upstream=fake.url, **(settings | config))
    app = build_sidecar(cfg)
    token_file = Path(f"{cfg.db_path}.token")
    token = token_file.read_text().strip() if token_file.exists() else None
    sidecar = serve_in_thread(app, timeout_graceful_shutdown=5)
    try:
        yield Rig(fake, sidecar, app, token)
    finally:
        sidecar.stop()
        fake.stop()


def gauge_values(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> list[float]:
    return [value for (sample, _), value in metrics.items() if sample == name]


def live_gauges(rig: Rig) -> list[float]:
    """Every in-flight and active-token sample the sidecar exports now."""
    metrics = rig.metrics()
    return gauge_values(metrics, "headroom_inflight_requests") + gauge_values(
        metrics, "headroom_active_tokens"
    )


CHAT = {
    "model": "m1",
    "stream": True,
    "messages": [{"role": "user", "content": "tell me a long story please"}],
}
