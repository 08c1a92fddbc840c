"""The capacity denominator is true in a real Prometheus (#33's acceptance), on the simulator and
on a real llama.cpp llama-server (4 slots, 4,096 KV tokens: 1,024 per slot).

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
import contextlib
import dataclasses
import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from conftest import free_port, require_tool
from support.processes import stop_process
from test_integration_prometheus import _query, _wait, prometheus_config, start_prometheus

from collector.alerts.files import rule_files
from collector.rules.config import DEFAULT
from collector.rules.render import write_files

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

HEADROOM = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "headroom"
MODEL = "headroom-sim"
# engine -> (probe levels, the knee, its KV cache in tokens)
ENGINES = {"sim": ("1,2,4,8,16", 8, 8192), "llama.cpp": ("1,2,4,8", 4, 4096)}
CAPACITY_ALERTS = (
    "HeadroomConcurrencyNearKnee|HeadroomConcurrencyRising|HeadroomCapacityForecast|"
    "HeadroomNearCapacityLimit|HeadroomTokenCaliberDivergence|HeadroomFleetHeadroomLow|"
    "HeadroomKVCacheNearFull|HeadroomKVCacheExhausted|HeadroomQueueNotDraining"
)
LONG_PROMPT = "Capacity planning needs evidence, not request counts, for every replica class. " * 30


def _load(url: str, concurrency: int, seconds: float, model: str) -> list[int]:
    """Ordinary client traffic for `model` (the name the engine serves, as the probe's estimate
    names it): one request in ten carries a ~600-token prompt, 80 % stream."""
    from collector.sim.load import run_level

    def payload(worker: int, index: int) -> dict:
        content = LONG_PROMPT if (worker * 7 + index) % 10 == 0 else f"Say hello to user {worker}."
        return {
            "model": model,
            "max_tokens": 24,
            "stream": (worker + index) % 5 != 0,
            "messages": [{"role": "user", "content": content}],
        }

    level = asyncio.run(run_level(url, concurrency, seconds, payload))
    return [r.status for r in level.results]


@contextlib.contextmanager
def _engine(name: str) -> Iterator[tuple[str, str]]:
    """(its URL, the engine flavour the sidecars read) of the simulator or a real llama-server."""
    from collector.serving import serve_in_thread
    from collector.sim.app import create_sim_app
    from collector.sim.config import SimConfig

    if name == "llama.cpp":
        from support.real_engine import llama_server

        with llama_server(4) as url:
            yield url, "llamacpp"
        return
    sim = serve_in_thread(
        create_sim_app(
            SimConfig(model=MODEL, max_num_seqs=8, speed=4.0, stream_interval=4, kv_cache_tokens=8192)
        )
    )
    try:
        yield sim.url, "vllm"
    finally:
        sim.stop()


@pytest.fixture(
    params=["sim", pytest.param("llama.cpp", marks=[pytest.mark.real_engine, pytest.mark.timeout(900)])]
)
def stack(request, tmp_path):
    """An engine, two sidecars importing the probe's file, a Prometheus with the rules."""
    prometheus_bin = require_tool("prometheus")
    from collector.serving import serve_in_thread
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import build_sidecar

    handles, processes = [], []
    with _engine(request.param) as (url, flavour):
        try:
            sidecars = {}
            for name in ("serving", "overloaded"):  # two replicas of one class, each with its own log
                port = free_port()
                config = SidecarConfig(
                    upstream=url,
                    listen_port=port,
                    db_path=str(tmp_path / f"{name}.duckdb"),
                    instance=name,
                    engine=flavour,
                    engine_metrics_url=f"{url}/metrics",
                    engine_poll_interval_s=0.5,
                    probe_dbs=(str(tmp_path / "probe.duckdb"),),
                )
                sidecars[name] = serve_in_thread(
                    build_sidecar(config), port=port, timeout_graceful_shutdown=2
                )
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
            processes.append(start_prometheus(prometheus_bin, prom_config, prom_port, tmp_path))
            # the served model: the name the probe's estimate carries (llama-server: its GGUF path)
            served = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
            yield {
                "engine": request.param,
                "model": served,
                "engine_url": url,
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
            stack["engine_url"],
            "--levels",
            ENGINES[stack["engine"]][0],
            "--max-tokens",
            "24",
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
    model = stack["model"]
    assert set(_load(serving, 3, 20, model)) == {200}
    estimate = _probe(stack)
    knee, pool = estimate["knee_requests"], estimate["recommended_pool"]
    _, expected_knee, kv = ENGINES[stack["engine"]]
    assert knee == expected_knee and 1 <= pool < knee, estimate
    # the short-prompt probe's token knee is not this traffic's: withheld, or within 2x and <= KV
    if estimate["knee_tokens"] is not None:
        assert estimate["knee_tokens"] <= kv
    else:
        assert estimate["token_knee_withheld"]
    published = _wait(
        lambda: (
            (found := _query(prometheus, "headroom_capacity_knee_requests")) and len(found) == 2 and found
        ),
        60,
        "both sidecars to publish the probe's knee",
    )
    assert {(p["metric"]["model"], float(p["value"][1]), p["metric"]["source"]) for p in published} == {
        (model, knee, "probe")
    }

    started = time.monotonic()
    statuses = _load(serving, pool, 60, model)
    assert statuses and set(statuses) == {200}
    window = max(int(time.monotonic() - started + 5), 1)
    quiet = _alerts_since(prometheus, window)
    assert quiet == {}, f"capacity alerts at the recommended pool of {pool}: {quiet}"
    # not vacuous: the serving replica's load was measured against the knee it published
    ratios = _query(
        prometheus,
        f"max_over_time(instance_model_task_class_caliber:headroom_concurrency:avg5m_knee_ratio[{window}s])",
    )
    seen = {r["metric"]["caliber"]: float(r["value"][1]) for r in ratios if r["metric"]["model"] == model}
    assert "requests" in seen and 0 < seen["requests"] < 0.85, seen
    # the review of the serving replica's log (through the sidecar that owns it) names the binding
    # caliber and recommends nothing on a withheld token knee
    review = subprocess.run(
        [
            str(HEADROOM),
            "report",
            "--db",
            str(stack["tmp"] / "serving.duckdb"),
            "--since",
            "1h",
            "--json",
            "-",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert review.returncode == 0, review.stderr
    [reviewed] = [m for m in json.loads(review.stdout)["models"] if m["model"] == model]
    assert reviewed["classes"][0]["concurrency"]["binding_caliber"] in ("requests", "tokens"), reviewed[
        "classes"
    ]
    if estimate["knee_tokens"] is None:
        assert not [a for a in reviewed["actions"] if "tokens caliber" in a["action"]], reviewed["actions"]

    # the other replica at twice the knee: its own 5-minute mean is all overload
    def near_knee_in_requests() -> bool:
        states = _alerts_since(prometheus, 5)
        return states.get(("HeadroomConcurrencyNearKnee", "requests", stack["overloaded_target"])) == "firing"

    with ThreadPoolExecutor(1) as clients:
        running = clients.submit(_load, stack["overloaded"], 2 * knee, 45, model)
        _wait(near_knee_in_requests, 45, "HeadroomConcurrencyNearKnee{caliber=requests} at 2x the knee")
        running.result()
    assert httpx.get(f"{serving}/healthz").status_code == 200
