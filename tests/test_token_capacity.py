"""The token caliber's capacity is in the gauge's own units (#46, docs/capacity.md "Token capacity").

The pinned definition: a closed loop at the knee where one prompt in ten is ~600 tokens and lives
3x longer, replayed event by event through the sidecar's own accounting (collector.inflight.Inflight,
what headroom_active_tokens reads). The published token capacity (from the rows alone) agrees with
the gauge's time average within 5 %; the average taken at admissions (what active_tokens_at_admit
records, the old knee's unit) does not. Then the store path, the gates, the estimate and the gauges.
"""

from __future__ import annotations

import heapq
import random
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support.synthetic import closed_loop_rows

from collector.analysis.estimate import build_estimate, estimate_probe_run, probe_levels
from collector.analysis.token_knee import (
    MIN_TRAFFIC_REQUESTS,
    Held,
    token_capacity,
    token_mix_of,
    traffic_token_mix,
)
from collector.capacity import LEGACY_TOKEN_KNEE, CapacityEstimate
from collector.inflight import Inflight
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore

SHORT = Held(1.0, 20, 30, 0.1)  # nine in ten
LONG = Held(3.0, 600, 40, 0.5)  # one in ten: a ~600-token prompt that stays 3x longer


def _closed_loop(level: int, seconds: float, seed: int = 7) -> tuple[list[Held], float, float, list[int]]:
    """`level` slots serving back to back for `seconds`, one LONG in ten, replayed through Inflight.

    Returns the requests, the gauge's time average and its p95 (tokens sampled every 10 ms, as
    a scrape would), and active tokens at each admission (the sidecar's active_tokens_at_admit).
    """
    rng = random.Random(seed)
    events: list[tuple[float, int, str, int]] = []  # (time, order, kind, tokens)
    served: list[Held] = []
    order = 0
    for _slot in range(level):
        t = rng.random()  # slots out of phase
        while t < seconds:
            held = LONG if rng.random() < 0.1 else SHORT
            served.append(held)
            events.append((t, order, "admit", held.prompt_tokens))
            first = t + held.ttft_s
            step = held.generating_s / held.completion_tokens
            for k in range(held.completion_tokens):
                events.append((first + k * step, order, "token", 1))
            t += held.duration_s
            events.append((t, order, "release", held.prompt_tokens + held.completion_tokens))
            order += 1
    heapq.heapify(events)
    load, admitted, samples = Inflight(), [], []
    grid, warm = 0.0, 5.0  # the first seconds fill the slots; the gauge is read after them
    while events:
        at, _, kind, tokens = heapq.heappop(events)
        while grid < at and grid < seconds:
            if grid >= warm:
                samples.append(load.tokens)
            grid += 0.01
        if kind == "admit":
            _, active = load.admit(tokens)
            if at >= warm:
                admitted.append(active)
        elif kind == "token":
            load.generated(tokens)
        else:
            load.release(tokens)
    samples.sort()
    return served, sum(samples) / len(samples), samples[int(0.95 * len(samples))], admitted


def test_the_published_token_capacity_is_the_gauges_time_average_and_the_admission_average_is_not():
    knee = 4
    served, gauge_mean, gauge_p95, admitted = _closed_loop(knee, seconds=1200.0)
    mix = token_mix_of(served)
    assert mix is not None and mix.requests > MIN_TRAFFIC_REQUESTS
    published = token_capacity(knee, mix)
    assert published.mean == pytest.approx(gauge_mean, rel=0.05)
    assert published.p95 == pytest.approx(gauge_p95, rel=0.10)
    assert published.p50 <= published.mean * 1.2 and published.p95 <= published.max
    # the inspection paradox: long prompts live longer, so admissions undercount them
    # (here 620 at admissions, 436 as knee x tokens per request, against the gauge's 720)
    admission_mean = sum(admitted) / len(admitted)
    per_admission = knee * mix.per_request_tokens
    assert admission_mean < 0.9 * gauge_mean and per_admission < 0.7 * gauge_mean
    assert mix.per_inflight_tokens > 1.5 * mix.per_request_tokens


