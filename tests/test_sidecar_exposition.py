"""/metrics as Prometheus sees it, label caps under load, and privacy of what is stored."""

from __future__ import annotations

import logging
import subprocess

import httpx
import pytest
from conftest import require_tool
from support.sidecar import CHAT, sidecar_rig
from support.waiting import patient

from collector.sidecar.wiring import sidecar_state

MARKER = "PRIVATE-MARKER-7f3a9c"


@pytest.mark.subprocess
def test_metrics_pass_promtool_check_metrics(tmp_path):
    promtool = require_tool("promtool")
    with sidecar_rig(tmp_path) as rig:
        for mode in ("ok", "429", "500"):
            httpx.post(rig.url + "/v1/chat/completions", json=CHAT, headers={"x-fake": mode})
        text = httpx.get(rig.url + "/metrics").text
    for name in (
        "headroom_inflight_requests",
        "headroom_active_tokens",
        "headroom_requests_total",
        "headroom_time_to_first_token_seconds_bucket",
        "headroom_log_queue_rows",
    ):
        assert name in text
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "" and result.stderr.strip() == "", (
        result.stdout + result.stderr
    )


def test_500_tenants_with_max_tenants_20_give_at_most_21_label_values(tmp_path):
    with sidecar_rig(tmp_path, max_tenants=20) as rig:
        with httpx.Client() as client:
            for i in range(500):
                client.post(
                    rig.url + "/v1/chat/completions",
                    json={**CHAT, "stream": False},
                    headers={"X-Tenant-ID": f"tenant-{i}"},
                )
        metrics = rig.metrics()
        rows = rig.rows("SELECT count(DISTINCT tenant) AS n FROM requests")
    tenants = {
        dict(labels)["tenant"] for (name, labels), _ in metrics.items() if name == "headroom_requests_total"
    }
    assert len(tenants) == 21 and "other" in tenants
    assert rows[0]["n"] == 500  # the log keeps the real tenant; only labels are capped


def _send_marked_traffic(url: str) -> None:
    """Prompt, completion and bearer carry MARKER; so do the bytes two broken upstreams send."""
    body = {**CHAT, "messages": [{"role": "user", "content": f"my secret is {MARKER}"}]}
    auth = {"Authorization": f"Bearer sk-{MARKER}", "x-fake-text": MARKER}
    for stream in (True, False):
        httpx.post(url + "/v1/chat/completions", json={**body, "stream": stream}, headers=auth)
    for mode in ("malformed", "broken-framing", "garbage-head"):
        try:
            answer = httpx.post(url + "/v1/chat/completions", json=body, headers={**auth, "x-fake": mode})
            assert MARKER not in answer.text or mode == "malformed"  # our own 502 never quotes it
        except httpx.HTTPError:
            pass  # the broken stream reaches the client broken


def _files_written(root) -> dict[str, bytes]:
    return {str(path): path.read_bytes() for path in root.rglob("*") if path.is_file()}


def test_no_text_or_authorization_reaches_any_file_log_or_metric(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG):
        with sidecar_rig(tmp_path / "local") as rig:
            _send_marked_traffic(rig.url)
            rows = rig.rows()
            metrics_text = httpx.get(rig.url + "/metrics").text
            written = _files_written(tmp_path / "local")  # the DuckDB file and its WAL, while open
        spool = tmp_path / "fleet" / "spool"
        with sidecar_rig(
            tmp_path / "fleet",
            db_path=None,
            lake=str(tmp_path / "fleet" / "lake"),
            lake_roll_seconds=3600.0,
            spool_dir=str(spool),
        ) as fleet:  # rows spooled, the lake's write-ahead
            _send_marked_traffic(fleet.url)
            assert sidecar_state(fleet.app).writer.flush(patient(30))
            metrics_text += httpx.get(fleet.url + "/metrics").text
        written |= _files_written(tmp_path)
    assert len(rows) == 5 and rows[0]["tenant"].startswith("key-")
    assert any(".wal" in name for name in written) and any("spool" in name for name in written)
    assert MARKER not in repr(rows) and MARKER not in metrics_text and MARKER not in caplog.text
    leaked = [name for name, data in written.items() if MARKER.encode() in data]
    assert not leaked, leaked


@pytest.mark.subprocess
def test_headroom_run_exposition_with_every_source_passes_promtool(tmp_path):
    """The app `headroom run` builds: engine source (auto), GPU, capacity gauges, request log."""
    from support.estimates import capacity_estimate
    from support.upstream import FakeUpstream

    from collector.serving import serve_in_thread
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import build_sidecar

    promtool = require_tool("promtool")
    upstream = FakeUpstream()
    config = SidecarConfig(
        upstream=upstream.url,
        db_path=str(tmp_path / "h.duckdb"),
        engine="auto",
        engine_poll_interval_s=0.1,
        jobs=False,
        replica_class="h100-tp1",
    )
    app = build_sidecar(config)
    sidecar_state(app).capacity.replace(
        [capacity_estimate("m1", knee_requests=8, slo_max_requests=6, recommended_pool=5, estimated_at=1.7e9)]
    )
    sidecar = serve_in_thread(app)
    try:
        httpx.post(sidecar.url + "/v1/chat/completions", json=CHAT)
        text = httpx.get(sidecar.url + "/metrics").text
    finally:
        sidecar.stop()
        upstream.stop()
    for name in (
        "headroom_engine_up",
        "headroom_gpu_up",
        "headroom_source_scrape_success",
        'headroom_capacity_knee_requests{confidence="medium",model="m1",replica_class="default",'
        'source="probe",task_class="all"} 8.0',
        'headroom_capacity_estimate_timestamp_seconds{confidence="medium",model="m1",'
        'replica_class="default",source="probe",task_class="all"} 1.7e+09',
        'headroom_replica_info{replica_class="h100-tp1"} 1.0',
    ):
        assert name in text
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )
