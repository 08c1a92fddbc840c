"""The admin listener (--admin-listen): /metrics, /healthz, /readyz and /headroom on their own
address and not on the client-facing port; without it, all on the one port as before. Real
sidecars on loopback in front of the suite's fake engine."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket

import httpx
import pytest
from click.testing import CliRunner
from conftest import free_port
from fastapi import APIRouter
from support.sidecar import CHAT
from support.upstream import FakeUpstream
from support.waiting import patient

from collector.serving import serve_in_thread
from collector.sidecar.admin import AdminListener
from collector.sidecar.cli import run
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar, sidecar_state
from collector.store.owner import find_owner, open_request_log, owner_file_for

ADMIN_PATHS = ("/metrics", "/healthz", "/readyz")


@pytest.fixture
def upstream():
    engine = FakeUpstream()
    try:
        yield engine
    finally:
        engine.stop()


def test_without_admin_listen_the_admin_routes_share_the_proxy_port(upstream):
    app = build_sidecar(
        SidecarConfig(upstream=upstream.url, engine="none", db_path=None, instance="one", jobs=False)
    )
    sidecar = serve_in_thread(app, timeout_graceful_shutdown=2)
    try:
        assert sidecar_state(app).admin is None
        for path in ADMIN_PATHS:
            assert httpx.get(sidecar.url + path, timeout=patient(10)).status_code == 200, path
        assert "headroom_inflight_requests" in httpx.get(sidecar.url + "/metrics").text
    finally:
        sidecar.stop()


def test_with_admin_listen_metrics_health_and_the_request_log_leave_the_proxy_port(
    upstream, tmp_path, monkeypatch
):
    monkeypatch.delenv("HEADROOM_TOKEN", raising=False)
    db = tmp_path / "log.duckdb"
    port, admin_port = free_port(), free_port()
    config = SidecarConfig(
        upstream=upstream.url,
        engine="none",
        db_path=str(db),
        instance="two",
        jobs=False,
        listen_port=port,
        admin_listen=("127.0.0.1", admin_port),
    )
    app = build_sidecar(config)
    sidecar = serve_in_thread(app, port=port, timeout_graceful_shutdown=5)
    admin = f"http://127.0.0.1:{admin_port}"
    try:
        httpx.post(sidecar.url + "/v1/chat/completions", json=CHAT, timeout=patient(10)).raise_for_status()
        assert httpx.get(sidecar.url + "/v1/models", timeout=patient(10)).status_code == 200, (
            "pass-through stays"
        )
        for path in (*ADMIN_PATHS, "/headroom/v1/snapshot"):
            assert httpx.get(sidecar.url + path, timeout=patient(10)).status_code == 404, (
                f"{path} on the proxy port"
            )
        for path in ADMIN_PATHS:
            assert httpx.get(admin + path, timeout=patient(10)).status_code == 200, (
                f"{path} on the admin listener"
            )
        metrics = httpx.get(admin + "/metrics").text
        assert (
            'headroom_requests_total{model="m1",outcome="ok",source="traffic",tenant="anonymous"} 1.0'
            in metrics
        )
        assert httpx.post(admin + "/v1/chat/completions", json=CHAT).status_code == 404, "no proxy there"

        record = json.loads(owner_file_for(db).read_text())
        assert record["url"] == admin + "/headroom" and record["proxy"] == sidecar.url
        assert sidecar_state(app).writer.flush(patient(30))
        assert find_owner(db).url == admin + "/headroom"
        with open_request_log(db) as store:  # the owner's snapshot, fetched from the admin listener
            assert store.count() == 1
    finally:
        sidecar.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(admin + "/healthz", timeout=5)  # stopped with the sidecar


def test_an_admin_address_in_use_is_refused_at_start_naming_the_flag(upstream):
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        listener = AdminListener(
            APIRouter(), "127.0.0.1", port, SidecarConfig(upstream=upstream.url, engine="none")
        )

        async def start() -> None:
            listener.start()

        with pytest.raises(OSError, match=f"--admin-listen 127.0.0.1:{port}"):
            asyncio.run(start())


def test_a_malformed_admin_listen_is_a_usage_error_naming_the_flag():
    result = CliRunner().invoke(run, ["--upstream", "http://127.0.0.1:1", "--admin-listen", "9101"])
    assert result.exit_code == 2
    assert "--admin-listen '9101' is not HOST:PORT" in result.output


def test_readiness_keeps_a_connection_of_its_own_when_the_pool_is_full(upstream):
    """--max-upstream-connections 1, held by a request whose answer the engine withholds: /readyz
    still reaches the engine, and a second client request waits for the one connection."""
    app = build_sidecar(
        SidecarConfig(upstream=upstream.url, engine="none", db_path=None, instance="r", max_connections=1)
    )
    sidecar = serve_in_thread(app, timeout_graceful_shutdown=2)
    held = {"x-fake": "gate-headers", "x-test-id": "full-pool"}
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(
                httpx.post, sidecar.url + "/v1/chat/completions", json=CHAT, headers=held, timeout=patient(10)
            )
            assert upstream.expect("full-pool").wait(patient(10)), "the held request never reached the engine"
            ready = httpx.get(sidecar.url + "/readyz", timeout=patient(5))
            assert ready.status_code == 200 and ready.json()["status"] == "ready"
            upstream.gate("full-pool").set()
            assert answer.result(patient(10)).status_code == 200
    finally:
        sidecar.stop()
