"""End to end on loopback: headroom sim -> real sidecar -> real Prometheus (generated rules) -> real
Alertmanager (generated routes) -> a webhook receiver this test runs.

The Prometheus config is deploy/prometheus/prometheus.yml with only addresses and the intervals
changed (1 s scrape/evaluation). The rules are the committed generators rendered with short `for:`
durations (the committed files keep the production ones); the Alertmanager config is the twin of
alerts/alertmanager.yml with the receiver URLs pointed at the test and 1 s grouping waits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import json
import subprocess
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import free_port, require_tool
from support.processes import stop_process
from support.waiting import patient
from test_rules_promtool import dashboard_queries

from collector.alerts.alertmanager import Receivers, alertmanager_config
from collector.alerts.files import rule_files
from collector.rules.config import DEFAULT
from collector.rules.records import R
from collector.rules.render import render_yaml, write_files
from collector.sidecar.wiring import sidecar_state

ROOT = Path(__file__).resolve().parent.parent
DEPLOY_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
MODEL = "headroom-sim"
KNEE_REQUESTS = 4
pytestmark = [pytest.mark.integration, pytest.mark.timeout(patient(240))]

# Queries that cannot return data in a short test on this machine, and why.
MAY_BE_EMPTY_RECORDS = {
    R.GPU_UTILIZATION: "no GPU here: NVML is unavailable, so headroom_gpu_utilization_ratio has no series",
}
MAY_BE_EMPTY_PANELS = {
    (
        "headroom-capacity-overview",
        "GPU utilisation against tokens/s (NVML)",
        "A",
    ): "no GPU here: headroom_gpu_utilization_ratio has no series",
    (
        "headroom-capacity-overview",
        "GPU utilisation and memory bandwidth (DCGM)",
        "A",
    ): "no DCGM exporter here",
    (
        "headroom-capacity-overview",
        "GPU utilisation and memory bandwidth (DCGM)",
        "B",
    ): "no DCGM exporter here",
    (
        "headroom-capacity-review",
        "Tokens/s this week vs last week",
        "B",
    ): "`offset 7d` needs a week of history",
    (
        "headroom-capacity-overview",
        "Knee vs engine ceiling",
        "B",
    ): "the simulator's vLLM flavour publishes no kv_cache_max_concurrency",
    (
        "headroom-capacity-overview",
        "Capacity inputs the sidecar no longer trusts",
        "A",
    ): "headroom_signal_valid == 0: empty while every engine signal is sound (tests/test_signal_integrity.py kills one)",
    (
        "headroom-capacity-overview",
        "In-flight requests and active tokens, with knee, pool and the engine's ceiling",
        "F",
    ): "the simulator's vLLM flavour publishes no engine ceiling",
    **{
        ("headroom-capacity-overview", "LoRA adapters in flight vs adapter slots", ref): (
            "the test's load names no LoRA adapter: the adapter series exist only after adapter "
            "traffic (tests/test_adapters_live.py reads them from a sidecar)"
        )
        for ref in "ABC"
    },
}


class Webhook:
    """Alertmanager webhook receiver: records each notification, signals when `alertname` fires."""

    def __init__(self, alertname: str) -> None:
        self.alertname, self.notifications, self.delivered = alertname, [], threading.Event()
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                webhook.notifications.append((self.path, body))
                if any(
                    a["labels"].get("alertname") == webhook.alertname and a["status"] == "firing"
                    for a in body.get("alerts", ())
                ):
                    webhook.delivered.set()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def prometheus_config(sidecar: str, prometheus: str, alertmanager: str, unused: str) -> dict:
    """deploy/prometheus/prometheus.yml with targets moved to loopback and 1 s intervals.

    Falls back to an equivalent config when the deploy file is absent.
    """
    if DEPLOY_CONFIG.is_file():
        config = yaml.safe_load(DEPLOY_CONFIG.read_text())
    else:
        config = {
            "rule_files": ["alerts/*.rules.yaml"],
            "global": {},
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": ["x"]}]}]},
            "scrape_configs": [{"job_name": DEFAULT.sidecar_job, "static_configs": [{"targets": ["x"]}]}],
        }
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    for manager in config["alerting"]["alertmanagers"]:
        manager["static_configs"] = [{"targets": [alertmanager]}]
    addresses = {DEFAULT.sidecar_job: sidecar, "prometheus": prometheus}
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [addresses.get(job["job_name"], unused)]}]
    assert DEFAULT.sidecar_job in {job["job_name"] for job in config["scrape_configs"]}
    return config


def _start(args: list[str], ready_url: str, log: Path) -> subprocess.Popen:
    process = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)
    _wait(lambda: _ok(ready_url) or process.poll() is not None, 30, f"{args[0]} to become ready")
    assert process.poll() is None, f"{args[0]} exited: {log.read_text()[-2000:]}"
    return process


def start_prometheus(binary: str, config: dict, port: int, tmp_path: Path) -> subprocess.Popen:
    """A real Prometheus on 127.0.0.1:`port` with `config` (written to tmp_path/prometheus.yml; its
    rule files under tmp_path/alerts), its TSDB and log in tmp_path; returns once it is ready."""
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    return _start(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        f"http://127.0.0.1:{port}/-/ready",
        tmp_path / "prometheus.log",
    )


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=patient(1)).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(predicate, timeout_s: float, what: str, interval_s: float = 0.5):
    """Poll `predicate` until it returns something truthy; `timeout_s` (a quiet machine's) is stretched."""
    timeout_s = patient(timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def server_now(url: str) -> datetime:
    """Now on the clock of the Go server answering `url` (its Date header, floored to the second).

    Alertmanager and Prometheus read the kernel's clock, which scripts/clock-ahead.sh leaves days
    behind this process's: times a test sends them are on theirs.
    """
    return email.utils.parsedate_to_datetime(httpx.get(url, timeout=patient(5)).headers["date"])


def _query(prometheus: str, expr: str) -> list:
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=patient(5)).json()
    assert answer["status"] == "success", f"{expr}: {answer}"
    return answer["data"]["result"]


class Load:
    """Closed-loop load through the sidecar in a background thread, well past the knee, until stopped."""

    def __init__(self, url: str, concurrency: int) -> None:
        from collector.sim.load import run_level

        self.stop, self.statuses = threading.Event(), []

        def payload(worker: int, index: int) -> dict:
            return {"model": MODEL, "max_tokens": 24, "messages": [{"role": "user", "content": f"q{worker}"}]}

        def run() -> None:
            deadline = time.monotonic() + patient(150)
            while not self.stop.is_set() and time.monotonic() < deadline:
                level = asyncio.run(run_level(url, concurrency, 2.0, payload))
                self.statuses += [r.status for r in level.results]

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(patient(30))


@pytest.fixture
def stack(tmp_path):
    """Sim, sidecar (engine source, GPU collector, capacity gauges), Prometheus, Alertmanager, webhook."""
    prometheus_bin, alertmanager_bin = require_tool("prometheus"), require_tool("prometheus-alertmanager")
    from support.estimates import capacity_estimate

    from collector.serving import serve_in_thread
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import build_sidecar
    from collector.sim.app import create_sim_app
    from collector.sim.config import SimConfig
    from collector.store.db import RequestStore

    handles, processes, closers = [], [], []
    try:
        # Short prompts knee at max_num_seqs (tests/test_sim_knee.py): the estimate the test exports.
        sim = serve_in_thread(
            create_sim_app(
                SimConfig(
                    model=MODEL,
                    max_num_seqs=KNEE_REQUESTS,
                    max_waiting=8,
                    speed=4.0,
                    stream_interval=4,
                    per_request_metrics=True,  # vLLM's per-request timings: the split and V_P panels
                )
            )
        )
        handles.append(sim)
        store = RequestStore(str(tmp_path / "log.duckdb"))
        closers.append(store.close)
        # wired as `headroom run` does: engine source and GPU behind one scrape-health collector
        config = SidecarConfig(
            upstream=sim.url,
            db_path=None,
            instance="sidecar-it",
            engine="vllm",
            engine_metrics_url=f"{sim.url}/metrics",
            # each poll may take as long (a busy host's engine answers within a second, not half)
            engine_poll_interval_s=1.0,
        )
        app = build_sidecar(config, log_sink=store)
        gauges = sidecar_state(app).capacity
        gauges.replace(
            [
                capacity_estimate(
                    MODEL,
                    knee_requests=KNEE_REQUESTS,
                    knee_tokens=2000,
                    slo_max_requests=3,
                    slo_max_tokens=1500,
                    recommended_pool=3,
                    estimated_at=time.time(),
                    rate_requests_per_s=10.0,  # μ_slo: the rate panel's and the KEDA rate trigger's
                    prefill_tokens_per_s=4000.0,  # the probe's V_P, beside the passive one
                )
            ]
        )
        sidecar = serve_in_thread(app, timeout_graceful_shutdown=2)
        handles.append(sidecar)
        webhook = Webhook("HeadroomConcurrencyNearKnee")
        closers.append(webhook.close)

        am_port, prom_port = free_port(), free_port()
        twin = Receivers(
            page_url=f"{webhook.url}/page",
            ticket_url=f"{webhook.url}/ticket",
            group_wait="1s",
            group_interval="1s",
        )
        (tmp_path / "alertmanager.yml").write_text(render_yaml(alertmanager_config(twin), "alerts generate"))
        processes.append(
            _start(
                [
                    alertmanager_bin,
                    f"--config.file={tmp_path / 'alertmanager.yml'}",
                    f"--storage.path={tmp_path / 'am'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",
                ],
                f"http://127.0.0.1:{am_port}/-/ready",
                tmp_path / "alertmanager.log",
            )
        )

        fast = dataclasses.replace(DEFAULT, for_durations={name: "3s" for name in DEFAULT.for_durations})
        write_files(rule_files(fast), tmp_path / "alerts")
        prom_config = prometheus_config(
            f"127.0.0.1:{sidecar.port}",
            f"127.0.0.1:{prom_port}",
            f"127.0.0.1:{am_port}",
            f"127.0.0.1:{free_port()}",
        )
        processes.append(start_prometheus(prometheus_bin, prom_config, prom_port, tmp_path))
        yield {
            "prometheus": f"http://127.0.0.1:{prom_port}",
            "sidecar": sidecar.url,
            "webhook": webhook,
            "tmp": tmp_path,
        }
    finally:
        for process in processes:
            stop_process(process)
        for handle in reversed(handles):
            handle.stop()
        for close in closers:
            close()


def _recorded_series() -> list[str]:
    """One selector per recording rule: its name plus the labels it sets (quantile="0.95", ...)."""
    groups = yaml.safe_load(rule_files()["headroom-recording.rules.yaml"])["groups"]
    return [
        rule["record"] + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(rule.get("labels", {}).items())) + "}"
        for group in groups
        for rule in group["rules"]
    ]


