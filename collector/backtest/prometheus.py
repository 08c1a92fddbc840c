"""A real Prometheus over backfilled blocks: the PromQL engine of the backtest.

Series are written as OpenMetrics and turned into TSDB blocks by `promtool tsdb create-blocks-from
openmetrics`; a Prometheus with no scrape jobs and no rules serves them on a loopback port, and
the backtest asks it range and instant queries over the scenario's past. Blocks added later (the
recording rules' results) are read at the next start, so `backfill` restarts the server.

Backfilled blocks carry no staleness markers, so a series that stops would linger for the default
5 minutes of lookback; the server runs with `--query.lookback-delta` set to the longer of the
scrape and evaluation intervals instead, which ends a series as promptly as a marker would.

    with BackfilledPrometheus(workdir, lookback_s=30) as prometheus:
        prometheus.backfill(series)
        prometheus.query_range("up", start, end, step_s=30)  -> [({"job": ..}, [(t, 1.0), ...])]
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from collector.backtest.openmetrics import SeriesSet

__all__ = ["BackfilledPrometheus", "PrometheusError", "Matrix", "find_binary"]

Matrix = list[tuple[dict[str, str], list[tuple[float, float]]]]
_READY_TIMEOUT_S = 30.0
_QUERY_TIMEOUT_S = 120.0


class PrometheusError(RuntimeError):
    """Prometheus or promtool failed; the message says which command, and its output."""


def find_binary(name: str, given: str | None = None) -> str:
    """Path of `name` (prometheus or promtool): `given`, else from PATH; a clear error when missing."""
    path = given or shutil.which(name)
    if not path:
        raise PrometheusError(
            f"{name} not found on PATH; install it (`make tools`, or apt-get install "
            f"prometheus) or pass --{name} PATH"
        )
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class BackfilledPrometheus:
    """Owns a data directory and the Prometheus process serving it; use as a context manager."""

    def __init__(
        self, workdir: Path, *, lookback_s: float, prometheus: str | None = None, promtool: str | None = None
    ) -> None:
        self.workdir = Path(workdir)
        self.data = self.workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.lookback_s = lookback_s
        self.prometheus, self.promtool = (
            find_binary("prometheus", prometheus),
            find_binary("promtool", promtool),
        )
        self._process: subprocess.Popen[bytes] | None = None
        self._client = httpx.Client(timeout=_QUERY_TIMEOUT_S)
        self.url = ""
        self.backfills = 0

    def __enter__(self) -> BackfilledPrometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._client.close()

    # --- blocks ---------------------------------------------------------------------------
    def backfill(self, series: SeriesSet) -> None:
        """Turn `series` into blocks in the data directory and (re)start the server to read them."""
        self.stop()
        self.backfills += 1
        source = self.workdir / f"backfill-{self.backfills}.om"
        source.write_text(series.to_openmetrics(), encoding="utf-8")
        blocks = self.workdir / f"blocks-{self.backfills}"
        result = subprocess.run(
            [self.promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(blocks)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0:
            raise PrometheusError(
                f"promtool tsdb create-blocks-from openmetrics failed: "
                f"{(result.stderr or result.stdout)[-2000:]}"
            )
        for block in blocks.iterdir():
            block.rename(self.data / block.name)
        source.unlink()
        self.start()

    # --- the server -----------------------------------------------------------------------
    def start(self) -> None:
        """Start Prometheus on a free loopback port (three tries: another process may take the port)."""
        for attempt in range(3):
            try:
                return self._start_once()
            except PrometheusError:
                if attempt == 2:
                    raise

    def _start_once(self) -> None:
        """Start Prometheus on a free loopback port and wait (at most 30 s) until it is ready."""
        config = self.workdir / "prometheus.yml"
        config.write_text("global: {}\n", encoding="utf-8")
        port = _free_port()
        log = (self.workdir / "prometheus.log").open("a")
        self._process = subprocess.Popen(
            [
                self.prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.data}",
                "--storage.tsdb.retention.time=100y",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--query.lookback-delta={int(self.lookback_s * 1000)}ms",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                if self._client.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        tail = (self.workdir / "prometheus.log").read_text()[-2000:]
        self.stop()
        raise PrometheusError(f"prometheus did not become ready on {self.url}: {tail}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s); a no-op when it is not running."""
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        self._process = None

    # --- queries --------------------------------------------------------------------------
    def _get(self, path: str, params: dict[str, str]) -> Any:
        response = self._client.post(f"{self.url}{path}", data=params)
        body = (
            response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
        )
        if response.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(
                f"query failed ({response.status_code}): {body.get('error', response.text[:500])}"
                f"\n  query: {params.get('query', '')[:2000]}"
            )
        return body["data"]  # the answer's shape is Prometheus' (docs: HTTP API)

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> Matrix:
        """[(labels, [(t, value), ...])] of `expr` at start, start + step, ... end."""
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}s"},
        )
        return [
            (item["metric"], [(float(t), float(v)) for t, v in item["values"]]) for item in data["result"]
        ]

    def query(self, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
        """[(labels, value)] of the instant vector `expr` at time `at`."""
        data = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        if data["resultType"] != "vector":
            raise PrometheusError(f"expected an instant vector, got a {data['resultType']}: {expr[:200]}")
        return [(item["metric"], float(item["value"][1])) for item in data["result"]]
