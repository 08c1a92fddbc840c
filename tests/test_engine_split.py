"""The engine's own account of the traffic (collector.analysis.engine_split): passive V_P, the
prefix-cache hit rate, where TTFT went and goodput, per model and replica class, from rows a test
writes into a real DuckDB; and `headroom capacity split` over a file."""

from __future__ import annotations

import json
import statistics
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from collector.analysis.engine_split import NO_TIMINGS, PrefillRate, engine_split, prefill_rate
from collector.analysis.passive_rate import passive_rate
from collector.cli import main
from collector.record import RequestRecord
from collector.store.db import RequestStore

START = datetime(2026, 3, 2, 9, tzinfo=UTC)
HOUR = timedelta(hours=1)
_ids = iter(range(1_000_000))


def _row(**fields: object) -> RequestRecord:
    """A streamed, answered, met traffic row of class `a` admitted at START + `at` seconds."""
    at = float(fields.pop("at", 1.0))  # type: ignore[arg-type]
    admitted = START + timedelta(seconds=at)
    base: dict[str, object] = {
        "request_id": f"r{next(_ids)}",
        "source": "traffic",
        "model": "m",
        "replica_class": "a",
        "stream": True,
        "outcome": "ok",
        "status_code": 200,
        "verdict": "met",
        "admitted_at": admitted,
        "completed_at": admitted + timedelta(seconds=2),
        "ttft_s": 0.5,
        "e2e_s": 2.0,
        "completion_tokens": 10,
    }
    return RequestRecord(**(base | fields))  # type: ignore[arg-type]


def _llamacpp(computed: int, prefill_s: float, cached: int | None = 0, **fields: object) -> RequestRecord:
    said = {
        "engine_timings": "llamacpp",
        "engine_prompt_computed": computed,
        "engine_prefill_s": prefill_s,
        "engine_prompt_cached": cached,
    }
    return _row(**(said | fields))


def _split(rows: list[RequestRecord], **options: object):
    store = RequestStore()
    try:
        store.insert_rows(rows)
        return engine_split(store, START, START + HOUR, **options)  # type: ignore[arg-type]
    finally:
        store.close()


def test_v_p_is_the_sum_of_tokens_over_the_sum_of_prefill_never_a_mean_of_rates():
    rows = [
        _llamacpp(100, 0.1),  # 1,000 tokens/s
        _llamacpp(3000, 1.0),  # 3,000 tokens/s
        _row(),  # no engine timings: counted in the rows only
        _llamacpp(1, 10.0, source="probe"),  # the probe's load is not the traffic's
        _llamacpp(5, 10.0, engine_prefill_s=None),  # no prefill said: no rate from it
        _llamacpp(7, 10.0, at=HOUR.total_seconds() + 1),  # after the window
    ]
    (group,) = _split(rows).groups
    p = group.prefill
    assert (p.requests, p.computed_tokens, p.prefill_s) == (2, 3100, pytest.approx(1.1))
    assert p.tokens_per_s == pytest.approx(3100 / 1.1, rel=1e-12)  # 2,818.18
    assert p.tokens_per_s != pytest.approx(statistics.fmean([1000, 3000]))
    assert (p.rows, p.timed_rows, p.timed_share) == (4, 3, 0.75)
    assert group.engines == ("llamacpp",) and group.no_timings is None


def test_cache_hit_rate_is_zero_for_new_prompts_and_the_cached_share_otherwise():
    rows = [
        _llamacpp(500, 0.5, cached=0, replica_class="fresh"),
        _llamacpp(300, 0.3, cached=None, replica_class="fresh"),  # not said: none from the cache
        _llamacpp(100, 0.1, cached=900, replica_class="warm"),  # 90 % from the cache
        _llamacpp(300, 0.2, cached=100, replica_class="warm"),  # 25 %
    ]
    by_class = {g.replica_class: g.prefill for g in _split(rows).groups}
    assert by_class["fresh"].cache_hit_rate == 0.0
    assert by_class["warm"].cache_hit_rate == pytest.approx(1000 / 1400)  # 0.714, not the mean 0.575
    assert by_class["warm"].cached_tokens == 1000 and by_class["warm"].computed_tokens == 400
    assert by_class["warm"].tokens_per_s == pytest.approx(400 / 0.3)


def test_the_split_parts_add_up_to_ttft_over_streamed_answered_rows_only():
    parts = [  # (ttft, hop, queue, prefill): a vLLM-like rest, from 0.0 s to 0.1 s
        (1.0, 0.01, 0.30, 0.60),
        (0.5, 0.02, 0.05, 0.40),
        (2.0, 0.01, 1.20, 0.70),
        (0.8, 0.03, 0.10, 0.67),
    ]
    rows = [
        _row(
            ttft_s=ttft,
            sidecar_hop_s=hop,
            engine_queue_s=queue,
            engine_prefill_s=prefill,
            engine_timings="vllm",
            engine_prompt_computed=100,
        )
        for ttft, hop, queue, prefill in parts
    ]
    left_out = dict(
        sidecar_hop_s=9.0, engine_queue_s=9.0, engine_prefill_s=9.0, ttft_s=30.0, engine_timings="vllm"
    )
    rows += [
        _row(stream=False, **left_out),  # not streamed: a client saw no first token
        _row(outcome="upstream_error", verdict="error", **left_out),
        _row(sidecar_hop_s=0.01, engine_timings="vllm"),  # no queue or prefill said
    ]
    (group,) = _split(rows).groups
    split = group.split
    assert split.requests == 4
    means = [split.hop.mean_s, split.queue.mean_s, split.prefill.mean_s, split.rest.mean_s]
    assert sum(means) == pytest.approx(split.ttft.mean_s, rel=1e-12)
    assert split.ttft.mean_s == pytest.approx(statistics.fmean(p[0] for p in parts))
    rests = [t - h - q - p for t, h, q, p in parts]
    assert split.rest.mean_s == pytest.approx(statistics.fmean(rests))
    assert split.rest.p50_s == pytest.approx(statistics.median(rests))
    assert split.queue.p50_s == pytest.approx(statistics.median(p[2] for p in parts))
    # quantile_cont over 4 values: p95 at position 2.85 of the sorted queues 0.05, 0.1, 0.3, 1.2
    assert split.queue.p95_s == pytest.approx(0.3 + 0.85 * (1.2 - 0.3))


