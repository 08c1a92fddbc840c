"""The capacity denominator is true in a real Prometheus (#33's and #46's acceptance), on the
simulator in both cost regimes (GPU-shaped vLLM flavour, 8 slots; llama.cpp flavour with CPU step
costs, 4 slots of 1,024 tokens) and on a real llama.cpp llama-server (4 slots, 4,096 KV tokens).

The single-box flow with the probe where docs/operations.md says to run it in production (straight
at a replica that serves no clients; here the engine itself): clients first send ordinary traffic
(one request in ten with a ~600-token prompt) through the serving sidecar until its log holds the
50 answered requests a length mix needs; then the default probe (short prompts, `--traffic-db` on
that log) publishes a token capacity in the traffic's mix (docs/capacity.md "Token capacity"):
the time-weighted mean at the knee and the p95 of the instantaneous sum. The sidecars import the
probe's estimate (`--probe-db`) and publish what the one decision publishes. Then the same
traffic at the recommended pool, and a real Prometheus evaluates the generated rules:

* both calibers agree: the serving replica's 5-minute token ratio is within 20 % of its request
  ratio (tokens divided by the mean, requests by the knee);
* no capacity alert that reads a level, in either caliber, not even pending (for: shortened to
  3 s); the trend alerts are left out (TREND_ALERTS says why);
* KEDA's triggers, the ScaledObject's own queries evaluated by that Prometheus every ~3 s, ask
  for one replica at every poll (the token trigger divides by the recommended pool in tokens, the
  p99.9 of the active tokens with the pool in flight);
* the gateway's maxTokenConcurrency admits the largest request the serving log holds;
* the review of the serving log plans one replica.

At twice the knee, the request caliber's alert fires.

Before #33 the short-prompt probe's token knee (knee × ~30 tokens) was published, and the same
traffic read 2.5-4 × "the token knee"; #33 withheld it. Before #46 the token capacity was an
average of active tokens at admissions, which long prompts (living longer) outweigh in the
gauge's time average: the token alerts fired at half load.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import free_port, require_tool
from support.processes import stop_process
from support.waiting import patient
from test_integration_prometheus import _query, _wait, prometheus_config, start_prometheus

from collector.alerts.files import rule_files
from collector.analysis.token_knee import MIN_TRAFFIC_REQUESTS
from collector.capacity import CapacityEstimate
from collector.integrations.render import gateway_picker_config, keda_scaled_object
from collector.rules.config import DEFAULT
from collector.rules.render import write_files

# serial: the probe measures the knee of a real-time simulator, which a starved host moves (8 read
# as 4 with two CPU hogs beside the parallel part of make test)
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.serial,
    pytest.mark.timeout(patient(420)),
]

HEADROOM = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "headroom"
MODEL = "headroom-sim"
# engine -> (probe levels, the knee, its KV cache in tokens)
ENGINES = {
    "sim": ("1,2,4,8,16", 8, 8192),  # GPU-shaped: vLLM flavour, memory-bound steps
    "sim-llamacpp": ("1,2,4,8", 4, 4096),  # llama.cpp flavour, compute-bound (CPU) steps
    "llama.cpp": ("1,2,4,8", 4, 4096),
}
# the alerts that read a level: at the pool none may be pending, in either caliber
CAPACITY_ALERTS = (
    "HeadroomConcurrencyNearKnee|HeadroomNearCapacityLimit|HeadroomTokenCaliberDivergence|"
    "HeadroomFleetHeadroomLow|HeadroomKVCacheNearFull|HeadroomKVCacheExhausted|HeadroomQueueNotDraining"
)
# the alerts that read a trend (predict_linear and deriv over 30 minutes): the pool phase is a
# 60 s step up from ordinary traffic, which is exactly the climb they forecast, and whether the
# 5-minute ratio has crossed their 0.5 gate by then is a coin toss (requests 0.45, tokens 0.51 in
# one CI run). Their rules are pinned by promtool cases and by the backtest (docs/rules.md)
TREND_ALERTS = ("HeadroomConcurrencyRising", "HeadroomCapacityForecast")
# the traffic before the probe: at or under either engine's pool, so the review's busiest minute
# is the pool's
ORDINARY_CONCURRENCY = 2
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
    if name == "sim-llamacpp":  # the second cost regime: 4 slots of 1,024 tokens, CPU costs
        config = SimConfig(
            model=MODEL,
            flavor="llamacpp",
            max_num_seqs=4,
            kv_cache_tokens=4096,
            cost_profile="cpu",
            speed=4.0,
            stream_interval=4,
        )
    else:
        config = SimConfig(model=MODEL, max_num_seqs=8, speed=4.0, stream_interval=4, kv_cache_tokens=8192)
    sim = serve_in_thread(create_sim_app(config))
    try:
        yield sim.url, config.flavor
    finally:
        sim.stop()


@pytest.fixture(
    params=[
        "sim",
        "sim-llamacpp",
        pytest.param("llama.cpp", marks=[pytest.mark.real_engine, pytest.mark.timeout(patient(900))]),
    ]
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
                    # each poll may take as long (a busy host's engine answers within a second, not half)
                    engine_poll_interval_s=1.0,
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
            served = httpx.get(f"{url}/v1/models", timeout=patient(10)).json()["data"][0]["id"]
            yield {
                "engine": request.param,
                "model": served,
                "engine_url": url,
                "serving": sidecars["serving"].url,
                "overloaded": sidecars["overloaded"].url,
                "serving_target": f"127.0.0.1:{sidecars['serving'].port}",  # Prometheus's instance
                "overloaded_target": f"127.0.0.1:{sidecars['overloaded'].port}",
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
        timeout=patient(240),
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr
    return json.loads(out.read_text())


def _answered(stack: dict) -> tuple[int, int]:
    """(answered traffic requests, the largest of one: prompt + completion in the engine's usage
    or in the gauge's own count, whichever is larger) in the serving replica's log, read through its sidecar (the owner's snapshot): the rows the token mix counts."""
    from collector.store.owner import open_request_log

    time.sleep(1.5)  # the log writer's 0.5 s timer: the last requests' rows are in
    with open_request_log(stack["tmp"] / "serving.duckdb") as store:
        [(count, largest)] = store.query(
            "SELECT count(*), coalesce(max(greatest(prompt_tokens + completion_tokens,"
            " coalesce(held_prompt_tokens + held_generated_tokens, 0))), 0) FROM requests"
            " WHERE source = 'traffic' AND outcome = 'ok' AND prompt_tokens IS NOT NULL"
            " AND completion_tokens IS NOT NULL AND e2e_s > 0 AND model = ?",
            [stack["model"]],
        )
    return int(count), int(largest)


def _keda_replicas(prometheus: str, triggers: dict[str, dict]) -> dict[str, tuple[float, int]]:
    """Each trigger's query evaluated now: {name: (value, replicas)}, replicas as the HPA computes
    them for an AverageValue metric, ceil(value / threshold), at least minReplicaCount (1)."""
    polled = {}
    for name, trigger in triggers.items():
        [answer] = _query(prometheus, trigger["metadata"]["query"])
        value = float(answer["value"][1])
        polled[name] = (round(value, 3), max(1, math.ceil(value / float(trigger["metadata"]["threshold"]))))
    return polled


def _knee_ratios(prometheus: str, instance: str, model: str) -> dict[str, float]:
    """The serving replica's 5-minute load over the knee, per caliber (the recording rule)."""
    found = _query(
        prometheus,
        "instance_model_task_class_caliber:headroom_concurrency:avg5m_knee_ratio"
        f'{{instance="{instance}", model="{model}"}}',
    )
    return {r["metric"]["caliber"]: float(r["value"][1]) for r in found}


def test_the_recommended_pool_raises_no_capacity_alert_and_twice_the_knee_does(stack):
    prometheus, serving, model = stack["prometheus"], stack["serving"], stack["model"]
    _, expected_knee, kv = ENGINES[stack["engine"]]
    # what is left out is exactly the rules' own trend family, no more
    rules = yaml.safe_load(rule_files(DEFAULT)["headroom-alerts.rules.yaml"])["groups"]
    trends = {
        r["alert"] for g in rules for r in g["rules"] if r.get("labels", {}).get("family") == "knee_trend"
    }
    assert trends == set(TREND_ALERTS) and not trends & set(CAPACITY_ALERTS.split("|")), trends
    _wait(lambda: len(_query(prometheus, f'up{{job="{DEFAULT.sidecar_job}"}} == 1')) == 2, 30, "both scrapes")
    # ordinary traffic first, at or under either engine's pool, until the serving log holds the
    # answered requests a token mix needs (llama.cpp on a CPU is slower: a few rounds, bounded)
    deadline, answered = time.monotonic() + patient(150), 0
    while answered < MIN_TRAFFIC_REQUESTS + 10 and time.monotonic() < deadline:
        assert set(_load(serving, ORDINARY_CONCURRENCY, 15, model)) == {200}
        answered, _ = _answered(stack)
    assert answered >= MIN_TRAFFIC_REQUESTS, f"{answered} answered traffic requests before the probe"

    # the default probe (short prompts) beside that log publishes a token capacity in the
    # traffic's own mix: the time-weighted mean at the knee, its p95, both within the KV cache
    estimate = _probe(stack)
    knee, pool = estimate["knee_requests"], estimate["recommended_pool"]
    assert knee == expected_knee and 1 <= pool < knee, estimate
    assert estimate["token_knee_withheld"] is None and estimate["knee_tokens"], estimate["token_capacity"]
    knee_tokens, knee_tokens_p95 = estimate["knee_tokens"], estimate["knee_tokens_p95"]
    assert knee_tokens <= knee_tokens_p95 <= kv, estimate["token_capacity"]
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
    for gauge, value in (
        ("headroom_capacity_knee_tokens", knee_tokens),
        ("headroom_capacity_knee_tokens_p95", knee_tokens_p95),
    ):
        found = _query(prometheus, f'{gauge}{{model="{model}", task_class="all"}}')
        assert sorted(float(p["value"][1]) for p in found) == [value, value], (gauge, found)

    # the recommended pool of the same traffic (one ~600-token prompt in ten); KEDA's triggers
    # are evaluated every ~3 s by this Prometheus on the recorded series, as KEDA would poll them
    published = CapacityEstimate.from_dict(estimate)  # the probe's --json, as the store reads it back
    scaled_object = keda_scaled_object(published, deployment="x", prometheus_url=prometheus, config=DEFAULT)
    triggers = {t["name"]: t for t in scaled_object["spec"]["triggers"]}
    assert {"inflight-requests-per-pool", "active-tokens-per-pool"} <= set(triggers), scaled_object
    polls = []
    started = time.monotonic()
    with ThreadPoolExecutor(1) as clients:
        running = clients.submit(_load, serving, pool, 60, model)
        while not running.done():
            time.sleep(3)
            if not running.done():
                polls.append(_keda_replicas(prometheus, triggers))
        statuses = running.result()
    ratios = _knee_ratios(prometheus, stack["serving_target"], model)
    assert statuses and set(statuses) == {200}
    window = max(int(time.monotonic() - started + 5), 1)
    quiet = _alerts_since(prometheus, window)
    _, largest = _answered(stack)
    limit = gateway_picker_config(published, mode="tokens")["plugins"][0]["parameters"]["maxTokenConcurrency"]
    # the review of the serving replica's log (through the sidecar that owns it)
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
        timeout=patient(120),
    )
    assert review.returncode == 0, review.stderr
    [reviewed] = [m for m in json.loads(review.stdout)["models"] if m["model"] == model]
    [entry] = reviewed["classes"]
    scaled = [max(replicas for _, replicas in poll.values()) for poll in polls]
    measured = (
        f"{stack['engine']}: knee {knee}, pool {pool}; {answered} answered requests before the probe; "
        f"knee_tokens {knee_tokens}, p95 {knee_tokens_p95} (KV {kv}); 5-minute knee ratios {ratios}; "
        f"KEDA replicas per poll {scaled}, (value, replicas) per trigger {polls}, token budget "
        f"{scaled_object['metadata']['annotations'].get('llm-headroom/pool-tokens')}; largest request "
        f"{largest} (estimate {estimate['max_request_tokens']}), gateway maxTokenConcurrency {limit}; "
        f"review {entry['plan']['needed']}, replicas_needed {entry['plan']['replicas_needed']}"
    )
    print(f"\n{measured}")
    assert quiet == {}, f"capacity alerts at the recommended pool of {pool}: {quiet}; {measured}"
    # both calibers agree: the same load over each one's knee, within 20 %, not vacuous
    assert set(ratios) == {"requests", "tokens"} and 0 < ratios["requests"] < 0.85, measured
    assert ratios["tokens"] > 0 and abs(ratios["tokens"] / ratios["requests"] - 1) <= 0.2, measured
    # KEDA asks for one replica at every poll, in both calibers, with traffic in flight
    assert len(polls) >= 10 and set(scaled) == {1}, measured
    assert max(poll["active-tokens-per-pool"][0] for poll in polls) > 0, measured
    # the gateway admits the largest request the traffic sent (the estimate saw it before the
    # probe), on an idle replica too
    assert estimate["max_request_tokens"] <= largest <= limit, measured
    # the review plans one replica
    assert entry["plan"]["replicas_needed"] == 1, (measured, entry["plan"], reviewed["actions"])

    # the other replica at twice the knee: its own 5-minute mean is all overload
    def near_knee_in_requests() -> bool:
        states = _alerts_since(prometheus, 5)
        return states.get(("HeadroomConcurrencyNearKnee", "requests", stack["overloaded_target"])) == "firing"

    with ThreadPoolExecutor(1) as clients:
        running = clients.submit(_load, stack["overloaded"], 2 * knee, 45, model)
        _wait(near_knee_in_requests, 45, "HeadroomConcurrencyNearKnee{caliber=requests} at 2x the knee")
        running.result()
    assert httpx.get(f"{serving}/healthz").status_code == 200
