"""`headroom alerts`: the group (`generate` from collector.alerts.cli, `backtest` here).

`backtest` replays built-in scenarios, or a window of a request log, through the generated rules
on a real Prometheus (prometheus and promtool on PATH) and prints each timeline; `--json` and
`--plot` write the same for machines and people. With scenarios it exits 1 when one misses what it
expects (docs/rules.md, "How good are these alerts").
"""

from __future__ import annotations

import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from collector.alerts.cli import GROUP_HELP, config_options, generate_alerts, rules_config
from collector.lake.source import reader_options
from collector.terminal import JSON_HELP, json_output, write_json
from collector.timewin import WHEN, WHEN_HELP

if TYPE_CHECKING:  # annotations only: the modules themselves load lazily, when a backtest runs
    from collector.backtest.replay import ReplayLog
    from collector.backtest.run import BacktestResult
    from collector.backtest.scenario import Scenario
    from collector.rules.config import RulesConfig

__all__ = ["alerts", "backtest"]


def _scenarios(names: tuple[str, ...], run_all: bool) -> list[Scenario]:
    from collector.backtest.scenarios import SCENARIOS  # lazy: keeps `--help` free of the simulator

    if run_all:
        return list(SCENARIOS.values())
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise click.BadParameter(
            f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)} (or --list)",
            param_hint="SCENARIO",
        )
    return [SCENARIOS[name] for name in names]


def _replay(
    config: RulesConfig,
    workdir: Path,
    source: dict[str, Any],
    scrape_s: float,
    evaluation_s: float,
    binaries: dict[str, str | None],
) -> BacktestResult:
    # lazy: DuckDB and the replay code only load when a log is replayed
    from collector.backtest.replay import (
        ReplayError,
        from_db,
        missing_series,
        replay_series,
        stretched,
    )
    from collector.backtest.run import generated_rules, run_series  # lazy, as above

    try:
        if source["lake"] and source["since"] is None:
            raise ReplayError("--lake needs --since (e.g. --since 24h): the table holds the whole fleet")
        log = from_db(
            source["db"],
            source["since"],
            source["until"],
            source["model"],
            catalog=source["catalog"],
            lake=source["lake"],
            table=source["lake_table"],
        )
        log = stretched(log, source["time_scale"])
    except ReplayError as exc:
        raise click.ClickException(str(exc)) from None
    rules = generated_rules(config)
    series = replay_series(log, config.sidecar_job, scrape_s)
    result = run_series(
        "replay",
        f"{log.source}, {len(log.records)} requests",
        series,
        log.records,
        log.start,
        log.end,
        config,
        workdir,
        rules=rules,
        scrape_interval_s=scrape_s,
        interval_s=evaluation_s,
        knee=_knees(log),
        prometheus=binaries["prometheus"],
        promtool=binaries["promtool"],
    )
    needed, blind = missing_series(rules.alerts(), rules.records())
    result.missing = (
        needed + [f"(cannot fire here: {', '.join(blind)})"] + log.notes if blind else needed + log.notes
    )
    return result


def _knees(log: ReplayLog) -> dict[str, float]:
    knees: dict[str, float] = {}
    for capacity in log.capacities:
        if capacity.knee_requests:
            knees["requests"] = capacity.knee_requests
        if capacity.knee_tokens:
            knees["tokens"] = capacity.knee_tokens
    return knees


def _write_outputs(results: list[BacktestResult], json_path: str | None, plot_path: Path | None) -> None:
    from collector.backtest.report import to_json  # lazy, as above

    if json_path:
        write_json(json_path, [to_json(r) for r in results] if len(results) > 1 else to_json(results[0]))
    if plot_path:
        from collector.backtest.plot import plot_backtest  # lazy: matplotlib

        for result in results:
            target = plot_path if len(results) == 1 else plot_path / f"{result.name}.png"
            plot_backtest(result, target, replicas=result.replicas)
            click.echo(f"wrote {target}", err=True)


