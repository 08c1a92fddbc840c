"""Only a trusted probe is a probe (#48 item 1): the probe's marks count only with the sidecar's
token, a forged ladder publishes nothing, a real one through the same sidecar still does, and every
finished probe run is examined once, whatever came of it."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from support.sidecar import CHAT, sidecar_rig
from support.waiting import patient

from collector.analysis.refresh import finished_probe_runs, refresh_estimates
from collector.record import RequestRecord
from collector.sidecar.wiring import sidecar_state
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore

PATH = "/v1/chat/completions"
LEVELS = (1, 2)


def _ladder(rig, marks: dict[str, str]) -> None:
    """A closed-loop ladder's headers, one request per level step: what `headroom probe` sends."""
    for level in LEVELS:
        for index in range(2 * level):
            headers = {
                **marks,
                "X-Headroom-Probe-Level": str(level),
                "X-Headroom-Probe-Warmup": "0",
                "X-Headroom-Request-Id": f"probe-{marks['X-Headroom-Run-Id']}-c{level}-{index}",
            }
            assert (
                httpx.post(rig.url + PATH, json=CHAT, headers=headers, timeout=patient(10)).status_code == 200
            )


def test_a_forged_ladder_publishes_nothing_and_a_real_probe_still_does(tmp_path):
    with sidecar_rig(tmp_path) as rig:
        forged = {"X-Headroom-Source": "probe", "X-Headroom-Run-Id": "forged"}
        _ladder(rig, forged)
        _ladder(rig, {**forged, "X-Headroom-Probe-Token": "not-the-token"})
        _ladder(rig, rig.probe_marks("real"))  # type: ignore[arg-type]
        rows = rig.rows("SELECT source, run_id, probe_level FROM requests")
        store: RequestStore = sidecar_state(rig.app).batch_sink
        gauges = CapacityGauges()
        now = datetime.now(UTC) + timedelta(minutes=1)
        saved = refresh_estimates(store, gauges, now, window=timedelta(hours=1), traffic=False)
    per_source = {(r["source"], r["run_id"]) for r in rows}
    assert per_source == {("traffic", None), ("probe", "real")}
    assert sum(r["source"] == "traffic" and r["probe_level"] is None for r in rows) == 2 * sum(
        2 * level for level in LEVELS
    )
    assert [estimate["run_id"] for estimate in saved] == ["real"]  # the forged runs left no run


def _junk_runs(count: int, start: datetime) -> list[dict]:
    """`count` probe runs of one request each and no level: nothing a knee can be estimated from."""
    return [
        RequestRecord(
            request_id=f"junk-{n}",
            source="probe",
            run_id=f"junk-run-{n}",
            model="m",
            tenant="t",
            admitted_at=start + timedelta(milliseconds=n),
            completed_at=start + timedelta(milliseconds=n + 50),
            outcome="ok",
            status_code=200,
        ).as_row()
        for n in range(count)
    ]


def test_each_finished_probe_run_is_examined_once_whatever_came_of_it(tmp_path, caplog):
    store = RequestStore(tmp_path / "log.duckdb")
    start = datetime(2026, 1, 5, 12, tzinfo=UTC)
    store.insert_rows(_junk_runs(400, start))
    now = start + timedelta(minutes=5)
    assert len(finished_probe_runs(store, now, 10.0)) == 400
    with caplog.at_level(logging.INFO, logger="collector.analysis.refresh"):
        for minute in range(3):  # the job every few seconds: only the first pass looks at them
            refresh_estimates(
                store, None, now + timedelta(minutes=minute), window=timedelta(hours=1), traffic=False
            )
    said = [r.getMessage() for r in caplog.records if "no measured levels" in r.getMessage()]
    assert len(said) == 400 and len(set(said)) == 400  # each run once
    assert finished_probe_runs(store, now + timedelta(minutes=5), 10.0) == []
    store.close()


@pytest.mark.parametrize("presented", [None, "wrong"])
def test_a_sidecar_without_a_token_trusts_no_mark(tmp_path, monkeypatch, presented):
    monkeypatch.delenv("HEADROOM_TOKEN", raising=False)
    with sidecar_rig(tmp_path, db_path=":memory:") as rig:
        assert rig.token is None
        headers = {"X-Headroom-Source": "probe", "X-Headroom-Run-Id": "r"}
        if presented is not None:
            headers["X-Headroom-Probe-Token"] = presented
        assert httpx.post(rig.url + PATH, json=CHAT, headers=headers, timeout=patient(10)).status_code == 200
        metrics = rig.metrics()
        rows = rig.rows("SELECT source FROM requests")
    assert rows == [{"source": "traffic"}]
    assert metrics[("headroom_probe_marks_ignored_total", (("reason", "untrusted"),))] == 1.0


@pytest.mark.parametrize("through_sidecar", [True, False], ids=["sidecar", "engine"])
def test_the_token_from_the_environment_goes_to_a_sidecar_only(tmp_path, monkeypatch, through_sidecar):
    """HEADROOM_TOKEN is the fleet's credential: the probe sends it to a headroom sidecar, whose
    rows then say probe, and never to an engine probed directly."""
    from click.testing import CliRunner

    from collector.cli import main

    with sidecar_rig(tmp_path) as rig:
        monkeypatch.setenv("HEADROOM_TOKEN", rig.token or "")
        url = rig.url if through_sidecar else rig.upstream.url
        args = ["probe", "--url", url, "--model", "m1", "--levels", "1", "--max-samples", "4"]
        result = CliRunner().invoke(main, [*args, "--max-level-seconds", "5", "--engine-metrics", "none"])
        assert result.exit_code == 0, result.output
        sent = [r["headers"].get("x-headroom-probe-token") for r in rig.fake.requests]
        sources = {row["source"] for row in rig.rows("SELECT source FROM requests")}
    assert sent and set(sent) == {None}  # the sidecar never forwards it; the engine never gets it
    assert sources == ({"probe"} if through_sidecar else set())