def _keda_triggers() -> list[dict]:
    """The KEDA triggers `headroom integrations keda` renders for the estimate the stack publishes."""
    from datetime import UTC, datetime

    from collector.capacity import CapacityEstimate, KneeResult, Slo
    from collector.integrations.render import keda_scaled_object

    # no token capacity (so no token trigger): the requests and rate triggers
    estimate = CapacityEstimate(
        model=MODEL,
        source="probe",
        run_id=None,
        profile="interactive",
        levels=[],
        knee=KneeResult(
            requests=KNEE_REQUESTS,
            tokens=2000,
            reached=True,
            rule_reason="",
            kneedle_throughput=None,
            kneedle_latency=None,
            agree=True,
            note="",
        ),
        slo=Slo(),
        slo_max=None,
        slo_max_tokens=None,
        recommended_pool=3,
        created_at=datetime(2026, 12, 1, tzinfo=UTC),
        rate_requests_per_s=10.0,
    )
    return keda_scaled_object(estimate, deployment="llm-inference")["spec"]["triggers"]


def _empty(prometheus: str, queries: dict) -> dict:
    return {key: expr for key, expr in queries.items() if not _query(prometheus, expr)}


def test_rules_and_dashboards_on_a_real_prometheus_and_alert_delivery(stack):
    prometheus, webhook = stack["prometheus"], stack["webhook"]
    _wait(lambda: _query(prometheus, f'up{{job="{DEFAULT.sidecar_job}"}} == 1'), 30, "the sidecar scrape")
    light = Load(stack["sidecar"], concurrency=1)
    try:
        below = _wait(
            lambda: _query(prometheus, f'{R.KNEE_RATIO}{{caliber="requests"}}'), 30, "the knee ratio"
        )
        assert float(below[0]["value"][1]) < DEFAULT.knee_warning_ratio
        assert not _query(prometheus, 'ALERTS{alertname="HeadroomConcurrencyNearKnee"}'), (
            "fired below the knee"
        )
    finally:
        light.close()
    load = Load(stack["sidecar"], concurrency=16)
    try:
        firing = _wait(
            lambda: _query(
                prometheus,
                'ALERTS{alertname="HeadroomConcurrencyNearKnee",alertstate="firing",caliber="requests"}',
            ),
            90,
            "HeadroomConcurrencyNearKnee to fire in Prometheus",
            1.0,
        )
        assert firing[0]["metric"]["model"] == MODEL and firing[0]["metric"]["severity"] == "warning"
        assert webhook.delivered.wait(patient(60)), (
            f"Alertmanager delivered nothing; got {webhook.notifications}"
        )

        queries = {("record", selector, ""): selector for selector in _recorded_series()}
        queries |= {(uid, title, ref): expr for uid, title, ref, expr in dashboard_queries()}
        queries |= {("keda", t["name"], ""): t["metadata"]["query"] for t in _keda_triggers()}
        allowed = {("record", name + "{}", "") for name in MAY_BE_EMPTY_RECORDS} | set(MAY_BE_EMPTY_PANELS)
        deadline = time.monotonic() + patient(60)
        while (left := set(_empty(prometheus, queries)) - allowed) and time.monotonic() < deadline:
            time.sleep(2)
        assert not left, f"queries without data: {sorted(left)}"
    finally:
        load.close()

    path, notification = next(
        (p, n)
        for p, n in webhook.notifications
        if any(a["labels"]["alertname"] == "HeadroomConcurrencyNearKnee" for a in n["alerts"])
    )
    alert = next(
        a for a in notification["alerts"] if a["labels"]["alertname"] == "HeadroomConcurrencyNearKnee"
    )
    assert path == "/ticket" and notification["receiver"] == "ticket"
    # one incident, one notification: grouped by model (and cluster, absent here), not by alertname
    assert notification["groupLabels"] == {"model": MODEL}
    assert alert["annotations"]["runbook_url"].endswith("#headroomconcurrencynearknee")
    assert "of the measured knee" in alert["annotations"]["description"]
    assert 200 in load.statuses and 429 in load.statuses, "the load must go past the queue into 429s"
