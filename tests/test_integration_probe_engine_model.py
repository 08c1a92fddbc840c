"""Issue #33, points 5 and 6, live: the simulator in llama.cpp's flavour (metrics without a model
label, /slots, /v1/models) behind a real sidecar, and a real Prometheus evaluating the generated
rules.

- The engine series carry the served model (read from /v1/models; no --model given), so the
  overview dashboard's engine panels return data with that model selected.
- `headroom probe` through the serving sidecar, driven past the knee, misses the TTFT SLO on
  most of its requests, yet no SLO burn alert or latency signal goes pending: its requests are
  labelled source="probe" and the rules read clients' requests only. The same burn computed
  over every request is far past the fast-burn threshold, so the test fails if the rules stop
  leaving the probe out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from datetime import UTC, datetime

import httpx
import pytest
from conftest import free_port, require_tool
from support.processes import stop_process
from support.waiting import patient
from test_integration_prometheus import _query, _wait, prometheus_config, start_prometheus
from test_rules_promtool import dashboard_queries, substitute

from collector.alerts.files import rule_files
from collector.alerts.slo_alerts import FAST_BURNS
from collector.rules.config import DEFAULT
from collector.rules.naming import le_label
from collector.rules.records import R
from collector.rules.render import write_files

MODEL = "headroom-sim"
SLOTS = 4
TTFT_SLO_S = 0.5  # a TTFT bucket; one request at a time stays far inside it on the simulator
CLIENT_REQUESTS = 30  # past the rules' minimum-traffic guard (20 in 5 minutes)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(patient(240))]

# Alerts that read latency or the SLO: none may even go pending while only the probe is slow.
LATENCY_ALERTS = (
    "HeadroomAvailabilityBudgetBurnFast",
    "HeadroomTTFTBudgetBurnFast",
    "HeadroomE2EBudgetBurnFast",
    "HeadroomTailLatencyOverSLO",
    "HeadroomTTFTRising",
    "HeadroomSlowReplica",
)


PROBE_TOKEN = "probe-token-for-this-test"  # the sidecar's HEADROOM_TOKEN, which the probe sends


@pytest.fixture
def stack(tmp_path, monkeypatch):
    """Simulator (llama.cpp flavour), sidecar (engine llamacpp, no --model), Prometheus with the rules."""
    monkeypatch.setenv("HEADROOM_TOKEN", PROBE_TOKEN)  # the sidecar trusts probe marks with it
    prometheus_bin = require_tool("prometheus")
    from collector.serving import serve_in_thread
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import build_sidecar
    from collector.sim.app import create_sim_app
    from collector.sim.config import SimConfig
    from collector.store.db import RequestStore

    handles, processes, closers = [], [], []
    try:
        sim = serve_in_thread(
            create_sim_app(
                SimConfig(
                    flavor="llamacpp",
                    model=MODEL,
                    max_num_seqs=SLOTS,
                    max_waiting=64,
                    speed=4.0,
                    stream_interval=4,
                )
            )
        )
        handles.append(sim)
        store = RequestStore(str(tmp_path / "log.duckdb"))
        closers.append(store.close)
        config = SidecarConfig(
            upstream=sim.url,
            db_path=None,
            instance="sidecar-probe",
            engine="llamacpp",
            # each poll may take as long (a busy host's engine answers within a second, not half)
            engine_poll_interval_s=1.0,
        )
        sidecar = serve_in_thread(build_sidecar(config, log_sink=store), timeout_graceful_shutdown=2)
        handles.append(sidecar)
        rules = dataclasses.replace(
            DEFAULT,
            ttft_slo_seconds=TTFT_SLO_S,
            for_durations={name: "2s" for name in DEFAULT.for_durations},
        )
        write_files(rule_files(rules), tmp_path / "alerts")
        port = free_port()
        prom_config = prometheus_config(
            f"127.0.0.1:{sidecar.port}",
            f"127.0.0.1:{port}",
            f"127.0.0.1:{free_port()}",
            f"127.0.0.1:{free_port()}",
        )
        processes.append(start_prometheus(prometheus_bin, prom_config, port, tmp_path))
        yield {
            "prometheus": f"http://127.0.0.1:{port}",
            "sidecar": sidecar.url,
            "rules": rules,
            "store": store,
        }
    finally:
        for process in processes:
            stop_process(process)
        for handle in reversed(handles):
            handle.stop()
        for close in closers:
            close()


def _engine_panels() -> list[tuple[str, str, str]]:
    """(panel, refId, expr with $model = MODEL) of every overview target that reads an engine series
    llama.cpp publishes (not vLLM's preemption and prefix-cache counters)."""
    vllm_only = ("headroom_engine_preemptions_total", "headroom_engine_prefix_cache_")
    return [
        (title, ref, substitute(expr.replace("$model", MODEL)))
        for uid, title, ref, expr in dashboard_queries()
        if uid == "headroom-capacity-overview"
        and "headroom_engine_" in expr
        and not any(name in expr for name in vllm_only)
    ]


def _chat(url: str, index: int) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 16,
        "stream": True,
        "messages": [{"role": "user", "content": f"c{index}"}],
    }
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=patient(30))
    assert answer.status_code == 200, answer.text


