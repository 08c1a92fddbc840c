"""Probe results reach the headroom_capacity_* gauges on every documented path, as the README's
single-box flow runs them: `headroom probe` through `headroom run`, `headroom probe --db` into a
file the sidecar imports (`--probe-db`).
Each ends with gauges equal to the probe's own knee and pool, labelled source="probe", and with a
first estimate at start-up rather than after the first 15-minute refresh.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.processes import HEADROOM, headroom_process, sim_process
from support.waiting import patient

# a probe (up to patient(240) s) then its gauges (patient(60)): past pytest's 300 s on a busy host
pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.timeout(patient(150))]
# levels of a few seconds each, so the engine's queue is sampled many times per level
PROBE = ["--levels", "1,2,4,8", "--max-tokens", "32", "--max-samples", "32", "--max-level-seconds", "10"]
SIDECAR = ["--engine", "auto", "--engine-poll-interval", "0.2"]


def _probe(url: str, json_path, *extra: str) -> dict:
    """Run the probe CLI; returns its JSON estimate."""
    done = subprocess.run(
        [str(HEADROOM), "probe", "--url", url, *PROBE, "--json", str(json_path), *extra],
        capture_output=True,
        text=True,
        timeout=patient(240),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(json_path.read_text())


def _published(url: str, timeout_s: float = 60.0) -> dict[str, float]:
    """Wait until url/metrics publishes a probe's capacity; {metric: value} of its series."""
    timeout_s = patient(timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = {
            sample.name: (sample.value, sample.labels)
            for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=patient(5)).text)
            for sample in family.samples
            if sample.name.startswith("headroom_capacity_") and sample.labels.get("source") == "probe"
        }
        if "headroom_capacity_knee_requests" in found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"no probe capacity on {url}/metrics within {timeout_s} s")


def _assert_matches(found: dict, estimate: dict) -> None:
    assert found["headroom_capacity_knee_requests"][0] == estimate["knee"]["requests"]
    assert found["headroom_capacity_recommended_pool_requests"][0] == estimate["recommended_pool"]
    labels = found["headroom_capacity_knee_requests"][1]
    assert labels["source"] == "probe" and labels["task_class"] == "all"


def _traffic(url: str, requests: int = 12) -> None:
    """A little client traffic through the sidecar, as users would send."""
    body = {
        "model": "headroom-sim",
        "max_tokens": 8,
        "stream": True,
        "messages": [{"role": "user", "content": "hello there"}],
    }
    with httpx.Client(timeout=patient(30)) as client:
        for _ in range(requests):
            assert client.post(url + "/v1/chat/completions", json=body).status_code == 200


def test_probe_through_the_sidecar_reaches_its_gauges(tmp_path):
    with sim_process(speed=1, max_num_seqs=4, seed=3) as sim:
        with headroom_process(
            "run", "--upstream", sim, *SIDECAR, "--db", str(tmp_path / "h.duckdb"), health="/healthz"
        ) as sidecar:
            _traffic(sidecar)
            token = (tmp_path / "h.duckdb.token").read_text().strip()  # the sidecar's, made at start
            estimate = _probe(sidecar, tmp_path / "cap.json", "--sidecar-token", token)
            assert estimate["knee"]["requests"] == 4 and estimate["knee"]["reached"]
            _assert_matches(_published(sidecar), estimate)


def test_probe_db_file_beside_a_sidecar_reaches_its_gauges(tmp_path):
    probe_db = tmp_path / "probe.duckdb"
    with sim_process(speed=1, max_num_seqs=4, seed=4) as sim:
        with headroom_process(
            "run",
            "--upstream",
            sim,
            *SIDECAR,
            "--db",
            str(tmp_path / "h.duckdb"),
            "--probe-db",
            str(probe_db),
            health="/healthz",
        ) as sidecar:
            estimate = _probe(sim, tmp_path / "cap.json", "--db", str(probe_db))
            _assert_matches(_published(sidecar), estimate)


def test_a_stored_probe_is_published_at_start_up(tmp_path):
    db = tmp_path / "h.duckdb"
    with sim_process(speed=1, max_num_seqs=4, seed=6) as sim:
        estimate = _probe(sim, tmp_path / "cap.json", "--db", str(db))
        started = time.monotonic()
        with headroom_process("run", "--upstream", sim, "--db", str(db), health="/healthz") as sidecar:
            _assert_matches(_published(sidecar, timeout_s=20), estimate)
    assert time.monotonic() - started < patient(30)  # at start-up, long before the 900 s refresh
    assert os.path.exists(db)