@click.command("backtest")
@click.argument("scenario_names", metavar="[SCENARIO]...", nargs=-1)
@click.option("--all", "run_all", is_flag=True, help="Run every built-in scenario.")
@click.option("--list", "list_only", is_flag=True, help="List the built-in scenarios and exit.")
@click.option(
    "--db",
    default=None,
    metavar="PATH",
    help="Replay a DuckDB request log instead of a scenario (through its sidecar while one serves it).",
)
@reader_options
@click.option(
    "--since",
    type=WHEN,
    default=None,
    help=f"Replay window start: {WHEN_HELP} [default: the log's first request].",
)
@click.option(
    "--until",
    type=WHEN,
    default=None,
    help="Replay window end, as --since [default: the log's last request].",
)
@click.option("--model", default=None, help="Replay one model only.")
@click.option(
    "--time-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Stretch the log's time axis: 8 replays a log from `headroom sim --speed 8` in simulated time.",
)
@click.option(
    "--scrape-interval",
    type=float,
    default=15.0,
    show_default=True,
    metavar="SECONDS",
    help="Scrape interval the replayed series are rebuilt at.",
)
@click.option(
    "--evaluation-interval",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Rule evaluation interval [default: the scenario's, 30 s for a replay].",
)
@click.option("--json", "json_path", default=None, metavar="PATH", help=JSON_HELP)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(path_type=Path),
    default=None,
    metavar="PATH",
    help="Write a PNG: calibers, SLO breaches and alert bands (a directory for several scenarios).",
)
@click.option("--pending", is_flag=True, help="Also list alerts that went pending but never fired.")
@click.option(
    "--markdown",
    "table",
    is_flag=True,
    help="End with the markdown table of docs/rules.md for these results.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep Prometheus' data and log here (default: a temporary directory, removed).",
)
@click.option("--prometheus", "prometheus_bin", default=None, metavar="PATH", help="The prometheus binary.")
@click.option("--promtool", "promtool_bin", default=None, metavar="PATH", help="The promtool binary.")
@config_options
def backtest(
    scenario_names: tuple[str, ...],
    run_all: bool,
    list_only: bool,
    db: str | None,
    lake_uri: str | None,
    catalog_uri: str | None,
    lake_table: str,
    since: datetime | None,
    until: datetime | None,
    model: str | None,
    time_scale: float,
    scrape_interval: float,
    evaluation_interval: float | None,
    json_path: str | None,
    plot_path: Path | None,
    pending: bool,
    table: bool,
    workdir: Path | None,
    prometheus_bin: str | None,
    promtool_bin: str | None,
    config_path: Path | None,
    sidecar_job: str | None,
    runbook_base_url: str | None,
    labels: tuple[str, ...],
    cluster_label: str | None,
    ruler: str | None,
) -> None:
    """Replay scenarios or your request log through the generated rules on a real Prometheus.

    \b
    Examples:
      headroom alerts backtest --list
      headroom alerts backtest ramp --plot ramp.png
      headroom alerts backtest --all --json results.json
      headroom alerts backtest steady --config alerts.yaml
      headroom alerts backtest --db headroom.duckdb --since 2026-11-24T09:00 --until 2026-11-24T12:00
      headroom alerts backtest --catalog "$HEADROOM_CATALOG" --lake s3://llm-logs/headroom --since 24h --model llama-70b

    Prints, per scenario, when each alert went pending, fired and resolved, the first SLO breach
    the rows show, the lead time of the first warning and page, and every alert outside a real
    problem (FALSE). Needs prometheus and promtool (make tools). Exits 1 when a scenario misses
    one of its expectations.
    """
    # lazy: the simulator, Prometheus' client and the rules load only when a backtest runs (`--help` stays fast)
    from collector.backtest.prometheus import PrometheusError
    from collector.backtest.report import render_text, scenario_table
    from collector.backtest.run import run_scenario

    if list_only:
        from collector.backtest.scenarios import SCENARIOS  # lazy, as above

        for name, scenario in SCENARIOS.items():
            click.echo(f"{name:<22}{scenario.summary}")
        return
    replaying = bool(db or lake_uri)
    if replaying and (scenario_names or run_all):
        raise click.UsageError("give scenarios or a log (--db / --lake), not both")
    if db and lake_uri:
        raise click.UsageError("give --db or --lake, not both")
    if not replaying and not scenario_names and not run_all:
        raise click.UsageError("name a scenario (see --list), --all, or a log with --db / --lake")
    if not scrape_interval > 0 or (evaluation_interval is not None and not evaluation_interval > 0):
        raise click.BadParameter(
            "intervals must be positive seconds, e.g. 15", param_hint="--scrape-interval"
        )
    config = rules_config(config_path, sidecar_job, runbook_base_url, labels, cluster_label, ruler)
    binaries = {"prometheus": prometheus_bin, "promtool": promtool_bin}
    results = []
    with tempfile.TemporaryDirectory(prefix="headroom-backtest-") as scratch:
        base = workdir or Path(scratch)
        try:
            if replaying:
                source = {
                    "db": db,
                    "lake": lake_uri,
                    "catalog": catalog_uri,
                    "lake_table": lake_table,
                    "model": model,
                    "since": since,
                    "until": until,
                    "time_scale": time_scale,
                }
                click.echo(f"replaying {db or lake_uri} ...", err=True)
                results.append(
                    _replay(
                        config,
                        base / "replay",
                        source,
                        scrape_interval,
                        evaluation_interval or 30.0,
                        binaries,
                    )
                )
            else:
                for scenario in _scenarios(scenario_names, run_all):
                    click.echo(f"running {scenario.name} ...", err=True)
                    results.append(
                        run_scenario(
                            scenario,
                            config,
                            base / scenario.name,
                            interval_s=evaluation_interval,
                            prometheus=prometheus_bin,
                            promtool=promtool_bin,
                        )
                    )
        except PrometheusError as exc:
            raise click.ClickException(str(exc)) from None
        with json_output(json_path):  # `--json -`: the timelines on stderr, the JSON alone on stdout
            for result in results:
                click.echo(render_text(result, pending=pending) + "\n")
            if table:
                click.echo(scenario_table(results))
        _write_outputs(results, json_path, plot_path)
    if not all(result.passed for result in results):
        sys.exit(1)


alerts = click.Group("alerts", commands=[generate_alerts, backtest], help=GROUP_HELP)