def _last_evaluation(prometheus: str, group: str) -> float:
    groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=patient(5)).json()["data"]["groups"]
    stamp = next(g["lastEvaluation"] for g in groups if g["name"] == group)  # 2026-12-04T19:40:01.12Z
    return datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()


def test_engine_panels_show_the_served_model_and_a_probe_past_the_knee_raises_no_slo_alert(stack):
    prometheus, sidecar = stack["prometheus"], stack["sidecar"]
    _wait(lambda: _query(prometheus, f'up{{job="{DEFAULT.sidecar_job}"}} == 1'), 30, "the sidecar scrape")

    # 5: the engine series carry the model /v1/models names, and the engine panels show it
    _wait(
        lambda: _query(prometheus, f'headroom_engine_requests_waiting{{engine="llamacpp",model="{MODEL}"}}'),
        30,
        "engine series labelled with the served model",
    )
    assert not _query(prometheus, 'headroom_engine_requests_running{model=""}')
    panels = _engine_panels()
    assert len(panels) >= 4, panels  # KV usage, running and waiting, the ceiling ...
    for index in range(CLIENT_REQUESTS):  # clients, one at a time: inside the SLO
        _chat(sidecar, index)
    _wait(lambda: _query(prometheus, f'{R.TTFT_QUANTILE}{{quantile="0.95"}}'), 30, "client TTFT records")
    empty = lambda: [(title, ref) for title, ref, expr in panels if not _query(prometheus, expr)]  # noqa: E731
    deadline = time.monotonic() + patient(30)
    while (left := empty()) and time.monotonic() < deadline:
        time.sleep(1)
    health = {q: _query(prometheus, q) for q in ("up", "headroom_engine_up")} if left else {}
    assert not left, f"engine panels without data for model {MODEL}: {left}; {health}"

    # 6: the probe through the serving sidecar, well past the knee of SLOTS
    from collector.analysis.probe import ProbeSettings, run_probe

    settings = ProbeSettings(
        url=sidecar,
        model=MODEL,
        levels=(1, 16, 32),
        max_tokens=32,
        min_samples=16,
        max_samples=64,
        max_level_s=8.0,
        warmup_per_worker=0,
        engine_metrics="none",
        sidecar_token=PROBE_TOKEN,
    )
    result = asyncio.run(run_probe(settings))
    probe_ttft = [row for level in result.levels for row in level.rows if row.get("ttft_s") is not None]
    assert probe_ttft and max(r["ttft_s"] for r in probe_ttft) > TTFT_SLO_S, "the probe never passed the SLO"

    budget = stack["rules"].default_slo.budget("ttft")
    threshold = FAST_BURNS[0][2] * budget
    at_slo = le_label(TTFT_SLO_S)
    every_request = (
        f'1 - sum by (model) (increase(headroom_time_to_first_token_seconds_bucket{{le="{at_slo}"}}[5m]))\n'
        "/ sum by (model) (increase(headroom_time_to_first_token_seconds_count[5m]))"
    )
    # the probe's requests reached Prometheus: counting them too, the fast burn would page
    burned = _wait(
        lambda: [s for s in _query(prometheus, every_request) if float(s["value"][1]) > threshold],
        30,
        "the probe's TTFT misses in Prometheus",
    )
    # Prometheus's clock, not this process's: under scripts/clock-ahead.sh the two differ by days
    seen_at = float(_query(prometheus, "time()")[1])
    assert _query(prometheus, 'headroom_time_to_first_token_seconds_count{source="probe"} > 0')
    # the rules evaluate past every `for:` (2 s) after the misses were in: then nothing is pending
    _wait(lambda: _last_evaluation(prometheus, "headroom-slo") > seen_at + 4, 30, "rule evaluations")
    clients = _query(prometheus, f'{R.slo_misses("5m", "ttft")}{{model="{MODEL}"}}')
    assert clients and float(clients[0]["value"][1]) <= threshold, (clients, burned)
    alerts = _query(prometheus, f'ALERTS{{alertname=~"{"|".join(LATENCY_ALERTS)}"}}')
    assert alerts == [], json.dumps(alerts)[:2000]