def test_the_mix_of_equal_requests_is_the_same_either_way():
    same = token_mix_of([Held(2.0, 100, 50, 0.0)] * 60)
    # one kind of request: time-weighted = prompt + half the completion on average
    assert same.per_inflight_tokens == pytest.approx(125.0)
    assert token_capacity(8, same).mean == 1000
    # eight requests each holding 100..150 uniformly: sd sqrt(8) x 50 / sqrt(12), p95 = mean + 1.645 sd
    assert token_capacity(8, same).p95 == pytest.approx(1000 + 1.645 * 8**0.5 * 50 / 12**0.5, rel=0.01)


def test_the_module_example_holds():
    mix = token_mix_of([SHORT] * 9 + [LONG])
    assert round(mix.per_inflight_tokens) == 179 and round(mix.per_request_tokens) == 109
    assert token_capacity(4, token_mix_of(([SHORT] * 9 + [LONG]) * 6), kv_capacity_tokens=4096).mean == 717


def test_too_little_traffic_or_no_knee_withholds_every_token_figure():
    few = token_mix_of([SHORT] * (MIN_TRAFFIC_REQUESTS - 1))
    for capacity in (token_capacity(4, few), token_capacity(4, None), token_capacity(4, few, reached=False)):
        assert capacity.mean is capacity.p95 is capacity.max is None and capacity.withheld
        assert capacity.per_request(3) is None
    assert f"{MIN_TRAFFIC_REQUESTS - 1} answered traffic requests" in token_capacity(4, few).withheld
    assert "not reached" in token_capacity(4, few, reached=False).withheld


def test_every_figure_is_capped_at_the_kv_capacity():
    mix = token_mix_of([SHORT] * 90 + [LONG] * 10)
    capped = token_capacity(64, mix, kv_capacity_tokens=4096)
    assert capped.mean == capped.p95 == capped.max == 4096
    assert any("KV capacity (4096 tokens)" in note for note in capped.notes)
    assert capped.per_request(63) == 4096 and capped.per_request(2) == round(2 * mix.per_inflight_tokens)
    assert capped.max_request_tokens == 640


NOW = datetime.now(UTC).replace(microsecond=0)


def _traffic(store: RequestStore, start: datetime) -> list[dict]:
    """Closed-loop traffic, knee 8, with every tenth prompt 600 tokens; the rows as stored."""
    rows = closed_loop_rows(slots=8, levels=(1, 2, 4, 8), seconds_per_level=30, start=start, model="m")
    for i, row in enumerate(rows):
        row["prompt_tokens"] = 600 if i % 10 == 0 else 20
        row["task_class"] = "long" if i % 10 == 0 else "short"
    store.insert_rows(rows)
    return rows


def test_the_store_computes_the_same_mix_as_the_rows(tmp_path):
    store = RequestStore(tmp_path / "t.duckdb")
    rows = _traffic(store, NOW - timedelta(hours=3))
    held = [Held(r["e2e_s"], r["prompt_tokens"], r["completion_tokens"], r["ttft_s"]) for r in rows]
    expected = token_mix_of(held)
    found = traffic_token_mix(store, "m", NOW - timedelta(days=7), NOW)
    assert found.requests == len(rows) and found.max_request_tokens == 650
    assert found.per_inflight_tokens == pytest.approx(expected.per_inflight_tokens, rel=1e-6)
    assert found.per_request_tokens == pytest.approx(expected.per_request_tokens, rel=1e-6)
    assert len(found.sample) == len(rows)
    short = traffic_token_mix(store, "m", NOW - timedelta(days=7), NOW, task_class="short")
    assert short.max_request_tokens == 70
    assert traffic_token_mix(store, "other", NOW - timedelta(days=7), NOW) is None
    store.close()


