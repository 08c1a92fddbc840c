"""`headroom integrations`: KEDA, Inference Gateway and llm-d settings rendered from a stored estimate."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from click.testing import CliRunner
from test_analysis_estimate import _estimate

from collector.cli import main
from collector.integrations.render import EstimateError, gateway_picker_config, per_replica
from collector.rules.config import DEFAULT
from collector.store.db import RequestStore
from collector.store.estimates import save_estimate


@pytest.fixture
def stored(tmp_path):
    """A request log holding one probe estimate for model m (knee 8 requests)."""
    estimate = _estimate(model="m", knee_at=8)
    store = RequestStore(tmp_path / "log.duckdb")
    save_estimate(store, estimate)
    store.close()
    return tmp_path / "log.duckdb", estimate.to_dict()


def _render(*args: str) -> dict:
    result = CliRunner().invoke(main, ["integrations", *args])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("# Rendered by `headroom integrations`")
    return yaml.safe_load(result.output)


def test_keda_scaled_object_divides_live_concurrency_by_the_stored_pool_in_both_calibers(stored):
    db, estimate = stored
    limits = per_replica(estimate)
    assert limits["knee_requests"] == 8 and limits["pool_requests"] == estimate["recommended_pool"] < 8
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
    assert f"or vector({limits['pool_tokens']})" in tokens["metadata"]["query"]


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
    parameters, pool, knee = plugin["parameters"], estimate["recommended_pool"], estimate["knee"]
    assert parameters["concurrencyMode"] == "tokens"
    assert parameters["maxConcurrency"] == pool
    assert parameters["maxTokenConcurrency"] == int(knee["tokens"] * pool / knee["requests"])
    assert parameters["headroom"] == pytest.approx(knee["requests"] / pool - 1, abs=1e-4)
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
    assert entry["queueLengthThreshold"] == max(
        1, estimate["knee"]["requests"] - estimate["recommended_pool"]
    )
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
    unreached = estimate | {"knee": estimate["knee"] | {"reached": False}}
    with pytest.raises(EstimateError, match="never reached"):
        gateway_picker_config(unreached)
    path = tmp_path / "cap.json"
    path.write_text(json.dumps(unreached))
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
    estimate = estimate | {"recommended_pool": 6, "knee": estimate["knee"] | {"requests": 8, "tokens": 9000}}
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
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    document = {
        "rule_files": ["rules.yaml"],
        "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": checks}],
    }
    (tmp_path / "keda.test.yaml").write_text(yaml.safe_dump(document))
    result = subprocess.run(
        [promtool, "test", "rules", "keda.test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
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
    withheld = estimate | {
        "knee_tokens": None,
        "token_knee_withheld": "mean tokens per request 4.0x the traffic's",
    }
    limits = per_replica(withheld)
    assert limits["knee_tokens"] is None and limits["pool_tokens"] is None
    path = tmp_path / "withheld.json"
    path.write_text(json.dumps(withheld))
    scaled = _render("keda", "--estimate", str(path), "--deployment", "d")
    assert len(scaled["spec"]["triggers"]) == 1  # requests only
    assert "headroom_active_tokens" not in json.dumps(scaled)
    result = CliRunner().invoke(
        main, ["integrations", "gateway", "--estimate", str(path), "--mode", "tokens"]
    )
    assert result.exit_code == 1 and "4.0x the traffic's" in result.output
