"""The generated Alertmanager routes and inhibitions, on a real Alertmanager with alerts posted to its API.

Same twin config as the end-to-end test (receivers pointed at a local webhook, 1 s waits):
critical pages, warning opens a ticket, a critical alert mutes its family's warning (even while
it is muted itself), the any-two composite mutes the signals it counts, and an earlier page of a
capacity incident mutes the later ones of the same model (the ramp's one page:
tests/test_alertmanager_one_page.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
import pytest
from conftest import free_port, require_tool
from support.processes import stop_process
from support.waiting import patient
from test_integration_prometheus import Webhook, _start, _wait, server_now

from collector.alerts.alertmanager import Receivers, alertmanager_config
from collector.rules.render import render_yaml

pytestmark = [pytest.mark.integration, pytest.mark.timeout(patient(120))]


@pytest.fixture
def alertmanager(tmp_path):
    binary = require_tool("prometheus-alertmanager")
    webhook = Webhook("HeadroomNearCapacityLimit")
    port = free_port()
    twin = Receivers(
        page_url=f"{webhook.url}/page",
        ticket_url=f"{webhook.url}/ticket",
        group_wait="1s",
        group_interval="1s",
    )
    (tmp_path / "am.yml").write_text(render_yaml(alertmanager_config(twin), "alerts generate"))
    process = _start(
        [
            binary,
            f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        f"http://127.0.0.1:{port}/-/ready",
        tmp_path / "am.log",
    )
    try:
        yield f"http://127.0.0.1:{port}", webhook
    finally:
        stop_process(process)
        webhook.close()


def _alert(now: datetime, **labels: str) -> dict:
    """An alert firing since `now` (Alertmanager's clock: this process's may run ahead of it)."""
    return {
        "labels": labels,
        "annotations": {"summary": labels["alertname"]},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=5)).isoformat(),
    }


def _states(url: str) -> dict[str, dict]:
    alerts = httpx.get(f"{url}/api/v2/alerts", timeout=patient(5)).json()
    return {a["labels"]["alertname"]: a["status"] for a in alerts}


def test_critical_mutes_its_warning_and_the_composite_mutes_its_signals(alertmanager):
    url, webhook = alertmanager
    now = server_now(f"{url}/-/ready")
    alerts = [
        _alert(now, alertname="HeadroomKVCacheExhausted", severity="critical", family="kv_cache", model="m"),
        _alert(now, alertname="HeadroomKVCacheNearFull", severity="warning", family="kv_cache", model="m"),
        _alert(
            now, alertname="HeadroomNearCapacityLimit", severity="critical", component="capacity", model="m"
        ),
        _alert(
            now,
            alertname="HeadroomQueueNotDraining",
            severity="warning",
            signal="queue_not_draining",
            model="m",
        ),
        _alert(
            now,
            alertname="HeadroomQueueNotDraining",
            severity="warning",
            signal="queue_not_draining",
            model="other",
        ),
    ]
    assert httpx.post(f"{url}/api/v2/alerts", json=alerts, timeout=patient(5)).status_code == 200
    assert webhook.delivered.wait(patient(30)), "the composite was not paged"
    _wait(lambda: _states(url).get("HeadroomKVCacheNearFull", {}).get("inhibitedBy"), 20, "inhibition")
    alerts_now = httpx.get(f"{url}/api/v2/alerts", timeout=patient(5)).json()
    muted = {
        (a["labels"]["alertname"], a["labels"]["model"]) for a in alerts_now if a["status"]["inhibitedBy"]
    }
    assert muted == {
        ("HeadroomKVCacheNearFull", "m"),
        ("HeadroomQueueNotDraining", "m"),
        ("HeadroomKVCacheExhausted", "m"),  # a later page of the incident the composite opened
    }

    def delivered() -> set[tuple[str, str, str]]:
        return {
            (path, a["labels"]["alertname"], a["labels"]["model"])
            for path, body in webhook.notifications
            for a in body["alerts"]
        }

    # The unmuted ticket was posted with the muted ones: once it is in, a wrongly routed one would be too.
    _wait(lambda: ("/ticket", "HeadroomQueueNotDraining", "other") in delivered(), 20, "the unmuted ticket")
    delivered = delivered()
    assert ("/page", "HeadroomNearCapacityLimit", "m") in delivered
    assert ("/ticket", "HeadroomQueueNotDraining", "other") in delivered, (
        "a signal of another model is not muted"
    )
    assert not {d for d in delivered if d[1:] in muted}, f"muted alerts were delivered: {delivered}"