def test_attainment_leaves_invalid_out_and_goodput_is_met_per_second_of_the_window():
    verdicts = ["met"] * 3 + ["missed", "shed", "aborted", "error"] + ["invalid"] * 5
    rows = [_row(verdict=v, completion_tokens=40) for v in verdicts] + [_row(verdict=None)]
    found = _split(rows)
    (group,) = found.groups
    g = group.goodput
    assert found.window_s == 3600.0 and g.window_s == 3600.0
    assert dict(g.counts) == {"met": 3, "missed": 1, "shed": 1, "aborted": 1, "error": 1, "invalid": 5}
    assert g.unjudged == 1
    assert g.attainment == pytest.approx(3 / 7)  # not 3 / 12 (invalid counted) nor 3 / 13
    assert g.met_per_s == pytest.approx(3 / 3600)
    assert g.good_tokens_per_s == pytest.approx(3 * 40 / 3600)


def test_replica_classes_and_models_are_kept_apart_and_pool_as_sums():
    rows = [
        _llamacpp(1000, 1.0, replica_class="h100"),
        _llamacpp(4000, 1.0, replica_class="h100"),
        _llamacpp(300, 1.0, replica_class="l40s"),
        _llamacpp(200, 1.0, replica_class=None),  # the class not decided yet: the default class
        _llamacpp(9000, 1.0, model="other"),
    ]
    found = _split(rows)
    rates = {(g.model, g.replica_class): g.prefill.tokens_per_s for g in found.groups}
    assert rates == {
        ("m", "default"): 200.0,
        ("m", "h100"): 2500.0,
        ("m", "l40s"): 300.0,
        ("other", "a"): 9000.0,
    }
    (only,) = _split(rows, model="m", replica_class="l40s").groups
    assert (only.replica_class, only.prefill.rows) == ("l40s", 1)
    mine = [g.prefill for g in found.groups if g.model == "m"]
    assert PrefillRate.pooled(mine).tokens_per_s == pytest.approx(5500 / 4)  # Σ / Σ again
    store = RequestStore()
    store.insert_rows(rows)
    assert prefill_rate(store, START, START + HOUR, model="m") == PrefillRate.pooled(mine)
    store.close()


def test_rows_without_engine_timings_say_why_and_no_rate():
    (group,) = _split([_row(), _row(verdict="missed")]).groups
    assert group.no_timings == NO_TIMINGS and "--enable-per-request-metrics" in NO_TIMINGS
    assert (group.prefill.tokens_per_s, group.prefill.cache_hit_rate, group.split.requests) == (None, None, 0)
    assert group.goodput.attainment == 0.5  # goodput needs no engine timings


def test_passive_rate_carries_the_engine_prefill_rate_as_evidence_beside_mu():
    rows = [_llamacpp(1000, 0.5, inflight_at_admit=1, at=i) for i in range(4)]
    found = passive_rate([r.as_row() for r in rows], START, START + HOUR)
    section = found.to_dict()
    assert found.mu_per_s is None  # four rows: no μ, and the engine's V_P does not make one
    assert section["engine_prefill_tokens_per_s"] == 2000.0
    assert section["engine_prefill"]["requests"] == 4 and section["engine_prefill"]["timed_share"] == 1.0


def test_the_command_prints_the_split_and_writes_the_same_as_json(tmp_path):
    path = tmp_path / "log.duckdb"
    store = RequestStore(path)
    store.insert_rows([_llamacpp(100, 0.1), _llamacpp(3000, 1.0), _row(replica_class="blind")])
    store.close()
    window = ["--since", START.isoformat(), "--until", (START + HOUR).isoformat()]
    result = CliRunner().invoke(main, ["capacity", "split", "--db", str(path), *window, "--json", "-"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    by_class = {g["replica_class"]: g for g in data["groups"]}
    assert by_class["a"]["prefill"]["prefill_tokens_per_s"] == pytest.approx(3100 / 1.1)
    assert by_class["a"]["published"] is None and by_class["blind"]["no_timings"] == NO_TIMINGS
    text = CliRunner().invoke(main, ["capacity", "split", "--db", str(path), *window]).output
    assert "V_P 2,818 prefill tokens/s" in text and NO_TIMINGS in text
    assert "attainment 100.0 %" in text
    help_text = CliRunner().invoke(main, ["capacity", "split", "--help"]).output
    assert "headroom capacity split --db headroom.duckdb" in help_text
