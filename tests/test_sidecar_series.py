"""The series budget, the cached /metrics page and the overhead histogram."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.sidecar import CHAT, sidecar_rig

from collector.goodput import VERDICTS
from collector.sidecar.config import SidecarConfig
from collector.sidecar.exposition import MetricsPage
from collector.sidecar.live import LiveRequest
from collector.sidecar.series import OTHER, RESERVED_SERIES, SeriesBudget, series_per_model, series_per_pair
from collector.sidecar.tracker import OUTCOMES
from collector.sidecar.wiring import build_sidecar, sidecar_state


def _now() -> tuple[float, float]:
    """(began, now) of an upstream read that took no time, for Tracker.relayed."""
    now = time.monotonic()
    return now, now


def test_series_costs_follow_the_catalog():
    assert series_per_pair() == 5 + len(OUTCOMES) + len(VERDICTS) == 18
    # TTFT and TPOT, the engine's queue, prefill and decode (11 buckets), a duration per outcome,
    # and the engine's two prompt-token counters
    assert series_per_model() == (19 + 3) + (16 + 3) + 3 * (11 + 3) + len(OUTCOMES) * (19 + 3) + 2 == 239


@pytest.mark.parametrize(
    "max_series, max_models, max_tenants, models, tenants, expect_models, expect_tenants",
    [
        (3000, 20, 50, 1, 500, 1, 50),  # the tenant cap binds first
        (3000, 20, 500, 1, 500, 1, 119),  # then the budget: (3000 - 300 - 271 - 271) // 18
        (3000, 20, 50, 30, 1, 8, 1),  # eight models, a tenant each: (3000 - 300 - 271) // (271 + 18)
        (3000, 3, 50, 30, 1, 3, 1),  # the model cap
        (15_000, 40, 5000, 40, 1, 40, 1),  # a bigger budget: the caps bind
    ],
)
def test_budget_admits_what_fits_and_folds_the_rest(
    max_series, max_models, max_tenants, models, tenants, expect_models, expect_tenants
):
    budget = SeriesBudget(max_series, max_models=max_models, max_tenants=max_tenants)
    labels = {budget.labels(f"m{m}", f"t{t}") for m in range(models) for t in range(tenants)}
    assert len({model for model, _ in labels} - {OTHER}) == expect_models
    assert len({tenant for _, tenant in labels} - {OTHER}) == expect_tenants
    assert budget.left >= 0
    assert budget.folded["model"] == (models - expect_models) * tenants


def test_admitted_values_stay_admitted_and_other_is_never_charged():
    budget = SeriesBudget(1000, max_models=5, max_tenants=5)
    assert budget.labels("m", "a") == ("m", "a")
    left = budget.left
    for _ in range(3):
        assert budget.labels("m", "a") == ("m", "a")
        assert budget.labels(OTHER, OTHER) == (OTHER, OTHER)
        assert budget.labels("m", OTHER) == ("m", OTHER)
    assert budget.left == left and set(budget.folded.values()) == {0}


def test_a_budget_smaller_than_the_fixed_part_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--max-series 400 is below the 571 series"):
        SeriesBudget(400)
    with pytest.raises(ValueError, match="--max-series"):
        build_sidecar(
            SidecarConfig(
                upstream="http://127.0.0.1:9", db_path=None, engine="none", jobs=False, max_series=100
            )
        )


def _series(text: bytes) -> dict[tuple, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def _traffic(tracker, requests: int, rng: random.Random) -> None:
    """Half the requests from 10 hot models x 300 tenants, half from all 5,000 x 10,000."""
    for i in range(requests):
        hot = i % 2 == 0
        request = LiveRequest(
            f"model-{rng.randrange(10 if hot else 5000)}",
            f"tenant-{rng.randrange(300 if hot else 10_000)}",
            "/v1/chat/completions",
            True,
            64,
            40,
        )
        tracker.admit(request)
        tracker.relayed(request, 2, *_now())
        if i % 3:
            tracker.finish(request, OUTCOMES[i % len(OUTCOMES)])
        if i % 7 == 0:
            tracker.retried(request, "ServerDisconnectedError")


def test_ten_thousand_tenants_by_five_thousand_models_never_pass_the_budget():
    app = build_sidecar(SidecarConfig(upstream="http://127.0.0.1:9", db_path=None, engine="none", jobs=False))
    tracker = sidecar_state(app).tracker
    page = MetricsPage(sidecar_state(app).registry, [tracker.exported])
    rng = random.Random(13)
    sizes = []
    for _ in range(12):
        _traffic(tracker, 2500, rng)
        sizes.append(len(_series(asyncio.run(page.render()))))
    assert max(sizes) <= 3000 - RESERVED_SERIES  # what the sidecar itself adds stays in its share
    assert sizes[-1] >= 1200  # the budget is used, not folded away from the start
    assert tracker.budget.folded["model"] > 20_000 and tracker.budget.folded["tenant"] > 0
    # a model admitted early keeps its own series; everything folded lands in `other`
    labels = {dict(labels).get("model") for name, labels in _series(asyncio.run(page.render()))}
    assert OTHER in labels and 1 <= len(labels - {None, OTHER}) <= 8


def test_the_page_renders_what_the_registry_collects_and_reuses_untouched_text():
    app = build_sidecar(SidecarConfig(upstream="http://127.0.0.1:9", db_path=None, engine="none", jobs=False))
    tracker = sidecar_state(app).tracker
    page = MetricsPage(sidecar_state(app).registry, [tracker.exported])
    _traffic(tracker, 400, random.Random(5))
    clocked = ("source_scrape", "oldest_age")  # read at the moment of each render
    ours = lambda text: {k: v for k, v in _series(text).items() if not any(c in k[0] for c in clocked)}  # noqa: E731
    assert ours(asyncio.run(page.render())) == ours(generate_latest(sidecar_state(app).registry))
    child = next(iter(tracker.duration.children.values()))
    untouched = next(iter(tracker.requests.children.values()))
    before = (child.text(), untouched.text())
    child.observe(0.2)
    asyncio.run(page.render())
    assert child.text() != before[0]  # updated: rendered again
    assert untouched.text() is before[1]  # not updated: the same string object, not rebuilt


def test_hostile_tenant_values_are_escaped_in_the_exposition(tmp_path):
    tenant = 'a"b\\c} x{="'
    with sidecar_rig(tmp_path) as rig:
        httpx.post(rig.url + "/v1/chat/completions", json=CHAT, headers={"X-Tenant-ID": tenant})
        metrics = rig.metrics()
    key = (("model", "m1"), ("outcome", "ok"), ("source", "traffic"), ("tenant", tenant))
    assert metrics[("headroom_requests_total", key)] == 1


def test_overhead_histogram_counts_every_request_with_the_sidecars_own_time(tmp_path):
    with sidecar_rig(tmp_path) as rig:
        with httpx.Client() as client:
            for i in range(6):
                client.post(rig.url + "/v1/chat/completions", json={**CHAT, "stream": i % 2 == 0})
        metrics = rig.metrics()
        e2e = sum(row["e2e_s"] for row in rig.rows())
    count = metrics[("headroom_proxy_overhead_seconds_count", ())]
    total = metrics[("headroom_proxy_overhead_seconds_sum", ())]
    assert count == 6
    assert 0 < total < e2e  # some time of its own, less than the requests took in all


def test_the_upstream_connection_limit_is_a_flag_that_reaches_the_pool():
    from click.testing import CliRunner

    from collector.sidecar.app import _pool
    from collector.sidecar.cli import run

    config = SidecarConfig(upstream="http://127.0.0.1:9", engine="none", db_path=None, max_connections=7)
    assert _pool(config, config.max_connections).max_connections == 7
    with pytest.raises(ValueError, match="--max-upstream-connections must be at least 1, got 0"):
        SidecarConfig(upstream="http://127.0.0.1:9", max_connections=0)
    result = CliRunner().invoke(run, ["--upstream", "http://127.0.0.1:9", "--max-upstream-connections", "0"])
    assert result.exit_code == 2 and "--max-upstream-connections" in result.output
    assert "--max-upstream-connections" in CliRunner().invoke(run, ["--help"]).output


def test_checkpoint_mb_is_a_positive_flag_of_run():
    from click.testing import CliRunner

    from collector.sidecar.cli import run

    with pytest.raises(ValueError, match="--checkpoint-mb must be at least 1, got 0"):
        SidecarConfig(upstream="http://127.0.0.1:9", checkpoint_mb=0)
    result = CliRunner().invoke(run, ["--upstream", "http://127.0.0.1:9", "--checkpoint-mb", "0"])
    assert result.exit_code == 2 and "--checkpoint-mb" in result.output
    assert "--checkpoint-mb MB" in CliRunner().invoke(run, ["--help"]).output


def test_probe_load_is_labelled_source_probe_and_its_row_keeps_its_source(tmp_path):
    with sidecar_rig(tmp_path) as rig:
        probe = rig.probe_marks("probe-run", **{"X-Tenant-ID": "headroom-probe"})
        httpx.post(rig.url + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=probe)
        httpx.post(rig.url + "/v1/chat/completions", json={**CHAT, "stream": True})
        metrics = rig.metrics()
        rows = rig.rows()
    by_source = {
        dict(labels)["source"]: value
        for (name, labels), value in metrics.items()
        if name == "headroom_time_to_first_token_seconds_count"
    }
    assert by_source == {"probe": 1, "traffic": 1}
    probe_key = (("model", "m1"), ("outcome", "ok"), ("source", "probe"), ("tenant", "headroom-probe"))
    assert metrics[("headroom_requests_total", probe_key)] == 1
    assert sorted(row["source"] for row in rows) == ["probe", "traffic"]


def test_probe_series_are_charged_when_they_appear_and_never_folded_into_traffic():
    budget = SeriesBudget(2000)
    model, tenant = budget.labels("m", "headroom-probe")
    assert budget.source_label(model, tenant, "traffic") == "traffic"  # in the model's reservation
    left = budget.left
    assert budget.source_label(model, tenant, "probe") == "probe"
    assert left - budget.left == series_per_model() + len(OUTCOMES)  # its histograms and counters again
    assert budget.source_label(model, tenant, "probe") == "probe" and budget.left == left - (
        series_per_model() + len(OUTCOMES)
    )
    budget.left = 0  # full: probe load of a new model is not exported at all
    assert budget.source_label("m2", tenant, "probe") is None
    assert budget.folded["source"] == 1
