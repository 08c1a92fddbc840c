"""The generated rules keep clusters apart when one ruler evaluates them for many clusters.

Two clusters, a and b, each run a real sidecar scraped by a Prometheus in agent mode whose
`external_labels` name the cluster; both agents remote-write to two central rulers: a Prometheus
with the remote-write receiver, and VictoriaMetrics with vmalert. Both sidecars carry the same
`instance` label ("p1"), so only `cluster` tells their series apart: a rule that forgets it sums
cluster a's 5 in-flight requests and cluster b's 7 into one series of 12, and compares 12 with a
knee of 6. The rules are the generators' own, rendered with 3 s `for:` durations, for Prometheus
and (without `keep_firing_for`, which vmalert 1.79 refuses) for vmalert.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_tool
from support.estimates import capacity_estimate
from support.rulers import (
    AlertSink,
    Service,
    firing_alerts,
    hold_requests,
    query,
    rule_errors,
    start_agent,
    start_central_prometheus,
    start_victoria_metrics,
    start_vmalert,
    stop_services,
    write_targets,
)
from support.sidecar import Rig, gauge_values, sidecar_rig
from support.waiting import patient, wait_until

from collector.alerts.files import rule_files
from collector.rules.config import DEFAULT, RulesConfig
from collector.rules.render import write_files
from collector.sidecar.wiring import sidecar_state

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.integration, pytest.mark.subprocess, pytest.mark.timeout(patient(300))]

MODEL, INSTANCE, KNEE = "m", "p1", 6
INFLIGHT = {"a": 5, "b": 7}  # below the knee's 0.85 warning line (5/6 = 0.83), and above it (7/6)
JOB = DEFAULT.sidecar_job
SETTLE_S = 45  # how long a ruler may take to show what the agents sent (seconds; wait_until stretches it)


def _rules_config(ruler: str) -> RulesConfig:
    """The generators' rules for `ruler`, with 3 s `for:` and a 10 m absence lookback."""
    return dataclasses.replace(
        DEFAULT,
        for_durations={name: "3s" for name in DEFAULT.for_durations},
        ruler=ruler,
        absence_lookback="10m",
    )


@dataclasses.dataclass
class Ruler:
    """One central ruler: where its recorded series are queried and where its alerts are listed."""

    name: str
    series: Service  # Prometheus itself, or VictoriaMetrics (vmalert writes its records there)
    alerts: Service  # Prometheus itself, or vmalert


@dataclasses.dataclass
class Stack:
    """What the test drives: the rulers, each cluster's file_sd target list, vmalert's notifier."""

    rulers: list[Ruler]
    targets: dict[str, Path]  # cluster -> its agent's file_sd target list
    sink: AlertSink  # vmalert's notifier


def _hold(rig: Rig, count: int) -> list[socket.socket]:
    """Publish a knee of KNEE for MODEL and hold `count` requests in flight at the sidecar."""
    sidecar_state(rig.app).capacity.replace(
        [capacity_estimate(MODEL, knee_requests=KNEE, estimated_at=time.time())]
    )
    sockets = hold_requests(rig.url, MODEL, count)
    wait_until(
        lambda: gauge_values(rig.metrics(), "headroom_inflight_requests") == [float(count)],
        10,
        what=f"{count} requests in flight at the sidecar",
        interval_s=0.05,
    )
    return sockets


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """Both rulers, two sidecars holding 5 and 7 requests of model m, and an agent per cluster."""
    prometheus = require_tool("prometheus")
    vm_bin, vmalert_bin = require_tool("victoria-metrics"), require_tool("vmalert")
    services: list[Service] = []
    with contextlib.ExitStack() as exits:
        exits.callback(stop_services, services)
        for ruler in ("prometheus", "vmalert"):
            write_files(rule_files(_rules_config(ruler)), tmp_path / f"rules-{ruler}")
        central = start_central_prometheus(prometheus, tmp_path / "rules-prometheus", tmp_path)
        services.append(central)
        vm = start_victoria_metrics(vm_bin, tmp_path)
        services.append(vm)
        sink = AlertSink()
        exits.callback(sink.close)
        vmalert = start_vmalert(vmalert_bin, tmp_path / "rules-vmalert", vm.url, sink.url, tmp_path)
        services.append(vmalert)

        targets: dict[str, Path] = {}
        for cluster, count in INFLIGHT.items():
            (tmp_path / cluster).mkdir()
            rig = exits.enter_context(sidecar_rig(tmp_path / cluster, db_path=None, instance=INSTANCE))
            for sock in _hold(rig, count):
                exits.callback(sock.close)  # closed before the sidecar stops (callbacks run LIFO)
            targets[cluster] = tmp_path / f"targets-{cluster}.json"
            write_targets(targets[cluster], [rig.url.removeprefix("http://")])
        for cluster in INFLIGHT:  # after the holds: every sample the rules average is 5 or 7
            services.append(
                start_agent(
                    prometheus, cluster, JOB, targets[cluster], INSTANCE, [central.url, vm.url], tmp_path
                )
            )
        yield Stack(
            [Ruler("prometheus", central, central), Ruler("vmalert", vm, vmalert)],
            targets,
            sink,
        )


def _per_cluster(url: str, expr: str) -> dict[str, float]:
    """{cluster: value} of an instant query; a series without `cluster` fails (the merged 12)."""
    result = query(url, expr)
    merged = [series for series in result if "cluster" not in series["metric"]]
    assert not merged, f"{expr} merged the clusters: {merged}"
    values: dict[str, float] = {}
    for series in result:
        cluster = series["metric"]["cluster"]
        assert cluster not in values, f"{expr}: two series for cluster {cluster}: {result}"
        values[cluster] = round(float(series["value"][1]), 3)
    return values


