"""The cluster label in every aggregation, join and grouping: central rulers never merge clusters.

The behaviour on series (5 and 7, never 12; the knee alert and the absence alert for one cluster
only) is proven by promtool in alerts/headroom.test.yaml and on real central rulers in
tests/test_central_rulers.py; here, the text of what is generated.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from collector.alerts.files import alert_files, rule_files
from collector.dashboards.files import dashboard_files
from collector.rules.cluster import keep_cluster, label_lists
from collector.rules.config import DEFAULT, ConfigError

SINGLE_CLUSTER = Path(__file__).parent / "fixtures" / "single-cluster"
ONE_CLUSTER = dataclasses.replace(DEFAULT, cluster_label="")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("sum by (model) (x)", "sum by (cluster, model) (x)"),
        ("a / on (model) group_left () b", "a / on (cluster, model) group_left () b"),
        ("count(up)", "count by (cluster) (up)"),
        ("max by () (x)", "max by (cluster) (x)"),
        ("sum by (cluster, model) (x)", "sum by (cluster, model) (x)"),
        ("a unless ignoring (tenant) b", "a unless ignoring (tenant) b"),
        ("sum without (tenant) (x)", "sum without (tenant) (x)"),
        ('x{path="sum by (model) (y)"}', 'x{path="sum by (model) (y)"}'),
        ("clamp_max(min_over_time(x[5m]), 1) and on(model) group_left y", None),
    ],
)
def test_keep_cluster_adds_the_label_where_an_aggregation_or_join_would_drop_it(expr, expected):
    if expected is None:
        expected = "clamp_max(min_over_time(x[5m]), 1) and on(cluster, model) group_left y"
    assert keep_cluster(expr, "cluster") == expected
    assert keep_cluster(expr, "") == expr


def test_a_stat_over_the_selection_stays_one_number_on_dashboards():
    assert (
        keep_cluster("max(sum by (instance) (x))", "cluster", bare=False)
        == "max(sum by (cluster, instance) (x))"
    )


def _exprs(files: dict[str, str]) -> list[tuple[str, str]]:
    found = []
    for name in ("headroom-recording.rules.yaml", "headroom-alerts.rules.yaml"):
        for group in yaml.safe_load(files[name])["groups"]:
            for rule in group["rules"]:
                found.append((rule.get("record") or rule["alert"], rule["expr"]))
    return found


def test_every_by_and_on_of_every_generated_rule_names_the_cluster():
    exprs = _exprs(rule_files(DEFAULT))
    clauses = [(name, kind, labels) for name, expr in exprs for kind, labels in label_lists(expr)]
    assert len(clauses) > 100
    missing = [(name, kind, labels) for name, kind, labels in clauses if "cluster" not in labels]
    assert missing == []


def test_a_cluster_label_of_another_name_is_kept_instead():
    config = dataclasses.replace(DEFAULT, cluster_label="k8s_cluster")
    for name, expr in _exprs(rule_files(config)):
        assert all("k8s_cluster" in labels for _, labels in label_lists(expr)), name
        assert "by (cluster" not in expr and "on (cluster" not in expr, name
    boards = [json.loads(text) for text in dashboard_files(config).values()]
    for board in boards:
        cluster = next(v for v in board["templating"]["list"] if v["name"] == "cluster")
        assert cluster["multi"] and cluster["includeAll"]
        assert cluster["definition"].endswith(", k8s_cluster)")
        for panel in board["panels"]:
            for target in panel.get("targets", ()):
                assert 'cluster=~"$cluster"' not in target["expr"].replace('k8s_cluster=~"$cluster"', "")
                assert 'k8s_cluster=~"$cluster"' in target["expr"], panel["title"]


def _by_name(text: str) -> dict[str, str]:
    """Each rule (or test group, or panel) of a generated file as its own YAML/JSON text, by name."""
    if text.lstrip().startswith("{"):
        board = json.loads(text)
        # a panel added above moves the others down: compare what they show, not where
        panels = {
            f"panel {p['title']}": json.dumps({k: v for k, v in p.items() if k not in ("gridPos", "id")})
            for p in board.pop("panels")
        }
        return panels | {"board": json.dumps(board, sort_keys=True)}
    document = yaml.safe_load(text.split("\n", 1)[1])
    if "groups" in document:
        rules: dict[str, str] = {}
        for group in document["groups"]:
            for rule in group["rules"]:
                name = f"{group['name']}/{rule.get('record') or rule['alert']}"
                # several rules share an alert name (one per SLO class): number them within it
                index = sum(key.startswith(name + "/") for key in rules)
                rules[f"{name}/{index}"] = yaml.safe_dump(rule)
        return rules
    if "tests" in document:
        return {f"test {test['name']}": yaml.safe_dump(test) for test in document["tests"]}
    return {"document": yaml.safe_dump(document)}


def test_an_empty_cluster_label_keeps_every_rule_and_panel_of_the_single_cluster_build_byte_for_byte():
    """tests/fixtures/single-cluster holds the files as generated before the cluster label existed.

    With `cluster_label: ""` every rule, promtool test, panel and the Alertmanager config of that
    build comes out unchanged; what is new is only added (the fleet records, their alert, tests
    and panel), never a change to what single-cluster users run. Replica classes (#33) changed
    the fixture where they had to: the knee ratio and the capacity panels join each sidecar to its
    class's knee (alerts on the ratio gain replica_class="default"; their tests say so), and the
    class record and its tests are added. The $model and $tenant variables skip the placeholder
    series' empty values (#40), a change single-cluster users get too, as is the token knee's p95
    line beside its mean in the concurrency panel and the glance stat of live tokens over that
    p95 (docs/domain.md §12). Goodput added its records (attainment, token goodput, the engine's
    V_P and prefix-cache hit rate), its burn alerts, their tests and its panels.
    """
    generated = alert_files(ONE_CLUSTER) | dashboard_files(ONE_CLUSTER)
    added = set()
    for path in sorted(SINGLE_CLUSTER.iterdir()):
        before, now = _by_name(path.read_text()), _by_name(generated[path.name])
        changed = [key for key in before if before[key] != now.get(key)]
        assert changed == [], f"{path.name}: {changed}"
        added |= {f"{path.name}: {key}" for key in set(now) - set(before)}
    new = ("fleet", "replica", "lake", "goodput", "prefill", "prompt_cache", "ttft went")
    assert all(any(w in key.lower() for w in new) for key in added), sorted(added)
    assert any("HeadroomFleetHeadroomLow" in key for key in added)


def test_the_committed_alertmanager_config_groups_and_inhibits_per_cluster():
    manager = yaml.safe_load((Path(__file__).parent.parent / "alerts" / "alertmanager.yml").read_text())
    assert manager["route"]["group_by"] == ["cluster", "model"]
    assert all("cluster" in rule["equal"] for rule in manager["inhibit_rules"])


def test_vmalert_rules_drop_keep_firing_for_and_prometheus_rules_keep_it():
    prometheus = rule_files(DEFAULT)["headroom-alerts.rules.yaml"]
    vmalert = rule_files(dataclasses.replace(DEFAULT, ruler="vmalert"))["headroom-alerts.rules.yaml"]
    assert "keep_firing_for:" in prometheus and "keep_firing_for:" not in vmalert
    assert prometheus.replace("keep_firing_for", "") != vmalert


def test_an_extra_cluster_label_means_the_edge_of_one_cluster():
    edge = dataclasses.replace(DEFAULT, extra_labels={"cluster": "prod-eu"})
    assert edge.cluster_by == ""
    assert all("cluster" not in labels for _, e in _exprs(rule_files(edge)) for _, labels in label_lists(e))


@pytest.mark.parametrize("label", ["model", "le", "1cluster", "a-b"])
def test_a_cluster_label_that_would_clash_or_is_no_label_is_refused(label):
    with pytest.raises(ConfigError, match="cluster_label"):
        dataclasses.replace(DEFAULT, cluster_label=label).validate()


def test_the_config_file_and_the_flags_take_the_cluster_label_and_the_ruler(tmp_path):
    from click.testing import CliRunner

    from collector.cli import main
    from collector.rules.config_file import config_from_dict

    config = config_from_dict({"cluster_label": "k8s_cluster", "ruler": "vmalert"})
    assert (config.cluster_label, config.ruler, config.keeps_firing) == ("k8s_cluster", "vmalert", {})
    with pytest.raises(ConfigError, match="ruler"):
        config_from_dict({"ruler": "thanos"})
    out = tmp_path / "one"
    result = CliRunner().invoke(main, ["alerts", "generate", "--cluster-label", "", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "headroom-alerts.rules.yaml").read_text() == alert_files(ONE_CLUSTER)[
        "headroom-alerts.rules.yaml"
    ]
    result = CliRunner().invoke(main, ["alerts", "generate", "--ruler", "vmalert", "--out", str(out)])
    assert result.exit_code == 0 and "keep_firing_for" not in (out / "headroom-alerts.rules.yaml").read_text()
    boards = tmp_path / "boards"
    result = CliRunner().invoke(
        main, ["dashboards", "generate", "--cluster-label", "kc", "--out", str(boards)]
    )
    assert result.exit_code == 0, result.output
    assert 'kc=~\\"$cluster\\"' in (boards / "headroom-capacity-overview.json").read_text()
