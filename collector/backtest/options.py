"""`headroom alerts backtest`'s options, each declared once with BacktestSettings' default.

The command (collector.backtest.cli) takes them as keyword arguments; `settings_from_options` turns
them into BacktestSettings, renaming the few whose field names its unit (`--scrape-interval` ->
`scrape_interval_s`), and `rules_options` picks out the shared rule options (--config and its
overrides, declared once in collector.alerts.cli.config_options) that make the RulesConfig. The
reader options (--lake, --catalog, --table) are declared once in collector.lake.source.reader_options.
tests/test_backtest_cli_options.py checks that every option's default is the settings' and that
every option reaches them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from collector.alerts.cli import config_options
from collector.lake.source import reader_options
from collector.terminal import JSON_HELP
from collector.timewin import WHEN, WHEN_HELP

__all__ = [
    "RENAMED",
    "RULES_OPTIONS",
    "BacktestSettings",
    "backtest_options",
    "rules_options",
    "settings_from_options",
]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class BacktestSettings:
    """What a backtest runs: built-in scenarios, or a window of a request log (--db, or the fleet's
    table with --lake) replayed; and what it writes."""

    scenario_names: tuple[str, ...] = ()
    run_all: bool = False
    list_only: bool = False
    db: str | None = None
    lake_uri: str | None = None
    catalog_uri: str | None = None
    lake_table: str = "headroom.requests"  # reader_options' --table
    since: datetime | None = None  # None: the log's first request
    until: datetime | None = None  # None: the log's last request
    model: str | None = None  # None: every model
    time_scale: float = 1.0  # 8 replays a log from `headroom sim --speed 8` in simulated time
    scrape_interval_s: float = 15.0  # the replayed series' scrape interval
    # None: the scenario's; a replay's collector.backtest.run.EVALUATION_INTERVAL_S
    evaluation_interval_s: float | None = None
    json_path: str | None = None
    plot_path: Path | None = None
    pending: bool = False
    table: bool = False  # --markdown
    workdir: Path | None = None  # None: a temporary directory, removed
    prometheus_bin: str | None = None  # None: prometheus on PATH
    promtool_bin: str | None = None  # None: promtool on PATH

    @property
    def replaying(self) -> bool:
        """Whether a request log is replayed (--db or --lake) rather than scenarios."""
        return bool(self.db or self.lake_uri)


# option -> BacktestSettings field, where the field names its unit
RENAMED = {"scrape_interval": "scrape_interval_s", "evaluation_interval": "evaluation_interval_s"}
# collector.alerts.cli.config_options': the RulesConfig's, by collector.alerts.cli.rules_config's
# parameter names
RULES_OPTIONS = ("config_path", "sidecar_job", "runbook_base_url", "labels", "cluster_label", "ruler")

_OPTIONS = [
    click.argument("scenario_names", metavar="[SCENARIO]...", nargs=-1),
    click.option("--all", "run_all", is_flag=True, help="Run every built-in scenario."),
    click.option("--list", "list_only", is_flag=True, help="List the built-in scenarios and exit."),
    click.option(
        "--db",
        default=BacktestSettings.db,
        metavar="PATH",
        help="Replay a DuckDB request log instead of a scenario (through its sidecar while one serves it).",
    ),
    reader_options,
    click.option(
        "--since",
        type=WHEN,
        default=BacktestSettings.since,
        help=f"Replay window start: {WHEN_HELP} [default: the log's first request].",
    ),
    click.option(
        "--until",
        type=WHEN,
        default=BacktestSettings.until,
        help="Replay window end, as --since [default: the log's last request].",
    ),
    click.option("--model", default=BacktestSettings.model, help="Replay one model only."),
    click.option(
        "--time-scale",
        type=float,
        default=BacktestSettings.time_scale,
        show_default=True,
        help="Stretch the log's time axis: 8 replays a log from `headroom sim --speed 8` in simulated time.",
    ),
    click.option(
        "--scrape-interval",
        type=float,
        default=BacktestSettings.scrape_interval_s,
        show_default=True,
        metavar="SECONDS",
        help="Scrape interval the replayed series are rebuilt at.",
    ),
    click.option(
        "--evaluation-interval",
        type=float,
        default=BacktestSettings.evaluation_interval_s,
        metavar="SECONDS",
        help="Rule evaluation interval [default: the scenario's, 30 s for a replay].",
    ),
    click.option("--json", "json_path", default=BacktestSettings.json_path, metavar="PATH", help=JSON_HELP),
    click.option(
        "--plot",
        "plot_path",
        type=click.Path(path_type=Path),
        default=BacktestSettings.plot_path,
        metavar="PATH",
        help="Write a PNG: calibers, SLO breaches and alert bands (a directory for several scenarios).",
    ),
    click.option("--pending", is_flag=True, help="Also list alerts that went pending but never fired."),
    click.option(
        "--markdown",
        "table",
        is_flag=True,
        help="End with the markdown table of docs/rules.md for these results.",
    ),
    click.option(
        "--workdir",
        type=click.Path(file_okay=False, path_type=Path),
        default=BacktestSettings.workdir,
        help="Keep Prometheus' data and log here (default: a temporary directory, removed).",
    ),
    click.option(
        "--prometheus",
        "prometheus_bin",
        default=BacktestSettings.prometheus_bin,
        metavar="PATH",
        help="The prometheus binary.",
    ),
    click.option(
        "--promtool",
        "promtool_bin",
        default=BacktestSettings.promtool_bin,
        metavar="PATH",
        help="The promtool binary.",
    ),
    config_options,
]


def backtest_options(command: F) -> F:
    """Attach every `headroom alerts backtest` argument and option, in --help order."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def settings_from_options(options: dict[str, Any]) -> BacktestSettings:
    """The BacktestSettings of the command's options (all but RULES_OPTIONS')."""
    return BacktestSettings(
        **{RENAMED.get(name, name): value for name, value in options.items() if name not in RULES_OPTIONS}
    )


def rules_options(options: dict[str, Any]) -> dict[str, Any]:
    """The rule options (RULES_OPTIONS), as collector.alerts.cli.rules_config takes them."""
    return {name: options[name] for name in RULES_OPTIONS}
