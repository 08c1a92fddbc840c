"""What an on-call reads first, checked on the generated JSON: variables that filter every query,
the glance row, tables as tables, overrides by query, links, alert annotations, the engine ceiling."""

from __future__ import annotations

import json
import re

import pytest

from collector.catalog import BY_NAME
from collector.dashboards.files import dashboard_files

BOARDS = {name: json.loads(text) for name, text in dashboard_files().items()}
SCOPE = ('cluster=~"$cluster"', 'namespace=~"$namespace"', 'job=~"$job"', 'instance=~"$instance"')
# Published capacity comes from each sidecar (in a fleet, from the fleet's estimates table): filtered by place
# and model, and kept to the models the selected sidecars serve (an `and on (model)` join), never by job.
PLACE_ONLY = {name for name, spec in BY_NAME.items() if spec.group == "capacity"}
_SELECTOR = re.compile(r"\b([a-zA-Z_:][\w:]*)\{([^}]*)\}")


def _targets(only: str | None = None):
    for name, board in BOARDS.items():
        if only not in (None, name):
            continue
        for panel in board["panels"]:
            for target in panel["targets"]:
                yield name, panel, target


def _metric(sample: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if sample.endswith(suffix) and sample[: -len(suffix)] in BY_NAME:
            return sample[: -len(suffix)]
    return sample


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_query_is_filtered_by_the_scope_variables(name):
    board = BOARDS[name]
    variables = [v["name"] for v in board["templating"]["list"]]
    assert variables[:6] == ["datasource", "cluster", "namespace", "job", "instance", "model"]
    for _, panel, target in _targets(name):
        expr = target["expr"]
        assert 'job=~"$job"' in expr and 'instance=~"$instance"' in expr, (panel["title"], expr)
        for sample, matchers in _SELECTOR.findall(expr):
            metric = _metric(sample)
            needed = SCOPE[:2] if metric in PLACE_ONLY or not metric.startswith("headroom_") else SCOPE
            assert all(m in matchers for m in needed), (
                f"{panel['title']}: {sample}{{{matchers}}} misses {needed}"
            )
        bare = re.findall(r"\b(headroom_[a-z_]+)\b(?![{\w])", expr)
        assert not bare, f"{panel['title']}: unfiltered {bare}"


def test_table_panels_ask_for_tables_and_overrides_match_queries_not_names():
    tables = 0
    for _, panel, target in _targets():
        if panel["type"] == "table":
            tables += 1
            assert target.get("format") == "table" and target["instant"], panel["title"]
        for override in panel["fieldConfig"]["overrides"]:
            matcher = override["matcher"]
            assert matcher["id"] != "byRegexp", f"{panel['title']}: override by display-name regex"
            if matcher["id"] == "byFrameRefID":
                assert matcher["options"] in {t["refId"] for t in panel["targets"]}, panel["title"]
    assert tables >= 3


def test_overview_opens_with_the_glance_row_and_shows_the_engine_ceiling_beside_the_knee():
    panels = BOARDS["headroom-capacity-overview.json"]["panels"]
    glance = panels[:6]
    assert [p["type"] for p in glance] == ["stat"] * 6
    assert all(p["gridPos"]["y"] == 0 and p["gridPos"]["h"] == 4 for p in glance)
    titles = " ".join(p["title"] for p in glance)
    for word in (
        "Requests: live ÷ knee",
        "Tokens: live ÷ knee p95",
        "engine ceiling",
        "pool",
        "burn",
        "alerts firing",
    ):
        assert word in titles
    ceiling = next(p for p in glance if "ceiling" in p["title"])
    exprs = " ".join(t["expr"] for t in ceiling["targets"])
    assert "headroom_engine_max_concurrency_requests" in exprs and "headroom_capacity_knee_requests" in exprs
    titles = [p["title"] for p in panels]
    assert any("End-to-end latency" in t for t in titles) and any("per sidecar" in t for t in titles)
    assert any("DCGM" in t for t in titles), "DCGM as an alternative GPU source"
    dcgm = next(p for p in panels if "DCGM" in p["title"])
    assert "DCGM_FI_DEV_GPU_UTIL" in dcgm["targets"][0]["expr"]


def test_dashboards_link_to_each_other_and_to_runbooks_and_annotate_alerts():
    for name, board in BOARDS.items():
        kinds = {link["type"]: link for link in board["links"]}
        assert kinds["dashboards"]["tags"] == ["llm-headroom"] and kinds["dashboards"]["includeVars"], name
        assert "runbooks" in kinds["link"]["url"], name
        (annotation,) = board["annotations"]["list"]
        assert annotation["expr"].startswith("ALERTS{") and 'alertstate="firing"' in annotation["expr"]
        assert 'job=~"$job"' in annotation["expr"], "annotations follow the selected sidecars' models"
    table = next(p for p in BOARDS["headroom-capacity-overview.json"]["panels"] if p["type"] == "table")
    (link,) = table["fieldConfig"]["overrides"][0]["properties"][0]["value"]
    assert "runbooks" in link["url"] and "__value.raw" in link["url"]


def test_new_capacity_names_only_no_deprecated_caliber_gauges():
    text = "".join(dashboard_files().values())
    assert "headroom_capacity_knee_requests" in text and "headroom_capacity_knee_tokens" in text
    assert not re.search(r"headroom_capacity_(knee|slo_max|recommended_pool)\{", text)
    assert "caliber=" not in text


def test_the_concurrency_panel_draws_the_token_knee_s_p95_beside_its_mean():
    """The mean of the active tokens at the knee is what averages are held to; the p95 is what an
    instantaneous limit (KEDA's token trigger, the gateway's) takes: both dashed, on the token axis."""
    panels = BOARDS["headroom-capacity-overview.json"]["panels"]
    panel = next(p for p in panels if p["title"].startswith("In-flight requests and active tokens"))
    by_ref = {t["refId"]: t for t in panel["targets"]}
    mean, p95 = by_ref["D"], by_ref["G"]
    assert "headroom_capacity_knee_tokens{" in mean["expr"] and mean["legendFormat"].endswith("knee (tokens)")
    assert "headroom_capacity_knee_tokens_p95{" in p95["expr"]
    assert p95["legendFormat"].endswith("knee p95 (tokens)")
    for ref in ("D", "G"):
        overrides = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == ref]
        ids = {prop["id"] for o in overrides for prop in o["properties"]}
        assert {"custom.axisPlacement", "custom.lineStyle"} <= ids, ref


def test_model_and_tenant_dropdowns_leave_out_the_idle_sidecars_placeholder():
    """Before its first request a sidecar exports headroom_inflight_requests{model="",tenant=""} 0
    (so sums read 0, not nothing); no dropdown may offer that empty model or tenant."""
    for name, board in BOARDS.items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        for label in ("model", "tenant"):
            if label in variables:
                query = variables[label]["query"]["query"]
                assert f'{label}!=""' in query and query.endswith(f", {label})"), (name, query)
        assert "model" in variables, name
