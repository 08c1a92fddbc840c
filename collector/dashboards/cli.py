"""`headroom dashboards generate|push`: thin shell over the dashboard generator and the Grafana upload."""

from __future__ import annotations

from pathlib import Path

import click
from rich.progress import Progress

from collector.dashboards.files import dashboard_files
from collector.dashboards.push import PushError, load_dashboards, push_dashboards
from collector.rules.config import DEFAULT, ConfigError
from collector.rules.config_file import config_from_dict, load_config
from collector.rules.files import write_or_check

__all__ = ["dashboards"]


@click.group()
def dashboards() -> None:
    """Generate Grafana dashboards or push them to a Grafana.

    \b
    Examples:
      headroom dashboards generate                     # writes dashboards/*.json
      headroom dashboards generate --check             # exit 1 when dashboards/ is stale
      headroom dashboards push --grafana-url http://grafana:3000 --token "$GRAFANA_TOKEN"
    """


@dashboards.command("generate")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("dashboards"),
    show_default=True,
    help="Directory to write the dashboard JSON into.",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when the files in --out differ.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The YAML file `headroom alerts generate --config` takes (thresholds and SLO lines drawn).",
)
@click.option(
    "--cluster-label",
    default=None,
    metavar="NAME",
    help=f"Label that tells clusters apart: the $cluster variable reads it and every by()/on() keeps it; "
    f"'' for one cluster [default: {DEFAULT.cluster_label}].",
)
def generate_dashboards(out: Path, check: bool, config_path: Path | None, cluster_label: str | None) -> None:
    """Write the capacity overview, tenants and capacity review dashboards (deterministic JSON).

    \b
    Examples:
      headroom dashboards generate
      headroom dashboards generate --out /var/lib/grafana/dashboards
      headroom dashboards generate --cluster-label k8s_cluster --out out/
    """
    try:
        config = load_config(config_path) if config_path else DEFAULT
        if cluster_label is not None:
            config = config_from_dict({"cluster_label": cluster_label}, config, where="the command line")
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--config / --cluster-label") from None
    write_or_check(dashboard_files(config), out, check, "dashboards generate")


@dashboards.command("push")
@click.option(
    "--grafana-url",
    required=True,
    envvar="GRAFANA_URL",
    help="Base URL, e.g. http://grafana:3000 [env: GRAFANA_URL].",
)
@click.option(
    "--token",
    required=True,
    envvar="GRAFANA_TOKEN",
    help="Service-account token with Editor rights [env: GRAFANA_TOKEN].",
)
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=Path("dashboards"),
    show_default=True,
    help="Directory of generated dashboards.",
)
@click.option(
    "--folder", default="llm-headroom", show_default=True, help="Grafana folder (created if missing)."
)
@click.option(
    "--datasource-uid",
    default="headroom-prometheus",
    show_default=True,
    help="uid of the Prometheus datasource the dashboards default to.",
)
@click.option(
    "--overwrite/--no-overwrite",
    default=True,
    show_default=True,
    help="Replace dashboards with the same uid.",
)
def push(
    grafana_url: str, token: str, directory: Path, folder: str, datasource_uid: str, overwrite: bool
) -> None:
    """Upload the generated dashboards with grafana-client.

    \b
    Examples:
      headroom dashboards push --grafana-url http://127.0.0.1:3000 --token glsa_xxx
      GRAFANA_URL=https://grafana.example GRAFANA_TOKEN=glsa_xxx headroom dashboards push --folder capacity
    """
    if not grafana_url.startswith(("http://", "https://")):
        raise click.BadParameter(
            f"{grafana_url!r} is not an http(s) URL; expected e.g. http://grafana:3000",
            param_hint="--grafana-url",
        )
    try:
        boards = load_dashboards(directory)
        with Progress(transient=True) as progress:
            task = progress.add_task("uploading dashboards", total=len(boards))
            answers = push_dashboards(
                grafana_url,
                token,
                boards,
                folder=folder,
                datasource_uid=datasource_uid,
                overwrite=overwrite,
                progress=lambda title: progress.advance(task),
            )
    except PushError as exc:
        raise click.ClickException(str(exc)) from exc
    for board, answer in zip(boards, answers):
        click.echo(f"pushed {board.get('title')}: {(answer or {}).get('url', '')}")
