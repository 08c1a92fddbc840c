"""`headroom alerts backtest`'s options: each declared once, with BacktestSettings' default, and
each reaching it (the rule options the RulesConfig)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import click
import pytest
from support.clickopts import passed_options

from collector.alerts.cli import rules_config
from collector.backtest.cli import backtest
from collector.backtest.options import (
    RENAMED,
    RULES_OPTIONS,
    BacktestSettings,
    rules_options,
    settings_from_options,
)
from collector.backtest.run import EVALUATION_INTERVAL_S
from collector.rules.config import DEFAULT

FIELDS = {f.name: f for f in dataclasses.fields(BacktestSettings)}
PARAMS = [p for p in backtest.params if p.name not in RULES_OPTIONS]  # the SCENARIO argument too


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("HEADROOM_CATALOG", raising=False)


def _defaults(**given: object) -> dict[str, object]:
    """What click passes `backtest` with nothing on the command line, updated by `given`."""
    return passed_options(backtest, [], **given)


def test_every_parameter_is_a_setting_or_a_rule_option():
    names = {p.name for p in backtest.params}
    assert set(RULES_OPTIONS) <= names, "RULES_OPTIONS names an option backtest lacks"
    assert {RENAMED.get(p.name, p.name) for p in PARAMS} == set(FIELDS), "options and fields differ"


@pytest.mark.parametrize("param", PARAMS, ids=lambda p: p.name)
def test_every_option_has_the_settings_default(param):
    field = FIELDS[RENAMED.get(param.name, param.name)]
    given = _defaults()[param.name]  # what click passes when the option is not given
    default = tuple(given) if param.multiple or param.nargs == -1 else given
    assert default == field.default, (
        f"--{param.name}: {default!r} here, {field.default!r} in BacktestSettings"
    )


def test_the_defaults_make_the_settings_and_rules_defaults():
    defaults = _defaults()
    assert settings_from_options(defaults) == BacktestSettings()
    assert rules_config(**rules_options(defaults)) == DEFAULT


def test_the_replay_evaluation_interval_help_is_runs():
    """--evaluation-interval's help names the interval a replay runs at without it."""
    (option,) = [p for p in backtest.params if p.name == "evaluation_interval"]
    assert f"{EVALUATION_INTERVAL_S:g} s for a replay" in str(option.help)


def test_options_reach_the_settings_renamed():
    since = datetime(2026, 11, 24, 9, tzinfo=UTC)
    settings = settings_from_options(
        _defaults(
            scenario_names=("ramp",),
            db="x.duckdb",
            since=since,
            scrape_interval=5.0,
            evaluation_interval=10.0,
            time_scale=8.0,
            table=True,
            plot_path=Path("p.png"),
            config_path=Path("alerts.yaml"),
        )
    )
    assert settings.scenario_names == ("ramp",) and settings.db == "x.duckdb" and settings.since == since
    assert (settings.scrape_interval_s, settings.evaluation_interval_s, settings.time_scale) == (
        5.0,
        10.0,
        8.0,
    )
    assert settings.table and settings.plot_path == Path("p.png") and settings.replaying
    assert not settings_from_options(_defaults()).replaying
    assert settings_from_options(_defaults(lake_uri="/tmp/lake")).replaying


def test_the_rule_options_reach_the_rules_config():
    config = rules_config(
        **rules_options(_defaults(sidecar_job="sc", labels=("cluster=eu",), ruler="vmalert"))
    )
    assert (config.sidecar_job, config.ruler) == ("sc", "vmalert")
    assert config.extra_labels == {"cluster": "eu"}
    with pytest.raises(click.BadParameter):
        rules_config(**rules_options(_defaults(labels=("nope",))))
