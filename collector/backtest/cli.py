"""`headroom alerts`: the group (`generate` from collector.alerts.cli, `backtest` here).

`backtest` replays built-in scenarios, or a window of a request log, through the generated rules
on a real Prometheus (prometheus and promtool on PATH) and prints each timeline; `--json` and
`--plot` write the same for machines and people. With scenarios it exits 1 when one misses what it
expects (docs/rules.md, "How good are these alerts").
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from collector.alerts.cli import GROUP_HELP, generate_alerts, rules_config
from collector.backtest.options import (
    BacktestSettings,
    backtest_options,
    rules_options,
    settings_from_options,
)
from collector.terminal import json_output, write_json

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


def _replay(config: RulesConfig, workdir: Path, settings: BacktestSettings) -> BacktestResult:
    """The backtest of the request log `settings` names (--db or --lake), replayed."""
    # lazy: DuckDB and the replay code only load when a log is replayed
    from collector.backtest.exposition import goodput_slo
    from collector.backtest.replay import (
        ReplayError,
        from_db,
        missing_series,
        replay_series,
        stretched,
    )
    from collector.backtest.run import EVALUATION_INTERVAL_S, generated_rules, run_series  # lazy, as above

    scrape_s = settings.scrape_interval_s
    try:
        if settings.lake_uri and settings.since is None:
            raise ReplayError("--lake needs --since (e.g. --since 24h): the table holds the whole fleet")
        log = from_db(
            settings.db,
            settings.since,
            settings.until,
            settings.model,
            catalog=settings.catalog_uri,
            lake=settings.lake_uri,
            table=settings.lake_table,
        )
        log = stretched(log, settings.time_scale)
    except ReplayError as exc:
        raise click.ClickException(str(exc)) from None
    rules = generated_rules(config)
    series = replay_series(log, config.sidecar_job, scrape_s, goodput_slo(config))
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
        interval_s=settings.evaluation_interval_s or EVALUATION_INTERVAL_S,
        knee=_knees(log),
        prometheus=settings.prometheus_bin,
        promtool=settings.promtool_bin,
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
@backtest_options
def backtest(**options: Any) -> None:  # click passes each option by its name (collector.backtest.options)
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

    settings = settings_from_options(options)
    if settings.list_only:
        from collector.backtest.scenarios import SCENARIOS  # lazy, as above

        for name, scenario in SCENARIOS.items():
            click.echo(f"{name:<22}{scenario.summary}")
        return
    if settings.replaying and (settings.scenario_names or settings.run_all):
        raise click.UsageError("give scenarios or a log (--db / --lake), not both")
    if settings.db and settings.lake_uri:
        raise click.UsageError("give --db or --lake, not both")
    if not settings.replaying and not settings.scenario_names and not settings.run_all:
        raise click.UsageError("name a scenario (see --list), --all, or a log with --db / --lake")
    evaluation_interval = settings.evaluation_interval_s
    if not settings.scrape_interval_s > 0 or (
        evaluation_interval is not None and not evaluation_interval > 0
    ):
        raise click.BadParameter(
            "intervals must be positive seconds, e.g. 15", param_hint="--scrape-interval"
        )
    config = rules_config(**rules_options(options))
    results = []
    with tempfile.TemporaryDirectory(prefix="headroom-backtest-") as scratch:
        base = settings.workdir or Path(scratch)
        try:
            if settings.replaying:
                click.echo(f"replaying {settings.db or settings.lake_uri} ...", err=True)
                results.append(_replay(config, base / "replay", settings))
            else:
                for scenario in _scenarios(settings.scenario_names, settings.run_all):
                    click.echo(f"running {scenario.name} ...", err=True)
                    results.append(
                        run_scenario(
                            scenario,
                            config,
                            base / scenario.name,
                            interval_s=evaluation_interval,
                            prometheus=settings.prometheus_bin,
                            promtool=settings.promtool_bin,
                        )
                    )
        except PrometheusError as exc:
            raise click.ClickException(str(exc)) from None
        # `--json -`: the timelines on stderr, the JSON alone on stdout
        with json_output(settings.json_path):
            for result in results:
                click.echo(render_text(result, pending=settings.pending) + "\n")
            if settings.table:
                click.echo(scenario_table(results))
        _write_outputs(results, settings.json_path, settings.plot_path)
    if not all(result.passed for result in results):
        sys.exit(1)


alerts = click.Group("alerts", commands=[generate_alerts, backtest], help=GROUP_HELP)