def _settle(ruler: Ruler, expr: str, expected: dict[str, float]) -> None:
    """Wait until `expr` on the ruler reads `expected` per cluster; every answer keeps them apart."""
    seen: list[dict[str, float]] = []

    def reached() -> bool:
        seen.append(_per_cluster(ruler.series.url, expr))
        return seen[-1] == expected

    try:
        wait_until(reached, SETTLE_S, what=f"{ruler.name}: {expr} == {expected}", interval_s=0.5)
    except AssertionError as error:
        raise AssertionError(f"{error}; last {seen[-1:]}; errors {_errors(ruler)}") from None


def _firing(ruler: Ruler, alertname: str) -> set[str]:
    """Clusters for which `alertname` fires on the ruler."""
    labels = firing_alerts(ruler.alerts.url, alertname)
    assert all("cluster" in alert for alert in labels), f"{alertname} without a cluster: {labels}"
    return {alert["cluster"] for alert in labels}


def _wait_firing(rulers: list[Ruler], alertname: str, only: str) -> None:
    """Wait until `alertname` fires for cluster `only` on every ruler, failing if another cluster fires."""
    for ruler in rulers:

        def fires_for_only(ruler: Ruler = ruler) -> bool:
            clusters = _firing(ruler, alertname)
            assert clusters <= {only}, f"{ruler.name}: {alertname} fires for {sorted(clusters)}"
            return clusters == {only}

        try:
            wait_until(fires_for_only, SETTLE_S, what=f"{ruler.name}: {alertname} for {only}", interval_s=0.5)
        except AssertionError as error:
            raise AssertionError(f"{error}; rule errors {_errors(ruler)}") from None


def _notified(sink: AlertSink, alertname: str) -> set[str | None]:
    """Clusters of every `alertname` notification the sink received (None: one without a cluster)."""
    return {
        alert["labels"].get("cluster")
        for post in list(sink.posts)
        for alert in post
        if alert["labels"].get("alertname") == alertname
    }


def _errors(ruler: Ruler) -> dict[str, str]:
    return rule_errors(ruler.alerts.url)


def test_central_rulers_keep_clusters_apart(stack: Stack) -> None:
    """Records, the knee alert and the absence alert stay per cluster on Prometheus and vmalert."""
    raw = f'sum by (cluster) (headroom_inflight_requests{{job="{JOB}",instance="{INSTANCE}"}})'
    for ruler in stack.rulers:  # the harness: both clusters arrive, told apart by `cluster` only
        _settle(ruler, raw, {"a": 5.0, "b": 7.0})

    # 1. the in-flight records keep one series per cluster, never one of 12
    for ruler in stack.rulers:
        for record in (
            "model:headroom_inflight_requests:sum",
            "instance_model:headroom_inflight_requests:sum",
        ):
            _settle(ruler, f'{record}{{model="{MODEL}"}}', {"a": 5.0, "b": 7.0})
        ratio = 'instance_model_task_class_caliber:headroom_concurrency:avg5m_knee_ratio{caliber="requests"}'
        _settle(ruler, ratio, {"a": round(5 / KNEE, 3), "b": round(7 / KNEE, 3)})

    # 2. the knee alert fires for cluster b (7/6) only, not for a (5/6 < 0.85)
    _wait_firing(stack.rulers, "HeadroomConcurrencyNearKnee", only="b")
    for ruler in stack.rulers:
        (alert,) = firing_alerts(ruler.alerts.url, "HeadroomConcurrencyNearKnee")
        assert (alert["model"], alert["instance"], alert["caliber"]) == (MODEL, INSTANCE, "requests")
    wait_until(
        lambda: _notified(stack.sink, "HeadroomConcurrencyNearKnee") == {"b"},
        SETTLE_S,
        what="vmalert to notify HeadroomConcurrencyNearKnee for cluster b",
        interval_s=0.5,
    )

    # 3. cluster a's scrape job vanishes: the absence alert names cluster a, while b still reports
    write_targets(stack.targets["a"], [])
    for ruler in stack.rulers:  # a's series end (the agent's staleness markers), b's go on
        _settle(ruler, f'up{{job="{JOB}"}}', {"b": 1.0})
    _wait_firing(stack.rulers, "HeadroomSidecarJobAbsent", only="a")
    for ruler in stack.rulers:
        assert _per_cluster(ruler.series.url, f'up{{job="{JOB}"}}') == {"b": 1.0}, ruler.name
        assert not _errors(ruler), f"{ruler.name}: rules that failed to evaluate"


def test_vmalert_dry_run_accepts_the_files_rendered_for_it(tmp_path: Path) -> None:
    """Every file rendered with ruler="vmalert" passes vmalert's own check (expressions, templates)."""
    vmalert = require_tool("vmalert")
    for path in write_files(rule_files(_rules_config("vmalert")), tmp_path):
        run = subprocess.run([vmalert, "-dryRun", f"-rule={path}"], capture_output=True, text=True)
        assert run.returncode == 0, f"vmalert refused {path.name}: {run.stderr[-2000:]}"


def test_vmalert_dry_run_refuses_keep_firing_for(tmp_path: Path) -> None:
    """The committed files keep `keep_firing_for` (Prometheus 2.42+); vmalert 1.79 refuses them."""
    vmalert = require_tool("vmalert")
    committed = ROOT / "alerts" / "headroom-alerts.rules.yaml"
    assert "keep_firing_for:" in committed.read_text()
    run = subprocess.run([vmalert, "-dryRun", f"-rule={committed}"], capture_output=True, text=True)
    assert run.returncode != 0 and "unknown fields in rule: keep_firing_for" in run.stderr, run.stderr[-2000:]
