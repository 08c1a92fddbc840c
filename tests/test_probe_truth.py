"""What a probe publishes must be true (#33 build 1 and 2).

Errors: each level keeps its outcome mix and first error; an estimate whose non-capacity error
ratio passes MAX_ERROR_RATIO has confidence none and the gate publishes nothing. Token capacity
(#46): whatever prompts the probe sends, its token capacity is the traffic's time-weighted tokens
per in-flight request at its request knee; `--workload from-log` draws the traffic's own lengths.
Unit tests first, then the real CLI against the simulator.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from support.estimates import capacity_estimate
from support.processes import HEADROOM, sim_process
from support.synthetic import closed_loop_rows
from support.waiting import patient

from collector.analysis.estimate import build_estimate, probe_levels
from collector.analysis.levels import summarize_level
from collector.analysis.probe_request import ERROR_TEXT_CHARS, error_text
from collector.analysis.token_knee import traffic_token_mix
from collector.analysis.workload import log_lengths
from collector.capacity import CapacityEstimate
from collector.report.actions import recommend_actions
from collector.report.build import _concurrency
from collector.report.collect import ClassFigures
from collector.store.db import RequestStore
from collector.store.decision import MAX_ERROR_RATIO, decisions

NOW = datetime.now(UTC).replace(microsecond=0)


def _probe_rows(bad_every: int | None = None) -> list[dict]:
    """A stored probe run (knee 4); every `bad_every`-th request answered HTTP 400."""
    rows = closed_loop_rows(
        slots=4, levels=(1, 2, 4, 8), seconds_per_level=20, source="probe", run_id="probe-e", start=NOW
    )
    for i, row in enumerate(rows):
        if bad_every and i % bad_every == 0:
            row.update(outcome="bad_request", status_code=400, error="HTTP 400", ttft_s=None, tpot_s=None)
    return rows


# -- errors ------------------------------------------------------------------------------------


def test_a_level_keeps_its_outcome_mix_and_first_error():
    rows = _probe_rows()[:10]
    rows[3].update(outcome="bad_request", status_code=400, error="HTTP 400")
    rows[5].update(outcome="rate_limited", status_code=429, error="HTTP 429")
    rows[7].update(outcome="upstream_error", status_code=200, error="ValueError")
    stats = summarize_level(rows, 1, first_error="HTTP 400: prompt too long")
    assert stats.outcomes == {"ok": 7, "http 400": 1, "http 429": 1, "upstream_error": 1}
    assert stats.first_error == "HTTP 400: prompt too long"
    assert stats.non_capacity_error_ratio == pytest.approx(0.2)  # the 429 is capacity
    assert summarize_level(rows, 1).first_error == "HTTP 400"  # a stored row keeps our reason only
    assert stats.to_dict()["outcomes"] == stats.outcomes


def test_error_text_is_one_truncated_line_without_the_prompt():
    prompt = "Summarise the quarterly report about token quotas for the board."
    body = json.dumps({"error": {"message": f"bad input:\n  {prompt} is too long " + "x" * 400}}).encode()
    text = error_text("HTTP 400", body, prompt)
    assert text.startswith("HTTP 400: bad input: [prompt text] is too long")
    assert "quarterly" not in text and "\n" not in text
    assert len(text) <= len("HTTP 400: ") + ERROR_TEXT_CHARS
    # the end of a message shorter than the run is never taken for prompt text
    assert error_text("HTTP 400", b'{"error": "shorten one of them"}', "a prompt with them") == (
        "HTTP 400: shorten one of them"
    )
    assert error_text("HTTP 502", b"<html>bad gateway</html>", "") == "HTTP 502: <html>bad gateway</html>"


def test_an_estimate_with_a_quarter_of_400s_is_not_confident_and_says_why():
    estimate = build_estimate(probe_levels(_probe_rows(bad_every=4)), model="m", run_id="probe-e")
    data = estimate.to_dict()
    assert data["error_ratio"] > MAX_ERROR_RATIO and 0.2 <= data["error_ratio"] <= 0.3
    assert data["confidence"] == "none"
    assert "failed for reasons other than capacity" in data["confidence_reason"]
    assert "http 400" in data["confidence_reason"] and "first error: HTTP 400" in data["confidence_reason"]
    assert CapacityEstimate.from_dict(data).error_ratio == data["error_ratio"]
    clean = build_estimate(probe_levels(_probe_rows()), model="m", run_id="probe-e")
    assert clean.confidence == "high" and clean.error_ratio == 0.0


def test_a_pool_of_zero_says_which_level_missed_which_target():
    from collector.capacity import Slo

    estimate = build_estimate(probe_levels(_probe_rows()), slo=Slo(ttft_p95_s=0.001), model="m")
    assert estimate.recommended_pool == 0
    assert estimate.to_dict()["pool_reason"].startswith("no level met the SLO: at concurrency 1, p95 TTFT")


# -- the token capacity (the definitions: tests/test_token_capacity.py) ----------------------


def _traffic_rows(model: str = "headroom-sim") -> list[dict]:
    """A closed loop knee 8, prompts of 20 tokens with every tenth ~600, 32-token answers."""
    rows = closed_loop_rows(
        slots=8,
        levels=(1, 2, 4, 8, 16),
        seconds_per_level=30,
        prompt_tokens=80,
        completion_tokens=32,
        model=model,
        start=NOW - timedelta(hours=2),
    )
    for i, row in enumerate(rows):
        row["prompt_tokens"] = 600 if i % 10 == 0 else 20
        row["active_tokens_at_admit"] = row["inflight_at_admit"] * 110
    return rows


def test_from_log_lengths_reproduce_the_logs_mix(tmp_path):
    store = RequestStore(tmp_path / "t.duckdb")
    rows = _traffic_rows()
    store.insert_rows(rows)
    mix = traffic_token_mix(store, "headroom-sim", NOW - timedelta(days=7), NOW)
    assert mix.requests == len(rows) and mix.per_request_tokens == pytest.approx(
        0.1 * 600 + 0.9 * 20 + 32, rel=0.05
    )
    drawn = log_lengths(store, model=None, until=NOW, seed=3, limit=400)
    assert len(drawn.pairs) == 400 and drawn == log_lengths(store, model=None, until=NOW, seed=3, limit=400)
    assert drawn.mean_prompt_tokens + drawn.mean_completion_tokens == pytest.approx(
        mix.per_request_tokens, rel=0.2
    )
    assert traffic_token_mix(store, "another-model", NOW - timedelta(days=7), NOW) is None
    with pytest.raises(ValueError, match="answered traffic requests of model 'another-model'"):
        log_lengths(store, model="another-model", until=NOW)
    store.close()


def test_the_review_never_judges_a_withheld_token_knee():
    rows = ClassFigures("default", ["a"], peak_requests=2.0, peak_tokens=1000.0, load=None)
    artefact = capacity_estimate(knee_requests=4, knee_tokens=60, knee_tokens_p95=77)
    judged = _concurrency(rows, artefact)
    assert judged["peak_over_knee_tokens"] == pytest.approx(1000 / 77, rel=1e-3)
    assert judged["binding_caliber"] == "tokens"
    withheld = _concurrency(rows, replace(artefact, token_knee_withheld="another mix"))
    # saved before the time-weighted token capacity: its knee_tokens (an admission average) read back
    saved = {k: v for k, v in artefact.to_dict().items() if k not in ("token_capacity", "knee_tokens_p95")}
    legacy = _concurrency(rows, CapacityEstimate.from_dict(saved | {"knee_tokens": 77}))
    for concurrency in (withheld, legacy):
        assert concurrency["knee_tokens"] is None and concurrency["binding_caliber"] == "requests"
        assert concurrency["token_knee_withheld"]
        report = {
            "classes": [
                {"replica_class": "default", "concurrency": concurrency, "estimate": None, "plan": {}}
            ],
            "latency": {"ttft_s": {"change_p95": None}},
            "slo": {"met": True},
            "outcomes": {"rate_limited_ratio": 0, "error_ratio": 0},
            "traffic": {"requests": 0},
            "littles_law": {"inconsistent": 0},
        }
        assert not any("tokens caliber" in a["action"] for a in recommend_actions(report))


# -- the real CLI against the simulator --------------------------------------------------------


def _probe(sim: str, tmp_path, *args: str, name: str) -> tuple[str, dict]:
    out = tmp_path / f"{name}.json"
    done = subprocess.run(
        [
            str(HEADROOM),
            "probe",
            "--url",
            sim,
            "--max-samples",
            "24",
            "--max-level-seconds",
            "10",
            "--json",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=patient(300),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_probe_with_a_quarter_of_400s_prints_the_mix_and_publishes_nothing(tmp_path):
    long_prompt = "This sentence is filler about capacity planning for the probe. " * 60
    (tmp_path / "prompts.txt").write_text(
        "Say hello.\nName a prime number.\nCount from one to five.\n" + long_prompt + "\n"
    )
    db = tmp_path / "probe.duckdb"
    with sim_process(speed=4, max_num_seqs=4, kv_cache_tokens=512) as sim:
        printed, data = _probe(
            sim,
            tmp_path,
            "--levels",
            "1,2,4",
            "--max-tokens",
            "16",
            "--prompts",
            str(tmp_path / "prompts.txt"),
            "--slo-ttft-p95",
            "2",
            "--db",
            str(db),
            name="errors",
        )
    flat = " ".join(printed.split())
    assert "outcomes per level:" in flat and "http 400" in flat
    assert "first error: HTTP 400: this model's maximum context length is 512 tokens" in flat
    assert "filler about capacity" not in printed  # the upstream message never carries our prompt
    assert "publishes nothing" in flat
    assert "recommended pool (interactive): 0: no level met the SLO" in flat
    assert 0.15 <= data["error_ratio"] <= 0.4 and data["confidence"] == "none"
    assert all(level["outcomes"].get("http 400") for level in data["levels"])
    assert data["levels"][0]["first_error"].startswith("HTTP 400: this model's maximum context length")
    store = RequestStore(db)
    try:
        assert [d.estimate for d in decisions(store, datetime.now(UTC))] in ([], [None])
        # the request log keeps our own short reason, never the upstream's text
        assert {row[0] for row in store.query("SELECT DISTINCT error FROM requests")} == {None, "HTTP 400"}
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_default_probe_beside_long_prompt_traffic_publishes_the_traffics_token_capacity(tmp_path):
    """Short probe prompts, long-prompt traffic: the token capacity is the traffic's time-weighted
    tokens per in-flight request at the probe's request knee, and from-log agrees with it."""
    traffic_db = tmp_path / "traffic.duckdb"
    store = RequestStore(traffic_db)
    store.insert_rows(_traffic_rows())
    logged = traffic_token_mix(store, "headroom-sim", NOW - timedelta(days=7), NOW)
    store.close()
    common = ("--levels", "1,2,4,8,16", "--traffic-db", str(traffic_db), "--db", str(tmp_path / "p.duckdb"))
    with sim_process(speed=4, max_num_seqs=8, kv_cache_tokens=8192) as sim:
        printed, short = _probe(sim, tmp_path, *common, "--max-tokens", "16", name="short")
        _, from_log = _probe(sim, tmp_path, *common, "--workload", "from-log", name="from-log")
    for data in (short, from_log):
        assert data["knee"]["reached"] and data["token_knee_withheld"] is None
        knee = data["knee"]["requests"]
        assert data["knee_tokens"] == min(round(knee * logged.per_inflight_tokens), 8192)
        assert data["knee_tokens"] <= data["knee_tokens_p95"] <= 8192
        assert data["max_request_tokens"] == logged.max_request_tokens
        assert data["token_capacity"]["traffic_mix"]["requests"] == logged.requests
    # the probe's own short prompts are only the admission average's evidence, not the figure
    assert short["token_capacity"]["admission_mean"] < short["knee_tokens"]
    flat = " ".join(printed.split())
    assert "tokens (time-weighted; p95" in flat and "token capacity at the knee: mean" in flat
