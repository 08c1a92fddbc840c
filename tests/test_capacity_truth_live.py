"""The capacity denominator is true in a real Prometheus (#33's acceptance, on the simulator).

The single-box flow with the probe where docs/operations.md says to run it in production (straight
at a replica that serves no clients; here the simulator itself): the serving sidecar imports the
probe's estimate (`--probe-db`) and publishes what the one decision publishes. Then clients send
ordinary traffic (one request in ten with a ~600-token prompt) at the recommended pool, and a real
Prometheus evaluates the generated rules: no capacity alert, in either caliber, not even pending.
At twice the knee, the request caliber's alert fires.

Before #33 the short-prompt probe's token knee (knee × ~30 tokens) was published, and the same
traffic read 2.5-4 × "the token knee": HeadroomConcurrencyNearKnee{caliber="tokens"} fired at
half load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import free_port, require_tool
from support.processes import stop_process
from test_integration_prometheus import _query, _start, _wait, prometheus_config

from collector.alerts.files import rule_files
from collector.rules.config import DEFAULT
from collector.rules.render import write_files

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

HEADROOM = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "headroom"
MODEL = "headroom-sim"
CAPACITY_ALERTS = (
    "HeadroomConcurrencyNearKnee|HeadroomConcurrencyRising|HeadroomCapacityForecast|"
    "HeadroomNearCapacityLimit|HeadroomTokenCaliberDivergence|HeadroomFleetHeadroomLow|"
    "HeadroomKVCacheNearFull|HeadroomKVCacheExhausted|HeadroomQueueNotDraining"
)
LONG_PROMPT = "Capacity planning needs evidence, not request counts, for every replica class. " * 30


def _payload(worker: int, index: int) -> dict:
    """Ordinary client traffic: one request in ten carries a ~600-token prompt, 80 % stream."""
    content = LONG_PROMPT if (worker * 7 + index) % 10 == 0 else f"Say hello to user {worker}."
    return {
        "model": MODEL,
        "max_tokens": 24,
        "stream": (worker + index) % 5 != 0,
        "messages": [{"role": "user", "content": content}],
    }


def _load(url: str, concurrency: int, seconds: float) -> list[int]:
    from collector.sim.load import run_level

    level = asyncio.run(run_level(url, concurrency, seconds, _payload))
    return [r.status for r in level.results]


@pytest.fixture
def stack(tmp_path):
    """The simulator, two sidecars importing the probe's file, a Prometheus with the rules."""
    prometheus_bin = require_tool("prometheus")
    from collector.serving import serve_in_thread
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import build_sidecar
    from collector.sim.app import create_sim_app
    from collector.sim.config import SimConfig

    handles, processes = [], []
    try:
        sim = serve_in_thread(
            create_sim_app(
                SimConfig(model=MODEL, max_num_seqs=8, speed=4.0, stream_interval=4, kv_cache_tokens=8192)
            )
        )
        handles.append(sim)
        sidecars = {}
        for name in ("serving", "overloaded"):  # two replicas of one class, each with its own log
            port = free_port()
            config = SidecarConfig(
                upstream=sim.url,
                listen_port=port,
                db_path=str(tmp_path / f"{name}.duckdb"),
                instance=name,
                engine="vllm",
                engine_metrics_url=f"{sim.url}/metrics",
                engine_poll_interval_s=0.5,
                probe_dbs=(str(tmp_path / "probe.duckdb"),),
            )
            sidecars[name] = serve_in_thread(build_sidecar(config), port=port, timeout_graceful_shutdown=2)
            handles.append(sidecars[name])
        fast = dataclasses.replace(DEFAULT, for_durations={name: "3s" for name in DEFAULT.for_durations})
        write_files(rule_files(fast), tmp_path / "alerts")
        prom_port = free_port()
        targets = [f"127.0.0.1:{handle.port}" for handle in sidecars.values()]
        prom_config = prometheus_config(
            targets[0], f"127.0.0.1:{prom_port}", f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        )
        (job,) = [j for j in prom_config["scrape_configs"] if j["job_name"] == DEFAULT.sidecar_job]
        job["static_configs"] = [{"targets": targets}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
        processes.append(
            _start(
                [
                    prometheus_bin,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                f"http://127.0.0.1:{prom_port}/-/ready",
                tmp_path / "prometheus.log",
            )
        )
        yield {
            "sim": sim.url,
            "serving": sidecars["serving"].url,
            "overloaded": sidecars["overloaded"].url,
            "overloaded_target": f"127.0.0.1:{sidecars['overloaded'].port}",  # Prometheus's instance
            "prometheus": f"http://127.0.0.1:{prom_port}",
            "tmp": tmp_path,
        }
    finally:
        for process in processes:
            stop_process(process)
        for handle in reversed(handles):
            handle.stop()


def _alerts_since(prometheus: str, seconds: float) -> dict[tuple[str, str, str], str]:
    """Capacity alerts pending or firing in the last `seconds`: {(alertname, caliber, instance): state}."""
    window = f"{max(int(seconds), 1)}s"
    found = _query(prometheus, f'max_over_time(ALERTS{{alertname=~"{CAPACITY_ALERTS}"}}[{window}])')
    return {
        (m["alertname"], m.get("caliber", ""), m.get("instance", "")): m["alertstate"]
        for m in (r["metric"] for r in found)
    }


def _probe(stack: dict) -> dict:
    """`headroom probe` straight at the engine (a replica serving no clients), saved where the
    sidecars import from, its token mix compared with the serving sidecar's log (through it)."""
    out = stack["tmp"] / "probe.json"
    probe = subprocess.run(
        [
            str(HEADROOM),
            "probe",
            "--url",
            stack["sim"],
            "--levels",
            "1,2,4,8,16",
            "--max-samples",
            "24",
            "--max-level-seconds",
            "10",
            "--slo-ttft-p95",
            "2",
            "--db",
            str(stack["tmp"] / "probe.duckdb"),
            "--traffic-db",
            str(stack["tmp"] / "serving.duckdb"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr
    return json.loads(out.read_text())


def test_the_recommended_pool_raises_no_capacity_alert_and_twice_the_knee_does(stack):
    prometheus, serving = stack["prometheus"], stack["serving"]
    _wait(lambda: len(_query(prometheus, f'up{{job="{DEFAULT.sidecar_job}"}} == 1')) == 2, 30, "both scrapes")
    # ordinary traffic first, so the probe can compare its token mix with the traffic's
    assert set(_load(serving, 3, 20)) == {200}
    estimate = _probe(stack)
    knee, pool = estimate["knee_requests"], estimate["recommended_pool"]
    assert knee == 8 and 1 <= pool < knee, estimate
    # the short-prompt probe's token knee is not this traffic's: withheld, or within 2x and <= KV
    if estimate["knee_tokens"] is not None:
        assert estimate["knee_tokens"] <= 8192
    else:
        assert estimate["token_knee_withheld"]
    published = _wait(
        lambda: (
            (found := _query(prometheus, f'headroom_capacity_knee_requests{{model="{MODEL}"}}'))
            and len(found) == 2
            and found
        ),
        60,
        "both sidecars to publish the probe's knee",
    )
    assert {(float(p["value"][1]), p["metric"]["source"]) for p in published} == {(knee, "probe")}

    started = time.monotonic()
    statuses = _load(serving, pool, 60)
    assert statuses and set(statuses) == {200}
    quiet = _alerts_since(prometheus, time.monotonic() - started + 5)
    assert quiet == {}, f"capacity alerts at the recommended pool of {pool}: {quiet}"

    # the other replica at twice the knee: its own 5-minute mean is all overload
    def near_knee_in_requests() -> bool:
        states = _alerts_since(prometheus, 5)
        return states.get(("HeadroomConcurrencyNearKnee", "requests", stack["overloaded_target"])) == "firing"

    with ThreadPoolExecutor(1) as clients:
        running = clients.submit(_load, stack["overloaded"], 2 * knee, 45)
        _wait(near_knee_in_requests, 45, "HeadroomConcurrencyNearKnee{caliber=requests} at 2x the knee")
        running.result()
    assert httpx.get(f"{serving}/healthz").status_code == 200
