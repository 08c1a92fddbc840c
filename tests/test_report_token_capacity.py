"""The review's token caliber (docs/domain.md §12): a replica's peak is judged against the token
capacity's p95 (`knee_tokens_p95`), and the week's busiest minute against the recommended pool in
tokens (`recommended_pool_tokens`, the p99.9 of the active tokens with the pool in flight), never
the time-weighted mean (`knee_tokens`, the divisor for 5-minute averages) nor a pool scaled from
the knee; an estimate from before the time-weighted token capacity has its token caliber withheld
and never binds; the confidence reads in one vocabulary (a legacy "measured" is "high").

One week of traffic on one replica whose busiest five minutes are known exactly: 7 requests in
flight together, their prompts summing to 1,200 active tokens (no completion tokens, so the sum
holds still), judged against a published collector.capacity.CapacityEstimate (knee 10 requests,
pool 8, token capacity 1,000 mean / 2,000 p95, pool in tokens 1,500: not the p95 scaled to the
pool, 2,000 x 8 / 10 = 1,600).
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from collector.capacity import LEGACY_TOKEN_KNEE, CapacityEstimate, KneeResult, Slo
from collector.report.build import build_report, token_knee_withheld
from collector.report.collect import collect_inputs
from collector.report.plan import pool_per_replica
from collector.report.review import render_report
from collector.store.db import RequestStore
from collector.store.decision import Published

UNTIL = datetime(2026, 11, 30, tzinfo=UTC)
SINCE = UNTIL - timedelta(days=7)
BURST = UNTIL - timedelta(days=2)
PROMPTS = [171] * 6 + [174]  # 7 requests in flight together, 1,200 active tokens
KEY = ("m", "default")
LEGACY = LEGACY_TOKEN_KNEE  # why a legacy estimate's token capacity is withheld, as it is read back


def _rows() -> list[dict[str, Any]]:
    rows = []
    for i, prompt in enumerate(PROMPTS):
        rows.append(
            {
                "request_id": f"r{i}",
                "source": "traffic",
                "instance": "r0",
                "model": "m",
                "admitted_at": BURST,
                "first_token_at": None,
                "completed_at": BURST + timedelta(minutes=5),
                "outcome": "ok",
                "prompt_tokens": prompt,
                "completion_tokens": 0,
                "e2e_s": 300.0,
                "inflight_at_admit": i + 1,
                "active_tokens_at_admit": sum(PROMPTS[: i + 1]),
            }
        )
    return rows


# the published token figures (CapacityEstimate's properties) and the token_capacity keys they read
TOKEN_FIGURES = {
    "knee_tokens": "mean",
    "knee_tokens_p95": "p95",
    "recommended_pool_tokens": "pool_tokens",
    "max_request_tokens": "max_request_tokens",
}


def estimate(**changes: Any) -> CapacityEstimate:
    """A published estimate: knee 10 requests, pool 8, token capacity 1,000 (time-weighted mean) /
    p95 2,000, pool in tokens 1,500 (p99.9 with 8 in flight). `changes` are its fields, the knee's
    `knee_requests`, or a token figure (knee_tokens=900: its token capacity's mean is 900)."""
    tokens = {TOKEN_FIGURES[k]: changes.pop(k) for k in list(changes) if k in TOKEN_FIGURES}
    knee = KneeResult(changes.pop("knee_requests", 10), 1000, True, "", None, None, True, "")
    found = CapacityEstimate(
        model="m",
        source="probe",
        run_id="probe-1",
        profile="interactive",
        levels=[],
        knee=knee,
        slo=Slo(),
        slo_max=9,
        slo_max_tokens=None,
        recommended_pool=8,
        confidence="high",
        created_at=UNTIL - timedelta(hours=2),
        kv_capacity_tokens=8192,
        token_capacity={
            "mean": 1000,
            "p50": 950,
            "p95": 2000,
            "pool_tokens": 1500,
            "max": 2600,
            "admission_mean": 700,
            "per_inflight_tokens": 100.0,
            "traffic_requests": 500,
            "kv_capacity_tokens": 8192,
            "max_request_tokens": 900,
            "withheld": None,
            "notes": [],
        },
    )
    return replace(found, token_capacity=(found.token_capacity or {}) | tokens, **changes)


@pytest.fixture(scope="module")
def store():
    store = RequestStore()
    store.insert_rows(_rows())
    yield store
    store.close()


def review(
    store: RequestStore, published: CapacityEstimate, previous: CapacityEstimate | None = None
) -> dict[str, Any]:
    """The week's review with `published` as the class's estimate (the store has none: the
    class is the default one, and the estimate is what the decision would hand over)."""
    inputs = collect_inputs(store, SINCE, UNTIL)
    inputs.estimates = {KEY: Published(published, "probe run probe-1 (2.0 h old)")}
    inputs.previous_estimates = {KEY: Published(previous, "probe run probe-0")} if previous else {}
    return build_report(inputs)


def _entry(report: dict[str, Any]) -> dict[str, Any]:
    (model,) = report["models"]
    (entry,) = model["classes"]
    return dict(entry)


def test_the_busiest_minute_is_judged_against_the_pool_in_tokens_never_the_mean(store):
    """(a) The peak (1,200 tokens) is above the mean token capacity (1,000) but below the pool in
    tokens (1,500, the estimate's own figure, not the p95 scaled to the pool, 1,600): the requests
    caliber gives the replica count, and 7 requests fit one pool of 8, so the review says 1
    replica. Against the mean it would have said 2 (1,200 over a pool of 800), and a token-caliber
    alarm. One replica's own peak is still judged against the p95 (2,000)."""
    report = review(store, estimate())
    entry = _entry(report)
    plan, concurrency = entry["plan"], entry["concurrency"]
    assert plan["peak"]["requests"] == pytest.approx(7.0)
    assert plan["peak"]["tokens"] == pytest.approx(1200.0)
    assert 1000 < plan["peak"]["tokens"] < 1500
    assert math.ceil(1200 / (1000 * 8 / 10)) == 2  # what the mean would have said
    # the estimate's pool in tokens as it is: never rescaled from the knee's p95 (1,600)
    assert plan["pool_per_replica"] == {"requests": 8.0, "tokens": 1500.0}
    assert plan["needed"] == {"requests": 1, "tokens": 1}
    assert plan["binding_caliber"] == "requests" and plan["replicas_needed"] == 1
    # one replica's own peak (counts at admission, instants) against the p95; both figures reported
    assert (concurrency["peak_tokens"], concurrency["peak_requests"]) == (1200, 7)
    assert (concurrency["knee_tokens"], concurrency["knee_tokens_p95"]) == (1000, 2000)
    assert concurrency["peak_over_knee_tokens"] == pytest.approx(0.6)
    assert concurrency["headroom_tokens"] == pytest.approx(0.4)
    assert concurrency["binding_caliber"] == "requests" and concurrency["token_knee_withheld"] is None
    actions = report["models"][0]["actions"]
    assert not any(a["action"].startswith(("Run ", "Plan ")) for a in actions)
    assert not any("tokens caliber" in a["action"] for a in actions)
    assert entry["estimate"]["token_capacity"]["p95"] == 2000
    assert entry["estimate"]["max_request_tokens"] == 900
    md, html = render_report(report, "md"), render_report(report, "html").replace("&#x27;", "'")
    for text in (md, html):
        assert "At this week's peak you needed 1 replica of class default (you ran 1)" in text
        assert "token capacity 1,000 (time-weighted mean) / p95 2,000" in text
        assert "largest traffic request 900 tokens" in text
    row = next(line for line in md.splitlines() if line.startswith("| tokens |"))
    assert "1,000 (time-weighted mean) / p95 2,000" in row and "peak is 60 % of the p95" in row
    assert "| 1,500 |" in row  # the pool per replica: the estimate's pool in tokens
    json = orjson.loads(render_report(report, "json"))
    judged = json["models"][0]["classes"][0]["concurrency"]
    assert (judged["knee_tokens"], judged["knee_tokens_p95"]) == (1000, 2000)


def test_tokens_still_bind_past_the_pool_in_tokens_and_name_it(store):
    """The same week against a p95 of 1,100 tokens and a pool in tokens of 1,000 (not 1,100 x 8 /
    10 = 880): the busiest minute needs 2 replicas and the token caliber binds, in the plan
    (against the pool in tokens) and against one replica's peak (against the p95)."""
    report = review(store, estimate(knee_tokens=900, knee_tokens_p95=1100, recommended_pool_tokens=1000))
    entry = _entry(report)
    plan = entry["plan"]
    assert plan["pool_per_replica"]["tokens"] == pytest.approx(1000.0)
    assert plan["needed"] == {"requests": 1, "tokens": 2}
    assert plan["binding_caliber"] == "tokens" and plan["replicas_needed"] == 2
    assert entry["concurrency"]["binding_caliber"] == "tokens"  # 1,200 / 1,100 over 7 / 10
    actions = {a["action"]: a["reason"] for a in report["models"][0]["actions"]}
    assert actions["Run 2 replicas of class default at the peak (ran 1)"] == (
        "the busiest minute's tokens load 1200 over a pool of 1000 per replica"
        " (the pool in tokens: the p99.9 of the active tokens with the pool in flight)"
    )
    assert (
        "against the token capacity's p95 1100 (time-weighted mean 900): peak is 1.1 × the p95"
        in actions["Add capacity or cap admission (tokens caliber)"]
    )
    assert "busiest minute 1,200 tokens over a pool of 1,000 per replica" in render_report(report, "md")


def test_a_legacy_estimate_has_its_token_caliber_withheld_and_never_binds(store):
    """(b) An estimate saved before the time-weighted token capacity (no knee_tokens_p95, no
    token_capacity): its knee_tokens (500) was an admission average. Judged against it the peak
    would be 2.4 x the knee and the tokens caliber would bind, with 3 replicas; it is withheld
    with the reason, and the requests caliber gives 1 replica."""
    saved = {
        k: v
        for k, v in estimate().to_dict().items()
        if k not in ("knee_tokens_p95", "recommended_pool_tokens", "token_capacity", "max_request_tokens")
    }
    legacy = CapacityEstimate.from_dict(saved | {"knee_tokens": 500})  # as the store reads it back
    assert legacy.knee_tokens is None and legacy.token_capacity is None
    assert token_knee_withheld(legacy) == LEGACY
    assert token_knee_withheld(replace(legacy, source="traffic")) == LEGACY  # whoever measured it
    report = review(store, legacy)
    entry = _entry(report)
    concurrency, plan = entry["concurrency"], entry["plan"]
    assert concurrency["token_knee_withheld"] == LEGACY
    assert concurrency["knee_tokens"] is None and concurrency["knee_tokens_p95"] is None
    assert concurrency["peak_over_knee_tokens"] is None and concurrency["headroom_tokens"] is None
    assert concurrency["binding_caliber"] == "requests"
    assert plan["pool_per_replica"]["tokens"] is None and plan["needed"]["tokens"] is None
    assert plan["binding_caliber"] == "requests" and plan["replicas_needed"] == 1
    summary = entry["estimate"]
    assert summary["knee_tokens"] is None and summary["token_knee_withheld"] == LEGACY
    assert not any("tokens caliber" in a["action"] for a in report["models"][0]["actions"])
    md = render_report(report, "md")
    assert f"Binding caliber: requests (token capacity withheld: {LEGACY})" in md
    assert "Knee of class default: 10 requests (no token capacity to judge by)" in md
    assert "500" not in md.split("### Replica class")[1].split("**Recommended actions**")[0]


def test_what_withholds_a_token_capacity():
    assert token_knee_withheld(None) is None  # no estimate: nothing to withhold
    assert token_knee_withheld(estimate()) is None
    assert token_knee_withheld(estimate(knee_tokens=None, token_knee_withheld="another mix")) == "another mix"
    assert "no p95" in str(token_knee_withheld(estimate(knee_tokens_p95=None)))
    # the estimate's own reason (a reader that marked it legacy itself) is kept as it is
    assert token_knee_withheld(estimate(token_knee_withheld=LEGACY + "; again")) == LEGACY + "; again"


def test_a_legacy_measured_confidence_reads_as_high(store):
    """(c) A probe estimate saved when probes said "measured": the review, its Markdown, HTML and
    JSON say "high", for the published estimate and the one before it."""
    report = review(store, estimate(confidence="measured"), previous=estimate(confidence="measured"))
    summary = _entry(report)["estimate"]
    assert summary["confidence"] == "high" and summary["previous"]["confidence"] == "high"
    for fmt in ("md", "html", "json"):
        text = render_report(report, fmt)
        assert 'measured"' not in text and "confidence measured" not in text
    assert "confidence high" in render_report(report, "md")
    assert "confidence high" in render_report(report, "html")
    assert '"confidence": "high"' in render_report(report, "json")


def test_the_token_pool_is_the_estimates_pool_in_tokens_unscaled():
    assert pool_per_replica(estimate(), 1500) == {"requests": 8.0, "tokens": 1500.0}
    # never rescaled by pool / knee: another knee leaves the pool in tokens as it is
    assert pool_per_replica(estimate(knee_requests=16), 1500) == {"requests": 8.0, "tokens": 1500.0}
    assert pool_per_replica(estimate(), None) == {"requests": 8.0, "tokens": None}  # withheld
    assert pool_per_replica(estimate(recommended_pool=0), 1500) == {"requests": None, "tokens": None}
    assert pool_per_replica(None, 1500) == {"requests": None, "tokens": None}
