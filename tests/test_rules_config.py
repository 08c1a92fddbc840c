"""Tuning without editing code: the YAML rules config, its errors, and what it regenerates.

The example file in docs/rules.md ("Configuration file") is the one tested: it sets a per-model
SLO, a batch model without a TTFT SLO, a custom job name, a cluster label and real receivers, and
the rules it regenerates pass promtool's checks and unit tests, amtool's config check, and the
backtests of the ramp and the engine outage.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import require_tool
from support.waiting import patient

from collector.alerts.files import ALERTS_FILE, TEST_FILE, alert_files
from collector.backtest.report import render_text
from collector.backtest.run import run_scenario
from collector.backtest.scenarios import SCENARIOS
from collector.cli import main
from collector.rules.config import DEFAULT, ConfigError, Slo
from collector.rules.config_file import config_from_dict, load_config
from collector.rules.render import write_files

ROOT = Path(__file__).resolve().parent.parent


def documented_example() -> str:
    text = (ROOT / "docs" / "rules.md").read_text()
    return re.search(r"A whole file.*?```yaml\n(.*?)```", text, re.S).group(1)


@pytest.fixture
def example(tmp_path) -> Path:
    path = tmp_path / "alerts.yaml"
    path.write_text(documented_example())
    return path


def test_the_documented_example_sets_every_section(example):
    config = load_config(example)
    assert config.sidecar_job == "llm-sidecar" and config.job_selector == 'job="llm-sidecar"'
    assert config.runbook_base_url.startswith("https://git.example.com/")
    assert config.extra_labels == {"cluster": "prod-eu"}
    assert config.slo_for("llama-70b") == Slo(3.0, 0.99, 120.0, 0.99, 0.999)
    assert config.slo_for("batch-embedder").ttft_seconds is None
    assert config.slo_for("anything-else") == DEFAULT.default_slo
    assert config.for_durations["HeadroomQueueNotDraining"] == "10m"
    assert config.for_durations["HeadroomSidecarDown"] == DEFAULT.for_durations["HeadroomSidecarDown"]
    assert config.keep_firing_for["HeadroomKVCacheNearFull"] == "5m"
    assert set(config.receivers) == {"page", "ticket"}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"sidecar": "x"}, "unknown key(s) sidecar"),
        ({"thresholds": {"knee_warnings_ratio": 0.8}}, "unknown key(s) knee_warnings_ratio"),
        ({"slo": {"ttft_seconds": 1.7}}, "not a TTFT histogram bucket"),
        ({"models": {"m": {"ttft_seconds": 1.7}}}, "SLO of m: ttft_seconds=1.7"),
        ({"models": {"m": {"ttft_objective": None}}}, "ttft_objective cannot be null"),
        ({"for": {"HeadroomQueueNotDraining": "ten minutes"}}, "'ten minutes' is not a Prometheus duration"),
        ({"for": {"HeadroomNoSuchAlert": "5m"}}, "unknown key(s) HeadroomNoSuchAlert"),
        ({"extra_labels": {"bad-name": "x"}}, "not a usable label name"),
        ({"thresholds": {"knee_warning_ratio": "high"}}, "must be a number"),
        ({"receivers": {"page": {"url": "http://x"}}}, "Alertmanager receiver body"),
        ({"slo": []}, "must be a mapping"),
    ],
)
def test_errors_name_the_key_and_what_would_do(data, message):
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data)
    assert message in str(caught.value)


def test_unreadable_and_invalid_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match="cannot read --config .*missing.yaml"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("slo: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml is not valid YAML"):
        load_config(broken)


def test_generate_with_the_config_and_flags(example, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        [
            "alerts",
            "generate",
            "--config",
            str(example),
            "--out",
            str(out),
            "--label",
            "team=llm",
            "--sidecar-job",
            "edge-sidecar",
        ],
    )
    assert result.exit_code == 0, result.output
    groups = yaml.safe_load((out / ALERTS_FILE).read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert all(rule["labels"]["cluster"] == "prod-eu" and rule["labels"]["team"] == "llm" for rule in rules)
    assert (
        next(r for r in rules if r["alert"] == "HeadroomSidecarDown")["expr"] == 'up{job="edge-sidecar"} == 0'
    )
    classes = {r["labels"].get("slo_class") for r in rules if r["alert"] == "HeadroomTTFTBudgetBurnFast"}
    assert classes == {"default", "llama-70b"}, "batch-embedder has no TTFT SLO, so no TTFT rule"
    bad = CliRunner().invoke(main, ["alerts", "generate", "--label", "novalue", "--out", str(out)])
    assert bad.exit_code == 2 and "'novalue' is not NAME=VALUE" in bad.output
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("thresholds: {kv_warning_ratio: 2}\n")
    refused = CliRunner().invoke(main, ["alerts", "generate", "--config", str(wrong), "--out", str(out)])
    assert refused.exit_code == 2 and "wrong.yaml" in refused.output and "kv_warning_ratio" in refused.output


@pytest.mark.integration
@pytest.mark.timeout(patient(150))  # `promtool test rules` on the example takes a minute on a quiet host
def test_the_example_regenerates_rules_that_promtool_and_amtool_accept(example, tmp_path):
    promtool, amtool = require_tool("promtool"), require_tool("amtool")
    write_files(alert_files(load_config(example)), tmp_path)
    files = sorted(str(p) for p in tmp_path.glob("*.rules.yaml"))
    for command in (
        [promtool, "check", "rules", *files],
        [promtool, "test", "rules", TEST_FILE],
        [amtool, "check-config", "alertmanager.yml"],
    ):
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=patient(120))
        assert result.returncode == 0, result.stdout + result.stderr
    manager = yaml.safe_load((tmp_path / "alertmanager.yml").read_text())
    kinds = {r["name"]: sorted(k for k in r if k.endswith("_configs")) for r in manager["receivers"]}
    assert kinds == {"page": ["pagerduty_configs"], "ticket": ["slack_configs"]}
    tests = yaml.safe_load((tmp_path / TEST_FILE).read_text())["tests"]
    assert any(
        'le="3.0"' in s["series"] and 'model="llama-70b"' in s["series"]
        for group in tests
        for s in group["input_series"]
    ), "the per-model SLO has its own promtool case"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["ramp", "engine_outage"])
def test_the_example_passes_the_backtests(example, tmp_path, scenario):
    require_tool("prometheus")
    config = load_config(example)
    result = run_scenario(SCENARIOS[scenario], config, tmp_path)
    assert result.passed, render_text(result)
    alerting = {s.labels.get("slo_class") for s in result.timeline.fired if "BudgetBurn" in s.name}
    assert alerting <= {"llama-70b"}, "the scenarios' model is judged by its own SLO"
    assert all(s.labels["cluster"] == "prod-eu" for s in result.timeline.fired)
