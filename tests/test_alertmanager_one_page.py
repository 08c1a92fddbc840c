"""One incident, one page: the ramp backtest's alerts through a real Alertmanager 0.25.

The ramp scenario runs through the generated rules on a real Prometheus (as `headroom alerts
backtest ramp` does); the alerts it fired are then replayed into a real Alertmanager through its
v2 API in the order they fired and resolved, as Prometheus would send them, with the generated
routes, grouping and inhibitions (the receivers pointed at this test's webhook, 1 s waits). After
each step that adds a page, the test awaits Alertmanager's flush of the page group holding it (its
debug log names the alerts it flushes), so every page had its chance to notify. Then everything
resolves and the test awaits the page group's resolution message: notifications of one group are
sent in order, so every notification the incident caused is in by then.

The ramp: exactly one page notification is delivered, the forecast's, and the simulation of
Alertmanager the backtest reports (collector.backtest.notifications) says the same. kv_saturation,
whose pages fire out of INCIDENT_PAGES' order: its later notifications all carry the one group key
and nothing resolves between them, so a pager keyed on the group key holds one incident; the
simulation counts one page incident too. (The twin's group_interval is 1 s where the page route's
is 1 h, so the twin shows every update the hour would fold into one.)
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from pathlib import Path

import httpx
import pytest
from conftest import free_port, require_tool
from support.processes import stop_process
from support.waiting import patient
from test_integration_prometheus import Webhook, _start, _wait, server_now

from collector.alerts.alertmanager import INCIDENT_PAGES, Receivers, alertmanager_config
from collector.backtest.notifications import notify
from collector.backtest.run import run_scenario
from collector.backtest.scenarios import SCENARIOS
from collector.backtest.timeline import AlertSpan
from collector.rules.config import DEFAULT
from collector.rules.render import render_yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(patient(300))]


@pytest.fixture
def alertmanager(tmp_path):
    binary = require_tool("prometheus-alertmanager")
    webhook = Webhook("HeadroomCapacityForecast")
    port = free_port()
    twin = Receivers(
        page_url=f"{webhook.url}/page",
        ticket_url=f"{webhook.url}/ticket",
        group_wait="1s",
        group_interval="1s",
        group_interval_page="1s",  # the hour an open incident's joiners wait, scaled like the rest
    )
    config = alertmanager_config(twin)
    (tmp_path / "am.yml").write_text(render_yaml(config, "alerts generate"))
    log = tmp_path / "am.log"
    process = _start(
        [
            binary,
            f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=debug",
        ],
        f"http://127.0.0.1:{port}/-/ready",
        log,
    )
    try:
        yield f"http://127.0.0.1:{port}", webhook, log, config
    finally:
        stop_process(process)
        webhook.close()


def _flushed(log: Path, after: int, names: set[str]) -> bool:
    """Whether a page-group flush logged past byte `after` names every alert of `names`."""
    return any(
        "msg=flushing" in line and 'severity=\\"critical\\"' in line and all(f"{n}[" in line for n in names)
        for line in log.read_text()[after:].splitlines()
    )


def _events(spans: list[AlertSpan]) -> list[tuple[float, list[AlertSpan]]]:
    """(time, the spans firing then) at every moment an alert fired or resolved."""
    moments = sorted({s.fired_at for s in spans} | {s.ended_at for s in spans if s.ended_at is not None})
    return [
        (t, [s for s in spans if s.fired_at <= t and (s.ended_at is None or s.ended_at > t)]) for t in moments
    ]


def _payload(span: AlertSpan, starts: datetime, ends: datetime) -> dict:
    return {
        "labels": span.labels | {"alertname": span.name},
        "annotations": {"summary": span.name},
        "startsAt": starts.isoformat(),
        "endsAt": ends.isoformat(),
    }


def _replay(url: str, log: Path, spans: list[AlertSpan]) -> dict[int, datetime]:
    """Post the spans to Alertmanager as Prometheus would, step by step; after each step that adds
    a page, await the flush of the page group holding it. Returns when each span started."""
    started: dict[int, datetime] = {}
    seen_pages: set[str] = set()
    for _, firing in _events(spans):
        now = server_now(f"{url}/-/ready")  # Alertmanager's clock: this process's may run ahead
        body = []
        for span in spans:
            if span in firing:
                starts = started.setdefault(id(span), now)
                body.append(_payload(span, starts, now + timedelta(minutes=5)))
            elif id(span) in started:  # resolved: Prometheus sends endsAt once the alert ends
                body.append(_payload(span, started[id(span)], now))
        mark = len(log.read_text())
        assert httpx.post(f"{url}/api/v2/alerts", json=body, timeout=patient(5)).status_code == 200
        added = {s.name for s in firing if s.is_page} - seen_pages
        if added:
            seen_pages |= added
            _wait(partial(_flushed, log, mark, added), 30, f"a flush of the page group with {added}")
    return started


def _resolve_all(url: str, webhook: Webhook, spans: list[AlertSpan], started: dict[int, datetime]) -> None:
    """Everything resolves; await the page group's resolution message (a group's notifications are
    sent in order, so every notification the incident caused is in by then)."""
    now = server_now(f"{url}/-/ready")
    resolve = [_payload(s, started[id(s)], now) for s in spans if id(s) in started]
    assert httpx.post(f"{url}/api/v2/alerts", json=resolve, timeout=patient(5)).status_code == 200
    _wait(
        lambda: any(p == "/page" and b["status"] == "resolved" for p, b in list(webhook.notifications)),
        30,
        "the page group's resolution",
    )


def test_the_ramp_incident_pages_once(alertmanager, tmp_path):
    require_tool("prometheus"), require_tool("promtool")
    url, webhook, log, config = alertmanager
    result = run_scenario(SCENARIOS["ramp"], DEFAULT, tmp_path / "ramp")
    spans = result.timeline.fired
    pages = {s.name for s in spans if s.is_page}
    assert len(pages) >= 4 and "HeadroomCapacityForecast" in pages, pages
    started = _replay(url, log, spans)

    # while every page fires, each one after the forecast is inhibited by an earlier one
    states = {
        a["labels"]["alertname"]: a["status"]
        for a in httpx.get(f"{url}/api/v2/alerts", timeout=patient(5)).json()
        if a["labels"].get("severity") == "critical"
    }
    still = {s.name for s in spans if s.is_page and s.ended_at is None}
    for name in still - {"HeadroomCapacityForecast"}:
        assert states[name]["inhibitedBy"], f"{name} was not inhibited: {states[name]}"
    assert INCIDENT_PAGES[0] == "HeadroomCapacityForecast"

    _resolve_all(url, webhook, spans, started)
    paged = [b for p, b in webhook.notifications if p == "/page" and b["status"] == "firing"]
    assert len(paged) == 1, [[a["labels"]["alertname"] for a in b["alerts"]] for b in paged]
    assert [a["labels"]["alertname"] for a in paged[0]["alerts"]] == ["HeadroomCapacityForecast"]
    assert paged[0]["groupLabels"] == {"model": "llama-70b"}

    simulated = notify(spans, config, result.timeline.end)
    assert [n.new for n in simulated if n.receiver == "page"] == [("HeadroomCapacityForecast",)]


def test_an_incident_whose_pages_fire_out_of_order_is_one_group_key_at_the_pager(alertmanager, tmp_path):
    """kv_saturation pages the KV cache first, then the composite and the forecast that come before
    it in INCIDENT_PAGES: later notifications, but every one of them under one group key and no
    resolution between them, so a pager keyed on it (PagerDuty's dedup_key) holds one incident."""
    require_tool("prometheus"), require_tool("promtool")
    url, webhook, log, config = alertmanager
    result = run_scenario(SCENARIOS["kv_saturation"], DEFAULT, tmp_path / "kv")
    spans = result.timeline.fired
    first = min((s for s in spans if s.is_page), key=lambda s: s.fired_at)
    assert first.name == "HeadroomKVCacheExhausted", first.name  # the premise: out of INCIDENT_PAGES' order
    started = _replay(url, log, spans)
    _resolve_all(url, webhook, spans, started)

    sent = [b for p, b in webhook.notifications if p == "/page"]
    firing = [b for b in sent if b["status"] == "firing"]
    assert len(firing) >= 2  # the incident changed after it opened: Alertmanager told the pager
    assert {b["groupKey"] for b in sent} == {firing[0]["groupKey"]}  # one key: one pager incident
    last_firing = max(i for i, b in enumerate(sent) if b["status"] == "firing")
    assert all(b["status"] == "firing" for b in sent[: last_firing + 1])  # never resolved in between
    incidents = [n for n in notify(spans, config, result.timeline.end) if n.receiver == "page" and n.opens]
    assert len(incidents) == 1 and len(result.page_incidents) == 1  # the twin's timings and the real ones
