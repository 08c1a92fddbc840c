"""Two replica classes of one model, live (#33 item 4): the simulator with 8 and with 16 slots behind
two real sidecars (one derives its class from the engine's slots, one is told it), both classes'
estimates in each sidecar's store, and a real Prometheus evaluating the generated rules: each
sidecar's knee ratio is its own concurrency over its own class's knee."""

from __future__ import annotations

import json
import socket
import subprocess
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import require_tool
from support.processes import free_port, headroom_process, sim_process
from support.rulers import query, rule_errors
from support.waiting import patient, wait_until
from test_analysis_estimate import _estimate

from collector.alerts.files import alert_files
from collector.rules.records import R
from collector.store.db import RequestStore
from collector.store.estimates import save_estimate

pytestmark = [pytest.mark.subprocess, pytest.mark.integration]

HELD = 4  # requests each sidecar holds in flight for the whole test


def _store_estimates(path: Path, model: str) -> None:
    store = RequestStore(path)
    for cls, knee in (("slots8", 8), ("sim-16", 16)):
        # each class measured by a probe run of its own (one estimate per run)
        save_estimate(
            store, replace(_estimate(model=model, knee_at=knee), run_id=f"probe-{cls}", replica_class=cls)
        )
    store.close()


def _hold(url: str, model: str) -> list[socket.socket]:
    """HELD streamed chat requests that run for minutes at --speed 0.05 (the client never reads them)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(
        {
            "model": model,
            "stream": True,
            "max_tokens": 2000,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "hold"}],
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    sockets = []
    for _ in range(HELD):
        sock = socket.create_connection((host, int(port)), timeout=patient(5))
        sock.sendall(head + body)
        sockets.append(sock)
    return sockets


def _inflight(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=patient(5)).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("headroom_inflight_requests{")
    )


def test_each_sidecar_is_judged_against_its_own_replica_class_knee(tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    held: list[socket.socket] = []
    with (
        sim_process(max_num_seqs=8, flavor="llamacpp", speed=0.05) as small,
        sim_process(max_num_seqs=16, flavor="llamacpp", speed=0.05) as big,
    ):
        model = httpx.get(small + "/v1/models", timeout=patient(5)).json()["data"][0]["id"]
        for name in ("a", "b"):
            _store_estimates(tmp_path / f"{name}.duckdb", model)
        common = ["--engine", "auto", "--engine-poll-interval", "0.2"]
        with (
            headroom_process(
                "run",
                "--upstream",
                small,
                "--db",
                str(tmp_path / "a.duckdb"),
                *common,
                health="/healthz",
                log=tmp_path / "a.log",
            ) as a,
            headroom_process(
                "run",
                "--upstream",
                big,
                "--db",
                str(tmp_path / "b.duckdb"),
                *common,
                "--replica-class",
                "sim-16",
                health="/healthz",
                log=tmp_path / "b.log",
            ) as b,
        ):
            try:
                for url in (a, b):
                    wait_until(
                        lambda url=url: "headroom_replica_info{" in httpx.get(url + "/metrics").text,
                        15,
                        what="the sidecar's replica class",
                        interval_s=0.1,
                    )
                    wait_until(
                        lambda url=url: (
                            "headroom_capacity_knee_requests{" in httpx.get(url + "/metrics").text
                        ),
                        30,
                        what="the published knees",
                        interval_s=0.2,
                    )
                    held += _hold(url, model)
                    wait_until(
                        lambda url=url: _inflight(url) == HELD, 15, what="requests held", interval_s=0.05
                    )
                rules = tmp_path / "rules"
                rules.mkdir()
                for name, text in alert_files().items():
                    if name.endswith(".rules.yaml"):
                        (rules / name).write_text(text)
                port = free_port()
                config = {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(rules / "*.rules.yaml")],
                    "scrape_configs": [
                        {
                            "job_name": "headroom-sidecar",
                            "static_configs": [{"targets": [u.removeprefix("http://") for u in (a, b)]}],
                        }
                    ],
                }
                (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
                server = subprocess.Popen(
                    [
                        prometheus,
                        f"--config.file={tmp_path / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                    ],
                    stdout=(tmp_path / "prometheus.log").open("wb"),
                    stderr=subprocess.STDOUT,
                )
                url = f"http://127.0.0.1:{port}"
                try:
                    expected = {
                        (a.removeprefix("http://"), "slots8"): HELD / 8,
                        (b.removeprefix("http://"), "sim-16"): HELD / 16,
                    }

                    def ratios() -> dict[tuple[str, str], float]:
                        try:
                            found = query(url, f'{R.KNEE_RATIO}{{caliber="requests",task_class="all"}}')
                        except (httpx.TransportError, ValueError):
                            return {}
                        return {
                            (r["metric"]["instance"], r["metric"]["replica_class"]): float(r["value"][1])
                            for r in found
                        }

                    wait_until(
                        lambda: set(ratios()) == set(expected), 60, what="both knee ratios", interval_s=0.5
                    )
                    assert ratios() == pytest.approx(expected), ratios()
                    assert rule_errors(url) == {}
                finally:
                    server.terminate()
                    server.wait(patient(30))
            finally:
                for sock in held:
                    sock.close()
