"""The real promtool and amtool judge the committed rules, their unit tests and every dashboard query."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import require_tool
from support.waiting import patient

from collector.alerts.files import TEST_FILE, alert_files, rule_files
from collector.dashboards.files import dashboard_files
from collector.rules.config import DEFAULT
from collector.rules.render import write_files

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "alerts"
pytestmark = pytest.mark.integration

# Dashboard variables as a test substitutes them: every regex variable matches everything.
VARIABLES = {
    "$model": ".*",
    "$instance": ".*",
    "$tenant": ".*",
    "$cluster": ".*",
    "$namespace": ".*",
    "$job": ".*",
    "$__rate_interval": "1m",
}


def substitute(expr: str) -> str:
    """A dashboard query with its Grafana variables replaced so Prometheus can run it."""
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def dashboard_queries() -> list[tuple[str, str, str, str]]:
    """(dashboard uid, panel title, refId, runnable expr) for every panel target."""
    rows = []
    for text in dashboard_files().values():
        board = json.loads(text)
        for panel in board["panels"]:
            for t in panel["targets"]:
                rows.append((board["uid"], panel["title"], t["refId"], substitute(t["expr"])))
    return rows


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=patient(120))


def test_promtool_check_rules_passes_on_committed_rules():
    promtool = require_tool("promtool")
    files = sorted(str(p) for p in ALERTS.glob("*.rules.yaml"))
    assert len(files) == 2
    result = _run(promtool, "check", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 2


@pytest.mark.timeout(patient(150))  # `promtool test rules` on the committed cases: a minute on a quiet host
def test_promtool_unit_tests_pass_on_committed_rules():
    promtool = require_tool("promtool")
    result = _run(promtool, "test", "rules", TEST_FILE, cwd=ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.timeout(patient(150))
def test_promtool_unit_tests_catch_a_missing_for_duration(tmp_path):
    """The before-`for:` checks bite: the committed tests fail on rules where every alert fires at once."""
    promtool = require_tool("promtool")
    instant = dataclasses.replace(DEFAULT, for_durations={name: "0s" for name in DEFAULT.for_durations})
    write_files(rule_files(instant) | {TEST_FILE: alert_files()[TEST_FILE]}, tmp_path)
    result = _run(promtool, "test", "rules", TEST_FILE, cwd=tmp_path)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    failed = {
        line.split(",")[0].split(":")[1].strip() for line in output.splitlines() if "alertname:" in line
    }
    assert failed == set(DEFAULT.for_durations), output[-3000:]  # every alert, not most


def test_amtool_accepts_config_and_routes_page_vs_ticket():
    amtool = require_tool("amtool")
    config = str(ALERTS / "alertmanager.yml")
    result = _run(amtool, "check-config", config)
    assert result.returncode == 0, result.stdout + result.stderr
    for labels, receiver in (
        (["severity=critical", "alertname=HeadroomKVCacheExhausted", "model=m"], "page"),
        (["severity=warning", "alertname=HeadroomKVCacheNearFull", "model=m"], "ticket"),
    ):
        routed = _run(amtool, "config", "routes", "test", f"--config.file={config}", *labels)
        assert routed.returncode == 0 and routed.stdout.strip() == receiver, routed.stdout + routed.stderr


def _check_as_rules(promtool: str, exprs: list[str], directory: Path) -> subprocess.CompletedProcess:
    rules = [{"record": f"dashboard:query:check{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = directory / "queries.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    return _run(promtool, "check", "rules", str(path))


def test_every_dashboard_query_parses_as_promql(tmp_path):
    promtool = require_tool("promtool")
    queries = [expr for *_, expr in dashboard_queries()]
    assert len(queries) >= 30
    result = _check_as_rules(promtool, queries, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout
    broken = _check_as_rules(promtool, ["sum by (model) (rate(headroom_requests_total[5m])"], tmp_path)
    assert broken.returncode != 0, "the parse check must reject a broken query"
