"""Capacity in rates handed to the autoscalers (collector.integrations.render): KEDA's rate trigger
has threshold = the published μ_slo x the documented utilisation; llm-d's entry carries V_P."""

from __future__ import annotations

import pytest
import yaml
from test_analysis_estimate import _estimate

from collector.integrations.render import DEFAULT_RATE_UTILISATION, keda_scaled_object, llmd_saturation_config


@pytest.fixture
def measured() -> dict:
    estimate = _estimate(model="m", knee_at=8)
    estimate.rate_requests_per_s = 9.5
    estimate.prefill_tokens_per_s = 380.0
    return estimate.to_dict()


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
    assert "source probe" in note and measured["created_at"] in note
    half = keda_scaled_object(measured, deployment="llm", rate_utilisation=0.5)
    assert [t["metadata"]["threshold"] for t in half["spec"]["triggers"]][-1] == "4.75"
    with pytest.raises(ValueError, match="utilisation"):
        keda_scaled_object(measured, deployment="llm", rate_utilisation=1.5)
    # the manifest survives YAML as KEDA reads it
    assert yaml.safe_load(yaml.safe_dump(scaled)) == scaled


def test_no_mu_slo_renders_no_rate_trigger_and_llmd_says_v_p_is_missing(measured):
    bare = measured | {"rate_requests_per_s": None, "prefill_tokens_per_s": None}
    names = [t["name"] for t in keda_scaled_object(bare, deployment="llm")["spec"]["triggers"]]
    assert "request-rate-per-replica" not in names and "inflight-requests-per-pool" in names
    (block,) = llmd_saturation_config(bare)["data"].values()
    assert "V_P (prefill tokens/s per replica): not measured" in block
    (block,) = llmd_saturation_config(measured)["data"].values()
    assert "# V_P 380 prefill tokens/s per replica" in block and "source probe" in block
    assert yaml.safe_load(block)["model_id"] == "m"  # the comment leaves the entry's YAML intact
