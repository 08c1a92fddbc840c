"""What the generated rules and dashboards say: names, labels, annotations, runbooks, panels."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from collector.alerts.alerting import SIGNALS, alerting_groups, alerts
from collector.alerts.alertmanager import INCIDENT_PAGES, alertmanager_config
from collector.alerts.files import ALERTS_FILE, RECORDING_FILE, alert_files
from collector.alerts.promtool_cases import cases
from collector.alerts.recording import ERROR_OUTCOMES
from collector.alerts.templating import to_go, to_text
from collector.catalog import BY_NAME, CATALOG, EXTERNAL_SERIES
from collector.dashboards.files import dashboard_files
from collector.dashboards.push import with_datasource
from collector.rules.config import DEFAULT, ConfigError, RulesConfig
from collector.rules.naming import RECORD_NAME, metric_names, record

ROOT = Path(__file__).resolve().parent.parent
BUILTINS = {"ALERTS", "up"} | set(EXTERNAL_SERIES)  # Prometheus' own, and other exporters' (DCGM)


def _groups(name: str) -> list[dict]:
    return yaml.safe_load(alert_files()[name])["groups"]


def _records() -> set[str]:
    return {rule["record"] for group in _groups(RECORDING_FILE) for rule in group["rules"]}


def _alert_rules() -> list[dict]:
    return [rule for group in _groups(ALERTS_FILE) for rule in group["rules"]]


def _catalog_series() -> set[str]:
    names = set()
    for metric in CATALOG:
        names |= (
            {metric.name + s for s in ("_bucket", "_sum", "_count")}
            if metric.type == "histogram"
            else {metric.name}
        )
    return names


def _panel_exprs() -> list[tuple[str, str, str]]:
    return [
        (name, panel["title"], t["expr"])
        for name, text in dashboard_files().items()
        for panel in json.loads(text)["panels"]
        for t in panel["targets"]
    ]


def test_record_names_follow_level_metric_operations():
    records = _records()
    assert len(records) >= 20
    for name in records:
        match = RECORD_NAME.match(name)
        assert match, name
        assert match["level"].split("_")[0] in ("instance", "model"), name
    with pytest.raises(KeyError, match="not in collector.catalog"):
        record("model", "headroom_made_up_total", "rate5m")


def test_every_expression_reads_only_catalog_metrics_records_or_builtins():
    known = _catalog_series() | _records() | BUILTINS
    expressions = [r["expr"] for g in _groups(RECORDING_FILE) + _groups(ALERTS_FILE) for r in g["rules"]]
    expressions += [expr for _, _, expr in _panel_exprs()]
    for expr in expressions:
        assert metric_names(expr), expr
        assert metric_names(expr) <= known, f"unknown names {metric_names(expr) - known} in {expr}"


def test_every_alert_has_severity_summary_templated_description_and_runbook_anchor():
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {heading.strip().lower() for heading in re.findall(r"^## (.+)$", runbooks, re.M)}
    rules = _alert_rules()
    assert len(rules) == len(alerts(DEFAULT)) == len(DEFAULT.for_durations) == 35
    assert DEFAULT.runbook_base_url.startswith("https://"), "runbook links must work from Slack and PagerDuty"
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        notes = rule["annotations"]
        assert notes["summary"] and "{{ $labels." in notes["description"], rule["alert"]
        assert notes["runbook_url"] == f"{DEFAULT.runbook_base_url}#{rule['alert'].lower()}"
        assert rule["alert"].lower() in anchors, f"docs/runbooks.md has no section for {rule['alert']}"
        section = runbooks.split(f"## {rule['alert']}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**Meaning.**", "**Confirm.**", "**Act.**"):
            assert part in section, f"{rule['alert']} runbook lacks {part}"


def test_capacity_alerts_compare_with_capacity_gauges_not_numbers():
    by_name = {rule["alert"]: rule for rule in _alert_rules()}
    knee = by_name["HeadroomConcurrencyNearKnee"]["expr"]
    recording = {r["record"]: r["expr"] for g in _groups(RECORDING_FILE) for r in g["rules"]}
    ratio_record = next(iter(metric_names(knee)))
    assert "headroom_capacity_knee" in recording[ratio_record]
    assert re.fullmatch(r"\S+ > 0\.85", knee), "only the configured ratio, never a concurrency"


def test_signals_and_the_composite_that_needs_a_latency_and_a_saturation_signal():
    rules = _alert_rules()
    signals = sorted(r["labels"]["signal"] for r in rules if "signal" in r["labels"])
    assert signals == sorted(SIGNALS)
    assert {r["labels"]["signal_kind"] for r in rules if "signal" in r["labels"]} == {"latency", "saturation"}
    composite = next(r for r in rules if r["alert"] == "HeadroomNearCapacityLimit")
    assert 'signal_kind="latency"' in composite["expr"] and 'signal_kind="saturation"' in composite["expr"]
    assert composite["labels"]["severity"] == "critical"


# The pages: what users feel (SLO burn, a full cache with a queue behind it, a sidecar gone), the
# capacity forecast (the one page before users are hurt) and the any-two composite.
PAGES = {
    "HeadroomAvailabilityBudgetBurnFast",
    "HeadroomTTFTBudgetBurnFast",
    "HeadroomE2EBudgetBurnFast",
    "HeadroomGoodputBudgetBurnFast",
    "HeadroomKVCacheExhausted",
    "HeadroomCapacityForecast",
    "HeadroomNearCapacityLimit",
    "HeadroomSidecarDown",
    "HeadroomSidecarJobAbsent",
}


def test_pages_are_symptoms_and_causes_only_warn():
    severities = {r["alert"]: r["labels"]["severity"] for r in _alert_rules()}
    assert {name for name, severity in severities.items() if severity == "critical"} == PAGES
    for cause in (
        "HeadroomKVCacheNearFull",
        "HeadroomQueueNotDraining",
        "HeadroomTTFTRising",
        "HeadroomEngineScrapeFailing",
        "HeadroomLogSinkDown",
        "HeadroomSlowReplica",
    ):
        assert severities[cause] == "warning", cause


def test_a_full_kv_cache_pages_only_with_requests_queueing_and_the_warning_has_hysteresis():
    by_name = {rule["alert"]: rule for rule in _alert_rules()}
    assert (
        'ALERTS{alertname="HeadroomKVCacheNearFull", alertstate="firing"}'
        in by_name["HeadroomKVCacheNearFull"]["expr"]
    )
    assert "headroom_engine_requests_waiting" in by_name["HeadroomKVCacheExhausted"]["expr"]


def test_availability_counts_every_answered_request_and_burn_rates_need_traffic():
    records = {r["record"]: r["expr"] for g in _groups(RECORDING_FILE) for r in g["rules"]}
    availability = records["model:headroom_availability_slo_misses:ratio_rate5m"]
    assert f'outcome=~"{"|".join(ERROR_OUTCOMES)}"' in availability
    assert set(ERROR_OUTCOMES) == {"rate_limited", "overloaded", "upstream_error", "timeout"}
    assert 'outcome!="client_cancelled"' in availability
    for rule in _alert_rules():
        if "BudgetBurn" in rule["alert"]:
            guard = DEFAULT.slo_min_requests * (1 if rule["alert"].endswith("Fast") else 72)
            assert "increase(" in rule["expr"] and rule["expr"].endswith(f">= {guard}"), rule["alert"]


def test_goodput_attainment_counts_shed_requests_against_it_and_leaves_out_only_invalid():
    """Attainment = met / every verdict but invalid: a shed (429, 503), aborted or failed request is
    in the denominator, so shedding lowers it; a model with nothing met reads 0, not no series."""
    records = {r["record"]: r["expr"] for g in _groups(RECORDING_FILE) for r in g["rules"]}
    for window in ("5m", "30m", "1h", "6h", "3d"):
        attainment = records[f"model:headroom_goodput:ratio_rate{window}"]
        assert 'headroom_slo_requests_total{verdict="met"}' in attainment
        assert attainment.endswith(
            f'/ sum by (cluster, model) (rate(headroom_slo_requests_total{{verdict!="invalid"}}[{window}]))'
        )
        assert "* 0" in attainment, "nothing met must read 0, not silence the burn"
    by_name = {rule["alert"]: rule for rule in _alert_rules()}
    fast = by_name["HeadroomGoodputBudgetBurnFast"]["expr"]
    assert "1 - model:headroom_goodput:ratio_rate1h > 0.144" in fast
    assert "1 - model:headroom_goodput:ratio_rate30m > 0.06" in fast
    assert by_name["HeadroomGoodputBudgetBurnFast"]["labels"]["family"] == "goodput_slo"
    assert INCIDENT_PAGES[-1] == "HeadroomGoodputBudgetBurnFast", "every other page of the incident mutes it"


def test_latency_per_replica_and_a_vanished_job_are_watched():
    records = {r["record"]: r["expr"] for g in _groups(RECORDING_FILE) for r in g["rules"]}
    assert (
        "instance, model, le"
        in records["instance_model_quantile:headroom_time_to_first_token_seconds:histogram_quantile_rate5m"]
    )
    by_name = {rule["alert"]: rule for rule in _alert_rules()}
    absence = by_name["HeadroomSidecarJobAbsent"]["expr"]
    up = f"up{{{DEFAULT.job_selector}}}"
    # anywhere at all, or per cluster: present within the lookback, gone now (central evaluation)
    assert absence.startswith(f"absent({up})\nor\n")
    assert f"group by (cluster, job) (max_over_time({up}[{DEFAULT.absence_lookback}]))" in absence
    assert f"unless on (cluster, job)\n  group by (cluster, job) ({up})" in absence
    assert DEFAULT.job_selector == 'job="headroom-sidecar"'
    one_cluster = alerting_groups(dataclasses.replace(DEFAULT, cluster_label=""))
    rules = [r for g in one_cluster for r in g["rules"] if r["alert"] == "HeadroomSidecarJobAbsent"]
    assert [r["expr"] for r in rules] == [f"absent({up})"]


def test_the_knee_ratio_reads_the_new_gauges_and_a_task_class_is_optional():
    records = {r["record"]: r["expr"] for g in _groups(RECORDING_FILE) for r in g["rules"]}
    ratio = records["instance_model_task_class_caliber:headroom_concurrency:avg5m_knee_ratio"]
    assert "headroom_capacity_knee_requests" in ratio and "headroom_capacity_knee_tokens" in ratio
    assert "headroom_capacity_knee{" not in ratio and "headroom_capacity_knee)" not in ratio
    assert "headroom_task_inflight_requests" in ratio and 'task_class="all"' in ratio


def test_every_alert_has_promtool_cases_on_both_sides_of_for():
    table = cases(DEFAULT)
    for alert in alerts(DEFAULT):
        found = [c for c in table if c.alert == alert.name]
        firing = [c for c in found if any(expected for _, expected in c.checks)]
        assert firing, f"{alert.name}: no firing case"
        assert any(not c.checks[0][1] for c in firing), f"{alert.name}: no not-yet-firing check before for:"
        assert any(all(not e for _, e in c.checks) for c in found), f"{alert.name}: no quiet case"


def test_alertmanager_routes_page_and_ticket_and_inhibits():
    config = alertmanager_config()
    routes = {tuple(r["matchers"]): r["receiver"] for r in config["route"]["routes"]}
    assert routes == {('severity="critical"',): "page", ('severity="warning"',): "ticket"}
    # one incident on one model is one group (per cluster), whatever alerts it raises
    assert config["route"]["group_by"] == ["cluster", "model"]
    assert all("cluster" in rule["equal"] for rule in config["inhibit_rules"]), (
        "a cluster must not mute another"
    )
    assert alertmanager_config(cluster_label="")["route"]["group_by"] == ["model"]
    # each page of a capacity incident mutes the ones after it, never one before it
    order = {
        tuple(r["source_matchers"]): r["target_matchers"][0]
        for r in config["inhibit_rules"]
        if r["source_matchers"][0].startswith("alertname=") and len(r["source_matchers"]) == 1
    }
    for index, page in enumerate(INCIDENT_PAGES[:-1]):
        later = order[(f'alertname="{page}"',)]
        assert later.removeprefix('alertname=~"').removesuffix('"').split("|") == list(
            INCIDENT_PAGES[index + 1 :]
        )
    pages = {r["alert"] for r in _alert_rules() if r["labels"]["severity"] == "critical"}
    assert set(INCIDENT_PAGES) <= pages
    sources = [rule["source_matchers"] for rule in config["inhibit_rules"]]
    assert ['alertname="HeadroomNearCapacityLimit"'] in sources
    assert any('severity="critical"' in s for s in sources)
    families = {r["alert"]: r["labels"].get("family") for r in _alert_rules()}
    assert families["HeadroomKVCacheExhausted"] == families["HeadroomKVCacheNearFull"] == "kv_cache"
    assert families["HeadroomCapacityForecast"] == families["HeadroomConcurrencyRising"] == "knee_trend"


def test_dashboards_have_variables_units_and_descriptions():
    boards = {name: json.loads(text) for name, text in dashboard_files().items()}
    assert set(boards) == {
        "headroom-capacity-overview.json",
        "headroom-tenants.json",
        "headroom-capacity-review.json",
    }
    for name, board in boards.items():
        variables = {v["name"] for v in board["templating"]["list"]}
        assert {"datasource", "model", "instance"} <= variables, name
        for panel in board["panels"]:
            assert panel["fieldConfig"]["defaults"]["unit"], f"{name}: {panel['title']} has no unit"
            assert len(panel["description"]) > 40, f"{name}: {panel['title']} has no description"
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    assert "tenant" in {v["name"] for v in boards["headroom-tenants.json"]["templating"]["list"]}
    assert boards["headroom-capacity-review.json"]["time"]["from"] == "now-7d"


def test_push_points_the_datasource_variable_at_the_given_uid():
    board = json.loads(dashboard_files()["headroom-tenants.json"]) | {"id": 7}
    pushed = with_datasource(board, "my-prom")
    assert "id" not in pushed
    assert (
        next(v for v in pushed["templating"]["list"] if v["type"] == "datasource")["current"]["value"]
        == "my-prom"
    )
    assert (
        next(v for v in board["templating"]["list"] if v["type"] == "datasource")["current"]["value"]
        == "headroom-prometheus"
    ), "the input must not be modified"


def test_annotation_notation_renders_to_go_and_to_text():
    text = "KV at <value:humanizePercentage> on <model>"
    assert to_go(text) == "KV at {{ $value | humanizePercentage }} on {{ $labels.model }}"
    assert to_text(text, {"model": "m"}, "97%") == "KV at 97% on m"
    with pytest.raises(KeyError, match="model"):
        to_text(text, {}, "1")


def test_config_rejects_values_that_cannot_give_correct_rules():
    with pytest.raises(ConfigError, match="not a TTFT histogram bucket"):
        RulesConfig(ttft_slo_seconds=1.7).validate()
    with pytest.raises(ConfigError, match="KV-cache ratios must rise"):
        RulesConfig(kv_warning_clear_ratio=0.95).validate()
    assert DEFAULT.error_budget == 0.01
    assert set(DEFAULT.for_durations) == {a.name for a in alerts(DEFAULT)}
    assert BY_NAME  # the catalog is importable (names come from it)
