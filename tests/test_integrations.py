"""`headroom integrations`: KEDA, Inference Gateway and llm-d settings rendered from a stored estimate."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml
from click.testing import CliRunner
from support.promql import promql_expr_test
from test_analysis_estimate import _estimate

from collector.capacity import LEGACY_TOKEN_KNEE, CapacityEstimate
from collector.cli import main
from collector.integrations.render import EstimateError, gateway_picker_config, per_replica
from collector.rules.config import DEFAULT
from collector.store.db import RequestStore
from collector.store.decision import published_estimates
from collector.store.estimates import save_estimate


@pytest.fixture
def stored(tmp_path):
    """A request log holding one probe estimate for model m (knee 8 requests, pool 5), with the
    active tokens at the knee (mean 1200, p95 1.5x it), the recommended pool in tokens (1300: the
    p99.9 with 5 in flight, neither the mean's 1200 x 5 / 8 = 750 nor the p95's 1800 x 5 / 8 =
    1125) and the largest request of the traffic's week; the estimate is the one the store
    publishes, which is what `--db` renders."""
    estimate = _estimate(model="m", knee_at=8)
    mean = estimate.knee.tokens
    estimate = replace(
        estimate,
        token_capacity={"mean": mean, "p95": mean * 3 // 2, "pool_tokens": 1300, "max_request_tokens": 40},
    )
    store = RequestStore(tmp_path / "log.duckdb")
    save_estimate(store, estimate)
    (published,) = published_estimates(store)
    store.close()
    return tmp_path / "log.duckdb", published.estimate


# the published token figures (CapacityEstimate's properties) and the token_capacity keys they read
TOKEN_FIGURES = {
    "knee_tokens": "mean",
    "knee_tokens_p95": "p95",
    "recommended_pool_tokens": "pool_tokens",
    "max_request_tokens": "max_request_tokens",
}


def _tokens(estimate: CapacityEstimate, **figures: int | None) -> CapacityEstimate:
    """The estimate with these token figures (knee_tokens=700: its token capacity's mean is 700)."""
    capacity = dict(estimate.token_capacity or {}) | {TOKEN_FIGURES[k]: v for k, v in figures.items()}
    return replace(estimate, token_capacity=capacity)


def _small(estimate: CapacityEstimate, **tokens: int | None) -> CapacityEstimate:
    """Knee 4 requests, pool 2, and the given token figures (recommended_pool_tokens=None: none measured)."""
    return _tokens(replace(estimate, knee=replace(estimate.knee, requests=4), recommended_pool=2), **tokens)


def _render(*args: str) -> dict:
    result = CliRunner().invoke(main, ["integrations", *args])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("# Rendered by `headroom integrations`")
    return yaml.safe_load(result.output)


def test_keda_scaled_object_divides_live_concurrency_by_the_stored_pool_in_both_calibers(stored):
    db, estimate = stored
    limits = per_replica(estimate)
    assert limits["knee_requests"] == 8 and limits["pool_requests"] == estimate.recommended_pool < 8
    scaled = _render("keda", "--db", str(db), "--deployment", "llm-inference", "--max-replicas", "12")
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm-inference"}
    assert spec["maxReplicaCount"] == 12
    requests, tokens = spec["triggers"]
    for trigger in (requests, tokens):
        assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "1"
        assert trigger["metadata"]["ignoreNullValues"] == "false"  # empty = error = the fallback
        assert f'job="{DEFAULT.sidecar_job}", model="m"' in trigger["metadata"]["query"]
    assert requests["metadata"]["query"].startswith("(sum(headroom_inflight_requests{")
    assert spec["fallback"] == {"failureThreshold": 3, "replicas": 12}
    assert "headroom_capacity_recommended_pool_requests" in requests["metadata"]["query"]
    assert f"or vector({limits['pool_requests']})" in requests["metadata"]["query"], (
        "the stored pool, as a floor"
    )
    assert "headroom_active_tokens" in tokens["metadata"]["query"]
    # an instantaneous value (KEDA's poll) divided by the pool in tokens (its p99.9), never the
    # mean's pool nor the knee's p95 scaled to the pool
    assert estimate.recommended_pool_tokens == limits["pool_tokens_peak"] == 1300
    assert limits["pool_tokens_peak"] > limits["pool_tokens"] == 750.0
    assert "knee_tokens_p95" not in limits and "pool_tokens_p95" not in limits
    assert "or vector(1300)" in tokens["metadata"]["query"]
    assert "headroom_capacity_recommended_pool_tokens{" in tokens["metadata"]["query"]
    assert "headroom_capacity_knee_tokens_p95{" not in tokens["metadata"]["query"]
    assert "headroom_capacity_knee_tokens{" not in tokens["metadata"]["query"]
    assert "headroom_capacity_knee_requests{" not in tokens["metadata"]["query"]


def test_gateway_concurrency_detector_takes_the_pool_and_bursts_to_the_knee(stored):
    db, estimate = stored
    config = _render("gateway", "--db", str(db), "--mode", "tokens")
    assert (config["apiVersion"], config["kind"]) == (
        "inference.networking.x-k8s.io/v1alpha1",
        "EndpointPickerConfig",
    )
    (plugin,) = config["plugins"]
    assert plugin["type"] == "concurrency-detector" and config["saturationDetector"] == {
        "pluginRef": "concurrency-detector"
    }
    parameters, pool, knee = plugin["parameters"], estimate.recommended_pool, estimate.knee
    assert parameters["concurrencyMode"] == "tokens"
    assert parameters["maxConcurrency"] == pool
    # the pool in tokens (p99.9 with the pool in flight), above the largest request (40)
    assert estimate.max_request_tokens is not None and estimate.recommended_pool_tokens is not None
    assert estimate.max_request_tokens < estimate.recommended_pool_tokens
    assert parameters["maxTokenConcurrency"] == estimate.recommended_pool_tokens == 1300
    assert parameters["headroom"] == pytest.approx(knee.requests / pool - 1, abs=1e-4)
    # the documented parameter contract: positive ints and a non-negative fraction
    assert all(
        isinstance(parameters[k], int) and parameters[k] > 0
        for k in ("maxConcurrency", "maxTokenConcurrency")
    )


def test_llmd_saturation_entry_names_the_model_and_a_queue_bound_from_the_burst(stored, tmp_path):
    db, estimate = stored
    out = tmp_path / "wva.yaml"
    result = CliRunner().invoke(
        main, ["integrations", "llm-d", "--db", str(db), "--namespace", "llm", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(out.read_text())
    assert config["kind"] == "ConfigMap" and config["metadata"]["name"] == "wva-saturation-scaling-config"
    (entry,) = [yaml.safe_load(text) for text in config["data"].values()]
    assert entry["model_id"] == "m" and entry["namespace"] == "llm"
    assert entry["queueLengthThreshold"] == max(1, estimate.knee.requests - estimate.recommended_pool)
    assert set(entry) == {
        "model_id",
        "namespace",
        "kvCacheThreshold",
        "queueLengthThreshold",
        "kvSpareTrigger",
        "queueSpareTrigger",
    }


def test_no_estimate_or_an_unreached_knee_is_refused_with_the_reason(tmp_path, stored):
    empty = tmp_path / "empty.duckdb"
    RequestStore(empty).close()
    result = CliRunner().invoke(main, ["integrations", "keda", "--db", str(empty), "--deployment", "d"])
    assert result.exit_code == 1 and "none passes the publication gate" in result.output
    _, estimate = stored
    unreached = replace(estimate, knee=replace(estimate.knee, reached=False))
    with pytest.raises(EstimateError, match="never reached"):
        gateway_picker_config(unreached)
    path = tmp_path / "cap.json"
    path.write_text(json.dumps(unreached.to_dict()))
    result = CliRunner().invoke(main, ["integrations", "gateway", "--estimate", str(path)])
    assert result.exit_code == 1 and "lower bound" in result.output


@pytest.mark.integration
@pytest.mark.parametrize(
    ("situation", "series", "expected"),
    [
        ("nothing in flight", {"up": "1+0x5", "inflight": "0+0x5", "pool": "6+0x5"}, (0, 0)),
        ("a sidecar up that served nothing yet", {"up": "1+0x5"}, (0, 0)),
        ("a published pool of 0", {"up": "1+0x5", "inflight": "3+0x5", "pool": "0+0x5"}, (0.5, None)),
        ("one request in flight", {"up": "1+0x5", "inflight": "1+0x5", "pool": "4+0x5"}, (0.25, None)),
        # every scrape lost: empty, an error to KEDA (ignoreNullValues false), so its fallback holds
        ("every scrape lost", {"up": "0+0x5"}, ("empty", "empty")),
        ("no series at all", {}, ("empty", "empty")),
    ],
)
def test_keda_queries_never_yield_nan_or_inf(stored, tmp_path, situation, series, expected):
    """promtool evaluates both triggers' queries: finite whenever a sidecar is scraped (not NaN at
    idle, not +Inf with a 0 pool), and empty (KEDA's fallback) when every scrape is lost."""
    from conftest import require_tool

    from collector.integrations.render import keda_scaled_object

    promtool = require_tool("promtool")
    _, estimate = stored
    estimate = _tokens(
        replace(estimate, recommended_pool=6, knee=replace(estimate.knee, requests=8, tokens=9000)),
        knee_tokens=9000,
        knee_tokens_p95=12000,
        recommended_pool_tokens=9800,
    )
    triggers = keda_scaled_object(estimate, deployment="d")["spec"]["triggers"]
    where = f'job="{DEFAULT.sidecar_job}",model="m",instance="a",tenant="t"'
    published = 'model="m",task_class="all",instance="a"'
    names = {
        "inflight": f"headroom_inflight_requests{{{where}}}",
        "pool": f"headroom_capacity_recommended_pool_requests{{{published}}}",
        "up": f'up{{job="{DEFAULT.sidecar_job}",instance="a"}}',
    }
    inputs = [{"series": names[key], "values": values} for key, values in series.items()]
    checks = []
    for trigger, value in zip(triggers, expected, strict=True):
        if value == "empty":
            expr = trigger["metadata"]["query"]
            checks.append({"expr": expr, "eval_time": "4m", "exp_samples": []})
            continue
        if value is None:  # the tokens trigger: finite, whatever the value
            expr = f"count(({trigger['metadata']['query']}) > -Inf < +Inf)"
            checks.append({"expr": expr, "eval_time": "4m", "exp_samples": [{"labels": "{}", "value": 1}]})
            continue
        expr = trigger["metadata"]["query"]
        checks.append({"expr": expr, "eval_time": "4m", "exp_samples": [{"labels": "{}", "value": value}]})
    result = promql_expr_test(promtool, tmp_path, inputs, checks)
    assert result.returncode == 0, f"{situation}: {result.stdout}{result.stderr}"


def test_keda_for_one_cluster_of_a_central_prometheus_filters_live_and_published_series(stored):
    db, _ = stored
    scaled = _render("keda", "--db", str(db), "--deployment", "d", "--cluster", "eu-1")
    for trigger in scaled["spec"]["triggers"]:
        query = trigger["metadata"]["query"]
        selectors = [part for part in query.split("{")[1:]]
        assert selectors and all('cluster="eu-1"' in part.split("}")[0] for part in selectors), query


def test_a_withheld_token_knee_drives_no_token_scaling(stored, tmp_path):
    """A short-prompt probe's token knee is not the traffic's: the gauges publish none, so no
    autoscaler scales on it (the flat knee_tokens, not knee.tokens, is what is published)."""
    _, estimate = stored
    withheld = replace(estimate, token_knee_withheld="mean tokens per request 4.0x the traffic's")
    assert withheld.knee_tokens is None and withheld.recommended_pool_tokens is None
    limits = per_replica(withheld)
    assert limits["knee_tokens"] is None and limits["pool_tokens"] is None
    assert limits["pool_tokens_peak"] is None
    path = tmp_path / "withheld.json"
    path.write_text(json.dumps(withheld.to_dict()))
    scaled = _render("keda", "--estimate", str(path), "--deployment", "d")
    assert len(scaled["spec"]["triggers"]) == 1  # requests only
    assert "headroom_active_tokens" not in json.dumps(scaled)
    assert "4.0x the traffic's" in scaled["metadata"]["annotations"]["llm-headroom/token-trigger"]
    result = CliRunner().invoke(
        main, ["integrations", "gateway", "--estimate", str(path), "--mode", "tokens"]
    )
    assert result.exit_code == 1 and "4.0x the traffic's" in result.output


def test_token_limits_take_the_pool_in_tokens_and_never_refuse_the_largest_request(stored):
    """Knee 4, pool 2; active tokens at the knee mean 700, p95 1600; the recommended pool in tokens
    (the p99.9 of the active tokens with 2 in flight) 1100; the traffic's largest request 900
    tokens. KEDA divides by the pool in tokens (1100, not the mean's 350 nor the p95 scaled to the
    pool, 1600 x 2 / 4 = 800) and so does the gateway's limit; a largest request of 1300 is above
    it, and the limit is raised to 1300 (else that request is refused on an idle replica)."""
    from collector.integrations.render import gateway_comments, keda_scaled_object

    _, estimate = stored
    small = _small(
        estimate, knee_tokens=700, knee_tokens_p95=1600, recommended_pool_tokens=1100, max_request_tokens=900
    )
    limits = per_replica(small)
    assert (limits["pool_tokens"], limits["pool_tokens_peak"]) == (350.0, 1100)
    assert limits["max_request_tokens"] == 900
    scaled = keda_scaled_object(small, deployment="d")
    (tokens,) = [t for t in scaled["spec"]["triggers"] if t["name"] == "active-tokens-per-pool"]
    assert "or vector(1100)" in tokens["metadata"]["query"]
    assert "vector(350" not in tokens["metadata"]["query"] and "vector(800" not in tokens["metadata"]["query"]
    assert scaled["metadata"]["annotations"]["llm-headroom/pool-tokens"] == (
        "1100 (p99.9 of the active tokens with the pool of 2 in flight; KEDA reads the published gauge first)"
    )
    assert "llm-headroom/token-trigger" not in scaled["metadata"]["annotations"]
    parameters = gateway_picker_config(small, mode="tokens")["plugins"][0]["parameters"]
    assert parameters["maxTokenConcurrency"] == 1100  # the largest request (900) fits: not raised
    (line,) = [c for c in gateway_comments(small) if c.startswith("maxTokenConcurrency")]
    assert line == "maxTokenConcurrency 1100: the pool in tokens, p99.9 of the active tokens with 2 in flight"

    # (b) a largest request above the pool in tokens: the limit is raised to it, and the comment says so
    long = _tokens(small, max_request_tokens=1300)
    parameters = gateway_picker_config(long, mode="tokens")["plugins"][0]["parameters"]
    assert parameters["maxTokenConcurrency"] == 1300
    (line,) = [c for c in gateway_comments(long, mode="tokens") if c.startswith("maxTokenConcurrency")]
    assert line == (
        "maxTokenConcurrency 1300: raised to the largest request the traffic sent: 1300 tokens "
        "(the pool in tokens, p99.9 of the active tokens with 2 in flight = 1100, would refuse it)"
        " (the detector's caliber)"
    )
    # KEDA's budget is the pool in tokens whatever the largest request
    (tokens,) = [
        t
        for t in keda_scaled_object(long, deployment="d")["spec"]["triggers"]
        if t["name"] == "active-tokens-per-pool"
    ]
    assert "or vector(1100)" in tokens["metadata"]["query"]
    # no traffic (no largest request known): the pool in tokens as it is
    quiet = _tokens(small, max_request_tokens=None)
    assert gateway_picker_config(quiet)["plugins"][0]["parameters"]["maxTokenConcurrency"] == 1100


@pytest.mark.parametrize(
    ("dropped", "reason", "pool_tokens"),
    [
        # from before the time-weighted token capacity: its token figure is an admission average,
        # and reading it back withholds the token capacity with that reason
        (
            ("knee_tokens_p95", "recommended_pool_tokens", "max_request_tokens", "token_capacity"),
            f"the token capacity is withheld: {LEGACY_TOKEN_KNEE}",
            None,
        ),
        # from before the pool in tokens: a p95 at the knee, which scaled to the pool is exceeded there
        (("recommended_pool_tokens",), "no recommended pool in tokens was measured", 350.0),
    ],
    ids=["before the time-weighted token capacity", "before the pool in tokens"],
)
def test_a_legacy_estimate_without_the_pool_in_tokens_renders_no_token_trigger_or_limit(
    stored, tmp_path, dropped, reason, pool_tokens
):
    """An estimate saved without recommended_pool_tokens (as a file or the store reads it back:
    CapacityEstimate.from_dict) predates it (an admission average, or a p95 at the knee): KEDA gets
    no token trigger (the annotation says why), the gateway no maxTokenConcurrency (a comment says
    why), and --mode tokens is refused with the reason."""
    from collector.integrations.render import gateway_comments, keda_scaled_object

    _, estimate = stored
    saved = {
        k: v
        for k, v in _small(
            estimate,
            knee_tokens=700,
            knee_tokens_p95=1600,
            recommended_pool_tokens=1100,
            max_request_tokens=900,
        )
        .to_dict()
        .items()
        if k not in dropped
    }
    if "token_capacity" in saved:  # its token capacity, written before the pool in tokens
        saved["token_capacity"] = {k: v for k, v in saved["token_capacity"].items() if k != "pool_tokens"}
    legacy = CapacityEstimate.from_dict(saved)
    limits = per_replica(legacy)
    assert limits["pool_tokens"] == pool_tokens and limits["pool_tokens_peak"] is None
    scaled = keda_scaled_object(legacy, deployment="d")
    assert [t["name"] for t in scaled["spec"]["triggers"]] == ["inflight-requests-per-pool"]
    assert "headroom_active_tokens" not in json.dumps(scaled)
    why = scaled["metadata"]["annotations"]["llm-headroom/token-trigger"]
    assert why == f"none: {reason}"
    with pytest.raises(EstimateError, match="gives no token limit"):
        gateway_picker_config(legacy, mode="tokens")
    parameters = gateway_picker_config(legacy)["plugins"][0]["parameters"]
    assert "maxTokenConcurrency" not in parameters and parameters["maxConcurrency"] == 2
    comments = gateway_comments(legacy)
    assert comments[1] == f"maxTokenConcurrency not set: {reason}"
    # through the command line: refused, the reason and the way out printed
    path = tmp_path / "legacy.json"
    path.write_text(json.dumps(saved))
    result = CliRunner().invoke(
        main, ["integrations", "gateway", "--estimate", str(path), "--mode", "tokens"]
    )
    assert result.exit_code == 1 and "gives no token limit" in result.output
    assert "--mode requests" in result.output
    scaled = _render("keda", "--estimate", str(path), "--deployment", "d")
    assert len(scaled["spec"]["triggers"]) == 1 and "headroom_active_tokens" not in json.dumps(scaled)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("situation", "gauge", "expected"),
    [
        ("the pool-in-tokens gauge published beside the knee's", 1100, 1),
        # a re-measured pool in tokens: the gauge, not the estimate's number, is the budget
        ("a re-measured pool-in-tokens gauge", 2200, 0.5),
        # a sidecar of a release before the pool-in-tokens gauge: the estimate's own, the same answer
        ("no capacity gauges (the estimate's number)", None, 1),
    ],
)
def test_keda_token_trigger_answers_one_replica_at_the_pool_in_tokens_in_promtool(
    stored, tmp_path, situation, gauge, expected
):
    """promtool evaluates the token trigger on recorded series: one replica carrying its pool in
    tokens (1100, the p99.9 with 2 in flight) asks KEDA for 1 replica, where the mean's pool (350)
    would have asked for ceil(1100 / 350) = 4 and the knee's p95 scaled to the pool (1600 x 2 / 4
    = 800) for 2; the knee's gauges published beside it play no part."""
    from conftest import require_tool

    from collector.integrations.render import keda_scaled_object

    promtool = require_tool("promtool")
    _, estimate = stored
    small = _small(
        estimate, knee_tokens=700, knee_tokens_p95=1600, recommended_pool_tokens=1100, max_request_tokens=900
    )
    (tokens,) = [
        t
        for t in keda_scaled_object(small, deployment="d")["spec"]["triggers"]
        if t["name"] == "active-tokens-per-pool"
    ]
    where = f'job="{DEFAULT.sidecar_job}",model="m",instance="a",tenant="t"'
    published = (
        'model="m",task_class="all",replica_class="default",source="probe",confidence="high",instance="a"'
    )
    series = {
        f"headroom_active_tokens{{{where}}}": "1100+0x5",
        f'up{{job="{DEFAULT.sidecar_job}",instance="a"}}': "1+0x5",
    }
    if gauge is not None:
        series |= {
            f"headroom_capacity_knee_requests{{{published}}}": "4+0x5",
            f"headroom_capacity_recommended_pool_requests{{{published}}}": "2+0x5",
            f"headroom_capacity_knee_tokens{{{published}}}": "700+0x5",
            f"headroom_capacity_knee_tokens_p95{{{published}}}": "1600+0x5",
            f"headroom_capacity_recommended_pool_tokens{{{published}}}": f"{gauge}+0x5",
        }
    inputs = [{"series": name, "values": values} for name, values in series.items()]
    checks = [
        {
            "expr": tokens["metadata"]["query"],
            "eval_time": "4m",
            "exp_samples": [{"labels": "{}", "value": expected}],
        },
        # KEDA's AverageValue with threshold 1: replicas = ceil(the answer)
        {
            "expr": f"ceil({tokens['metadata']['query']})",
            "eval_time": "4m",
            "exp_samples": [{"labels": "{}", "value": 1}],
        },
    ]
    result = promql_expr_test(promtool, tmp_path, inputs, checks)
    assert result.returncode == 0, f"{situation}: {result.stdout}{result.stderr}"
