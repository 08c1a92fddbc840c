"""Capacity in rates handed to the autoscalers (collector.integrations.render): KEDA's rate trigger
has threshold = the published μ_slo x the documented utilisation (or --rate-utilisation); llm-d's
entry carries V_P; the gateway's thresholds say their measured number, source and age, and with no
estimate past the gate the command names the gateway's fallback."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest
import yaml
from test_analysis_estimate import _estimate

from collector.capacity import CapacityEstimate
from collector.integrations.render import (
    DEFAULT_RATE_UTILISATION,
    GATEWAY_FALLBACK,
    gateway_comments,
    gateway_picker_config,
    keda_scaled_object,
    llmd_saturation_config,
)


@pytest.fixture
def measured() -> CapacityEstimate:
    return replace(_estimate(model="m", knee_at=8), rate_requests_per_s=9.5, prefill_tokens_per_s=380.0)


def test_keda_rate_trigger_threshold_is_mu_slo_times_the_utilisation(measured):
    scaled = keda_scaled_object(measured, deployment="llm")
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    triggers = {t["name"]: t for t in scaled["spec"]["triggers"]}
    assert {"inflight-requests-per-pool", "request-rate-per-replica"} <= set(triggers)
    rate = triggers["request-rate-per-replica"]
    assert rate["type"] == "prometheus" and set(rate["metadata"]) == {
        "serverAddress",
        "query",
        "threshold",
        "ignoreNullValues",
    }
    assert float(rate["metadata"]["threshold"]) == pytest.approx(9.5 * DEFAULT_RATE_UTILISATION)
    assert DEFAULT_RATE_UTILISATION == 0.8
    assert rate["metadata"]["query"].startswith("sum(rate(headroom_requests_total{")
    assert 'model="m", source="traffic"}[2m]' in rate["metadata"]["query"]
    note = scaled["metadata"]["annotations"]["llm-headroom/rate-requests-per-s"]
    assert "source probe" in note and measured.created_at.isoformat() in note
    half = keda_scaled_object(measured, deployment="llm", rate_utilisation=0.5)
    assert [t["metadata"]["threshold"] for t in half["spec"]["triggers"]][-1] == "4.75"
    with pytest.raises(ValueError, match="utilisation"):
        keda_scaled_object(measured, deployment="llm", rate_utilisation=1.5)
    # the manifest survives YAML as KEDA reads it
    assert yaml.safe_load(yaml.safe_dump(scaled)) == scaled


def test_no_mu_slo_renders_no_rate_trigger_and_llmd_says_v_p_is_missing(measured):
    bare = replace(measured, rate_requests_per_s=None, prefill_tokens_per_s=None)
    names = [t["name"] for t in keda_scaled_object(bare, deployment="llm")["spec"]["triggers"]]
    assert "request-rate-per-replica" not in names and "inflight-requests-per-pool" in names
    (block,) = llmd_saturation_config(bare)["data"].values()
    assert "V_P (prefill tokens/s per replica): not measured" in block
    (block,) = llmd_saturation_config(measured)["data"].values()
    assert "# V_P 380 prefill tokens/s per replica" in block and "source probe" in block
    assert yaml.safe_load(block)["model_id"] == "m"  # the comment leaves the entry's YAML intact


def _cli(*args: str):
    from click.testing import CliRunner

    from collector.cli import main

    return CliRunner().invoke(main, ["integrations", *args])


def test_keda_rate_utilisation_option_sets_the_rate_threshold(tmp_path, measured):
    path = tmp_path / "cap.json"
    path.write_text(json.dumps(measured.to_dict()))

    def threshold(*extra: str) -> float:
        result = _cli("keda", "--estimate", str(path), "--deployment", "llm", *extra)
        assert result.exit_code == 0, result.output
        triggers = yaml.safe_load(result.output)["spec"]["triggers"]
        (rate,) = [t for t in triggers if t["name"] == "request-rate-per-replica"]
        return float(rate["metadata"]["threshold"])

    assert threshold() == pytest.approx(9.5 * DEFAULT_RATE_UTILISATION)  # the documented default
    assert threshold("--rate-utilisation", "0.6") == pytest.approx(5.7)
    for bad in ("0", "1.2"):
        result = _cli("keda", "--estimate", str(path), "--deployment", "llm", "--rate-utilisation", bad)
        assert result.exit_code == 2 and "--rate-utilisation" in result.output


def test_gateway_thresholds_say_their_measured_number_source_and_age(tmp_path, measured):
    measured = replace(
        measured,
        created_at=datetime.fromisoformat("2026-12-01T08:00:00+00:00"),
        run_id="probe-20261201T075000Z-ab12",
    )
    lines = gateway_comments(measured, now=datetime(2026, 12, 1, 11, 0, tzinfo=UTC))
    config = gateway_picker_config(measured)
    parameters = config["plugins"][0]["parameters"]
    # each threshold's line names the number the config carries
    assert lines[0].startswith(f"maxConcurrency {parameters['maxConcurrency']}: the recommended pool")
    assert any(
        line.startswith(f"headroom {parameters['headroom']:g}: bursts up to the knee") for line in lines
    )
    assert "mu_slo 9.5 requests/s per endpoint" in " ".join(lines)
    assert lines[-1] == (
        "measured by probe run probe-20261201T075000Z-ab12 at 2026-12-01T08:00:00+00:00 (3.0 h old), "
        f"replica class default, confidence {measured.confidence}"
    )
    path = tmp_path / "cap.json"
    path.write_text(json.dumps(measured.to_dict()))
    result = _cli("gateway", "--estimate", str(path))
    assert result.exit_code == 0, result.output
    head = [line for line in result.output.splitlines() if line.startswith("#")]
    assert head[1].startswith("# maxConcurrency ") and "measured by probe run" in head[-1]
    assert yaml.safe_load(result.output) == config  # the comments leave the YAML as it was


def test_gateway_without_an_estimate_that_passes_the_gate_says_the_fallback(tmp_path):
    from collector.store.db import RequestStore

    empty = tmp_path / "empty.duckdb"
    RequestStore(empty).close()
    result = _cli("gateway", "--db", str(empty))
    assert result.exit_code == 1 and "none passes the publication gate" in result.output
    assert (
        GATEWAY_FALLBACK.split(":")[0] in result.output
        and "keeps its own saturation detector" in result.output
    )