def test_the_default_probe_beside_logged_traffic_publishes_a_token_capacity(tmp_path):
    """A probe with its own short prompts: the request knee is its, the tokens are the traffic's."""
    store = RequestStore(tmp_path / "t.duckdb")
    _traffic(store, NOW - timedelta(hours=3))
    probe = closed_loop_rows(
        slots=4, levels=(1, 2, 4, 8), seconds_per_level=20, source="probe", run_id="p1", start=NOW, model="m"
    )
    store.insert_rows(probe)
    estimate = estimate_probe_run(store, "p1", slo_ttft_p95_s=10.0)
    mix = traffic_token_mix(store, "m", NOW - timedelta(days=7), NOW)
    assert estimate.knee.requests == 4 and estimate.token_knee_withheld is None
    assert estimate.knee_tokens == round(4 * mix.per_inflight_tokens)
    assert estimate.knee_tokens_p95 >= estimate.knee_tokens
    assert estimate.max_request_tokens == 650
    assert estimate.slo_max_tokens == round(estimate.slo_max * mix.per_inflight_tokens)
    assert estimate.confidence == "high"
    data = estimate.to_dict()
    assert data["token_capacity"]["admission_mean"] == estimate.knee.tokens  # kept, to show the gap
    again = CapacityEstimate.from_dict(data)
    assert (again.knee_tokens, again.knee_tokens_p95) == (estimate.knee_tokens, estimate.knee_tokens_p95)
    gauges = CapacityGauges()
    gauges.replace([again])
    registry = CollectorRegistry()
    registry.register(gauges)
    text = generate_latest(registry).decode()
    assert "headroom_capacity_knee_tokens_p95{" in text and 'confidence="high"' in text
    store.close()


def test_without_traffic_the_token_figures_are_withheld_with_the_slo_max(tmp_path):
    store = RequestStore(tmp_path / "t.duckdb")
    probe = closed_loop_rows(slots=4, levels=(1, 2, 4, 8), seconds_per_level=20, source="probe", run_id="p")
    store.insert_rows(probe)
    estimate = estimate_probe_run(store, "p", slo_ttft_p95_s=10.0)
    assert estimate.slo_max and estimate.slo_max_tokens is None
    assert estimate.knee_tokens is estimate.knee_tokens_p95 is None
    assert "0 answered traffic requests" in estimate.token_knee_withheld
    gauges = CapacityGauges()
    gauges.replace([estimate])
    registry = CollectorRegistry()
    registry.register(gauges)
    text = generate_latest(registry).decode()
    assert "headroom_capacity_knee_requests{" in text and "_tokens{" not in text
    store.close()


def test_an_estimate_from_before_the_definition_publishes_no_token_figure():
    estimate = build_estimate(
        probe_levels(closed_loop_rows(slots=4, levels=(1, 2, 4, 8), run_id="x")), model="m"
    )
    legacy = estimate.to_dict()
    for key in ("token_capacity", "knee_tokens_p95", "max_request_tokens", "token_knee_withheld"):
        legacy.pop(key)
    legacy |= {"knee_tokens": 77, "confidence": "measured"}
    read = CapacityEstimate.from_dict(legacy)
    assert read.knee_tokens is None and read.token_knee_withheld == LEGACY_TOKEN_KNEE
    assert read.confidence == "high" and read.labels[-1] == "high"


def test_the_mix_is_in_the_gauges_own_count_where_the_row_has_it(tmp_path):
    """The sidecar's estimate (chars/4 at admission, chunks while relaying) is what the gauge held;
    the engine's usage can differ by 25 % either way. W takes the held counts, the largest request
    the larger of both."""
    store = RequestStore(tmp_path / "t.duckdb")
    rows = _traffic(store, NOW - timedelta(hours=3))
    usage = traffic_token_mix(store, "m", NOW - timedelta(days=7), NOW)
    store.execute("DELETE FROM requests")
    for row in rows:
        row["held_prompt_tokens"] = round(row["prompt_tokens"] * 1.33)  # chars/4 over a 5.3-char tokenizer
        row["held_generated_tokens"] = row["completion_tokens"]
    store.insert_rows(rows)
    held = traffic_token_mix(store, "m", NOW - timedelta(days=7), NOW)
    expected = token_mix_of(
        [Held(r["e2e_s"], r["held_prompt_tokens"], r["completion_tokens"], r["ttft_s"]) for r in rows]
    )
    assert held.per_inflight_tokens == pytest.approx(expected.per_inflight_tokens, rel=1e-6)
    assert held.per_inflight_tokens > 1.2 * usage.per_inflight_tokens
    assert held.max_request_tokens == 798 + 50  # 600 x 1.33 held, larger than the usage's 650
    store.close()
