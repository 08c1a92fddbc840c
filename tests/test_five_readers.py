"""One database, five readers, one knee: `headroom demo`, `headroom capacity curve`,
`headroom report`, the store's capacity job and the sidecar's, all reading the published
decision (collector.store.decision), report the same knee for the demo's database."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.processes import HEADROOM, headroom_process, sim_process
from support.waiting import patient

from collector.analysis.refresh import refresh_estimates
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def _run(*args: str) -> str:
    done = subprocess.run([str(HEADROOM), *args], capture_output=True, text=True, timeout=patient(300))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _gauge(text: str, name: str) -> float | None:
    return next(
        (
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == name and s.labels.get("task_class") == "all"
        ),
        None,
    )


@pytest.mark.serial  # the demo's 2 s levels on a real-time simulator: its knee is this machine's
def test_demo_curve_report_store_job_and_sidecar_job_agree(tmp_path):
    db, summary = tmp_path / "demo.duckdb", tmp_path / "demo.json"
    _run(
        "demo",
        "--speed",
        "4",
        "--levels",
        "1,4,16,32",
        "--level-seconds",
        "2",
        "--db",
        str(db),
        "--json",
        str(summary),
    )
    capacity = json.loads(summary.read_text())["capacity"]
    demo = capacity["published"]["knee_requests"]
    assert demo == 16, capacity  # the simulator's 16 slots

    curve = json.loads(_run("capacity", "curve", "--db", str(db), "--json", "-"))
    [published] = [p for p in curve["published"] if p["task_class"] == "all"]
    report = json.loads(_run("report", "--db", str(db), "--since", "1d", "--json", "-"))
    [model] = report["models"]

    store = RequestStore(db)
    gauges = CapacityGauges()
    refresh_estimates(store, gauges, datetime.now(UTC), window=timedelta(hours=1))  # the job's work
    store_job = gauges.get("headroom-sim").knee_requests
    store.close()

    with sim_process(speed=8, max_num_seqs=16) as sim:
        with headroom_process("run", "--upstream", sim, "--db", str(db), health="/healthz") as sidecar:
            deadline, sidecar_job = time.monotonic() + patient(30), None
            while sidecar_job is None and time.monotonic() < deadline:  # its start-up refresh
                sidecar_job = _gauge(
                    httpx.get(sidecar + "/metrics", timeout=patient(5)).text,
                    "headroom_capacity_knee_requests",
                )
                time.sleep(0.2)
    readers = {
        "demo": demo,
        "capacity curve": published["knee_requests"],
        "report": model["classes"][0]["estimate"]["knee_requests"],
        "store job": store_job,
        "sidecar job": sidecar_job,
    }
    assert set(readers.values()) == {16}, readers
