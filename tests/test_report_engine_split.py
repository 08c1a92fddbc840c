"""The review's "Where TTFT went" and "Goodput": the engine's own account per replica class, the
passive V_P beside the published one, and an honest line where the engine said nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from support.estimates import capacity_estimate

from collector.analysis.engine_split import NO_TIMINGS, engine_split
from collector.record import RequestRecord
from collector.report.build import build_report
from collector.report.collect import collect_inputs
from collector.report.review import render_report
from collector.store.db import RequestStore
from collector.store.estimates import save_estimate

START = datetime(2026, 3, 2, 9, tzinfo=UTC)
DAY = timedelta(days=1)


def _row(i: int, replica_class: str, **fields: object) -> RequestRecord:
    admitted = START + timedelta(minutes=i)
    base: dict[str, object] = {
        "request_id": f"{replica_class}-{i}",
        "source": "traffic",
        "model": "m",
        "instance": f"sidecar-{replica_class}",
        "replica_class": replica_class,
        "stream": True,
        "outcome": "ok",
        "status_code": 200,
        "verdict": "met",
        "admitted_at": admitted,
        "first_token_at": admitted + timedelta(seconds=0.5),
        "completed_at": admitted + timedelta(seconds=2),
        "ttft_s": 0.5,
        "e2e_s": 2.0,
        "prompt_tokens": 1000,
        "completion_tokens": 20,
        "inflight_at_admit": 1,
        "active_tokens_at_admit": 1020,
    }
    return RequestRecord(**(base | fields))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def report():
    store = RequestStore()
    timed = {
        "engine_timings": "llamacpp",
        "sidecar_hop_s": 0.02,
        "engine_queue_s": 0.08,
        "engine_prefill_s": 0.4,
        "engine_prompt_cached": 200,
    }
    rows = [_row(i, "a", engine_prompt_computed=800, **timed) for i in range(10)]
    rows += [_row(10, "a", verdict="invalid", outcome="bad_request", status_code=400)]
    rows += [_row(11, "a", verdict="shed", outcome="overloaded", status_code=503)]
    rows += [_row(i, "blind", verdict="missed" if i % 2 else "met") for i in range(4)]
    store.insert_rows(rows)
    estimate = capacity_estimate(
        "m", run_id="run-1", knee_requests=8, replica_class="a", prefill_tokens_per_s=3000.0, created_at=START
    )
    save_estimate(store, estimate)
    inputs = collect_inputs(store, START, START + DAY)
    direct = engine_split(store, START, START + DAY)
    store.close()
    return build_report(inputs), direct


def test_the_review_carries_the_split_per_class_with_the_published_v_p_beside(report):
    built, direct = report
    (model,) = built["models"]
    entries = {e["replica_class"]: e for e in model["engine_split"]}
    assert [e["replica_class"] for e in model["engine_split"]] == ["a", "blind"]
    a = entries["a"]
    assert a["prefill"]["prefill_tokens_per_s"] == pytest.approx(8000 / 4.0)  # Σ 8,000 tokens / Σ 4 s
    assert a["prefill"]["cache_hit_rate"] == pytest.approx(0.2)
    assert a["published"] == {"prefill_tokens_per_s": 3000.0, "source": "probe", "run_id": "run-1"}
    split = a["split"]
    assert split["requests"] == 10 and split["rest"]["mean_s"] == pytest.approx(0.0)
    parts = sum(split[p]["mean_s"] for p in ("hop", "queue", "prefill", "rest"))
    assert parts == pytest.approx(split["ttft"]["mean_s"])
    assert a["goodput"]["attainment"] == pytest.approx(10 / 11)  # the invalid request left out
    assert a["goodput"]["met_per_s"] == pytest.approx(10 / 86400)
    assert entries["blind"]["no_timings"] == NO_TIMINGS and entries["blind"]["published"] is None
    assert entries["blind"]["goodput"]["verdicts"]["missed"] == 2
    # one path: the review's figures are the analysis' own
    assert model["engine_split"] == [
        g.to_dict() | {"published": entries[g.replica_class]["published"]} for g in direct.groups
    ]


def test_markdown_and_html_show_where_ttft_went_and_goodput(report):
    built, _ = report
    md = render_report(built, "md")
    assert "### Where TTFT went" in md and "### Goodput" in md
    assert "| a | 10 | 0.020 / 0.020 | 0.080 / 0.080 | 0.400 / 0.400 | 0 / 0 | 0.500 / 0.500 | 20.0 % |" in md
    assert "Class a: passive V_P 2,000 prefill tokens/s" in md
    assert "the published V_P is 3,000 (probe run run-1)" in md
    assert f"Class blind: {NO_TIMINGS}" in md
    assert "| a | 0.0001 | 0.0 | 90.9 % | 10 | 0 | 1 | 0 | 0 | 1 | 0 |" in md
    html = render_report(built, "html")
    assert "<h3>Where TTFT went</h3>" in html and "<h3>Goodput</h3>" in html
    assert "vLLM needs --enable-per-request-metrics" in html
