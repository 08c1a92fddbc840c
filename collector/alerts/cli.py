"""`headroom alerts generate`: thin shell over the rule, promtool-test and Alertmanager generators."""

from __future__ import annotations

from pathlib import Path

import click

from collector.alerts.files import alert_files
from collector.rules.files import write_or_check

__all__ = ["alerts"]


@click.group()
def alerts() -> None:
    """Generate Prometheus recording and alerting rules, their promtool tests and the Alertmanager config.

    \b
    Examples:
      headroom alerts generate                          # writes alerts/
      headroom alerts generate --check                  # exit 1 when alerts/ is stale
      promtool test rules alerts/headroom.test.yaml     # then run the generated unit tests
    """


@alerts.command("generate")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("alerts"),
    show_default=True,
    help="Directory to write the rules into.",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when the files in --out differ.")
def generate_alerts(out: Path, check: bool) -> None:
    """Write *.rules.yaml, the promtool test file and alertmanager.yml (deterministic YAML).

    \b
    Examples:
      headroom alerts generate && promtool check rules alerts/*.rules.yaml
      headroom alerts generate --out /etc/prometheus/alerts
    """
    write_or_check(alert_files(), out, check, "alerts generate")
