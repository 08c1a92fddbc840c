"""`headroom alerts generate`: thin shell over the rule, promtool-test and Alertmanager generators.

The `alerts` group itself is assembled in collector.backtest.cli, beside `backtest` (which needs the
simulator this package may not import); `rules_config()` turns the shared options into a config.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from collector.alerts.files import alert_files
from collector.rules.config import DEFAULT, RULERS, ConfigError, RulesConfig
from collector.rules.config_file import config_from_dict, load_config
from collector.rules.files import write_or_check

__all__ = ["generate_alerts", "config_options", "rules_config", "GROUP_HELP"]

GROUP_HELP = """Generate Prometheus rules, their promtool tests and the Alertmanager config; backtest them.

\b
Examples:
  headroom alerts generate                          # writes alerts/ (the defaults)
  headroom alerts generate --config alerts.yaml --out /etc/prometheus/alerts
  headroom alerts generate --check                  # exit 1 when alerts/ is stale
  headroom alerts backtest ramp --plot ramp.png     # replay a scenario through the rules
  headroom alerts backtest --db headroom.duckdb --since 24h
  promtool test rules alerts/headroom.test.yaml     # the generated unit tests
"""


_Command = TypeVar("_Command", bound=Callable[..., Any])


def config_options(command: _Command) -> _Command:
    """--config and the common overrides, shared by `generate` and `backtest`."""
    for option in reversed(
        (
            click.option(
                "--config",
                "config_path",
                type=click.Path(dir_okay=False, path_type=Path),
                default=None,
                help="YAML file of SLOs, thresholds, for: durations, job selector, labels, receivers "
                "(docs/rules.md, 'Configuration file'); omitted keys keep the defaults.",
            ),
            click.option(
                "--sidecar-job",
                default=None,
                metavar="NAME",
                help=f"Prometheus job of the sidecars [default: {DEFAULT.sidecar_job}].",
            ),
            click.option(
                "--runbook-base-url",
                default=None,
                metavar="URL",
                help="Absolute URL of docs/runbooks.md in your fork (runbook_url of every alert).",
            ),
            click.option(
                "--cluster-label",
                default=None,
                metavar="NAME",
                help=f"Label that tells clusters apart, kept in every aggregation; '' for one cluster "
                f"[default: {DEFAULT.cluster_label}].",
            ),
            click.option(
                "--ruler",
                type=click.Choice(RULERS),
                default=None,
                help=f"The rule engine that loads the files (vmalert: no keep_firing_for) "
                f"[default: {DEFAULT.ruler}].",
            ),
            click.option(
                "--label",
                "labels",
                multiple=True,
                metavar="NAME=VALUE",
                help="A label added to every alert, e.g. --label cluster=prod-eu (repeatable).",
            ),
        )
    ):
        command = option(command)
    return command


def rules_config(
    config_path: Path | None,
    sidecar_job: str | None,
    runbook_base_url: str | None,
    labels: tuple[str, ...],
    cluster_label: str | None = None,
    ruler: str | None = None,
) -> RulesConfig:
    """The RulesConfig the options describe: defaults, then the file, then the flags."""
    try:
        config = load_config(config_path) if config_path else DEFAULT
        overrides: dict[str, Any] = {}
        if sidecar_job:
            overrides["sidecar_job"] = sidecar_job
        if cluster_label is not None:
            overrides["cluster_label"] = cluster_label
        if ruler:
            overrides["ruler"] = ruler
        if runbook_base_url:
            overrides["runbook_base_url"] = runbook_base_url
        pairs = {}
        for text in labels:
            name, sep, value = text.partition("=")
            if not sep or not name:
                raise click.BadParameter(
                    f"{text!r} is not NAME=VALUE, e.g. cluster=prod-eu", param_hint="--label"
                )
            pairs[name.strip()] = value.strip()
        if pairs:
            overrides["extra_labels"] = pairs
        return config_from_dict(overrides, config, where="the command line") if overrides else config
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--config") from None


@click.command("generate")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("alerts"),
    show_default=True,
    help="Directory to write the rules into.",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when the files in --out differ.")
@config_options
def generate_alerts(
    out: Path,
    check: bool,
    config_path: Path | None,
    sidecar_job: str | None,
    runbook_base_url: str | None,
    labels: tuple[str, ...],
    cluster_label: str | None,
    ruler: str | None,
) -> None:
    """Write *.rules.yaml, the promtool test file and alertmanager.yml (deterministic YAML).

    \b
    Examples:
      headroom alerts generate && promtool check rules alerts/*.rules.yaml
      headroom alerts generate --config alerts.yaml --out /etc/prometheus/alerts
      headroom alerts generate --sidecar-job llm-sidecar --label cluster=prod-eu --out out/
      headroom alerts generate --ruler vmalert --out /etc/vmalert/rules   # VictoriaMetrics
      headroom alerts generate --cluster-label '' --out out/   # one cluster, no cluster label

    The committed alerts/ are the defaults; a --config file (or the flags) renders your own,
    with promtool tests that follow your durations and SLOs.
    """
    config = rules_config(config_path, sidecar_job, runbook_base_url, labels, cluster_label, ruler)
    write_or_check(alert_files(config), out, check, "alerts generate")
