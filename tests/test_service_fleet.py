"""A fleet on loopback: simulator -> sidecar with StoreShipper -> store service; rows arrive whole."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from collector.service.app import create_store_app
from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar
from collector.sim.app import create_sim_app
from collector.sim.config import SimConfig
from collector.store.db import RequestStore
from collector.store.shipper import StoreShipper

TOKEN = "fleet-token"


def _ask(url: str, index: int) -> int:
    body = {
        "model": "headroom-sim",
        "max_tokens": 8,
        "stream": index % 2 == 0,
        "messages": [{"role": "user", "content": f"question {index}"}],
    }
    response = httpx.post(
        url + "/v1/chat/completions", json=body, timeout=60, headers={"X-Tenant-ID": f"team-{index % 3}"}
    )
    return response.status_code


def test_sidecar_ships_every_row_to_the_store_service(tmp_path):
    store = RequestStore(tmp_path / "fleet.duckdb")
    store_server = serve_in_thread(create_store_app(store, TOKEN))
    sim_server = serve_in_thread(create_sim_app(SimConfig(speed=50.0, seed=1)))
    shipper = StoreShipper(store_server.url, TOKEN, tmp_path / "spool")
    config = SidecarConfig(
        upstream=sim_server.url,
        db_path=None,
        instance="edge-1",
        store_url=store_server.url,
        store_token=TOKEN,
        log_flush_interval_s=0.1,
    )
    sidecar = serve_in_thread(build_sidecar(config, log_sink=shipper))
    try:
        with ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(lambda i: _ask(sidecar.url, i), range(24)))
        sidecar.stop()  # lifespan shutdown flushes the log writer into the shipper
        shipper.close()
        rows = store.query(
            "SELECT count(*), count(DISTINCT request_id), count(ttft_s) FILTER (WHERE stream), "
            "min(inflight_at_admit), "
            "count(DISTINCT tenant), min(instance) FROM requests"
        )[0]
        percentiles = httpx.get(
            store_server.url + "/v1/query/percentiles",
            params={"group_by": "tenant", "metric": "e2e_s"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        ).json()["rows"]
    finally:
        sidecar.stop()
        sim_server.stop()
        store_server.stop()
        store.close()
    assert statuses == [200] * 24
    assert rows == (24, 24, 12, 1, 3, "edge-1")  # 12 streamed requests, each with a TTFT
    assert sum(row["n"] for row in percentiles) == 24 and shipper.spooled_rows == 0
