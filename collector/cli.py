"""The `headroom` command line: one group, each subcommand loaded from its own module on demand.

Subcommands live beside the code they drive (`collector/<area>/cli.py`), so importing the CLI does
not import DuckDB, matplotlib or the simulator until a command needs them, and `headroom --help`
stays fast.
"""

from __future__ import annotations

import importlib

import click

from collector import __version__

__all__ = ["main", "COMMANDS"]

# name -> "module:attribute" of a click.Command. Order is the order shown in --help.
COMMANDS: dict[str, str] = {
    "run": "collector.sidecar.cli:run",
    "sim": "collector.sim.cli:sim",
    "demo": "collector.demo:demo",
    "probe": "collector.analysis.cli:probe",
    "capacity": "collector.analysis.cli:capacity",
    "report": "collector.report.cli:report",
    "dashboards": "collector.dashboards.cli:dashboards",
    "alerts": "collector.backtest.cli:alerts",
    "integrations": "collector.integrations.cli:integrations",
    "lake": "collector.lake.cli:lake",
}

_SHORT_HELP = {
    "run": "The sidecar: proxy the OpenAI API and export dual-caliber concurrency.",
    "sim": "Built-in continuous-batching engine simulator (OpenAI-compatible).",
    "demo": "Simulator + sidecar + a load that crosses the knee + a capacity summary.",
    "probe": "Concurrency-gradient load test with knee detection and recommendations.",
    "capacity": "Capacity formulas, the passive curve, where TTFT went (split).",
    "report": "The weekly capacity review (Markdown, HTML or JSON).",
    "dashboards": "Generate Grafana dashboards or push them to a Grafana.",
    "alerts": "Generate Prometheus rules and Alertmanager config; backtest them on scenarios or your log.",
    "integrations": "KEDA, Inference Gateway and llm-d settings from the measured knee.",
    "lake": "The fleet's request log on Iceberg: commit staged files, maintain, import.",
}


# optional libraries -> the extra that brings them (pyproject.toml); the base install is the sidecar
_EXTRAS = {
    "rich": "all",
    "numpy": "report",
    "matplotlib": "report",
    "kneed": "analysis",
    "grafana_client": "grafana",
    "pyiceberg": "lake",
}

# commands of earlier releases -> what replaced them (one line, instead of "No such command")
_RETIRED = {
    "store": "`headroom store` is gone: on one box the sidecar owns its --db and serves readers; a "
    "fleet writes the Iceberg table (headroom run --lake URI, then headroom lake commit): "
    "docs/operations.md, 'From one box to a fleet'",
}


class _LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if name in _RETIRED:
            raise click.UsageError(_RETIRED[name])
        if target is None:
            return None
        module_name, attribute = target.split(":")
        try:
            command: click.Command = getattr(importlib.import_module(module_name), attribute)
        except ModuleNotFoundError as exc:
            extra = _EXTRAS.get(exc.name or "")
            if extra is None:
                raise
            raise click.ClickException(
                f"`headroom {name}` needs {exc.name}, which this install does not have: "
                f"pip install 'llm-headroom[{extra}]' (or [all])"
            ) from None
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _SHORT_HELP.get(name, "")) for name in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="headroom")
def main() -> None:
    """llm-headroom: how close is this LLM deployment to its capacity boundary?

    \b
    Examples:
      headroom demo                                   # everything on the built-in simulator
      headroom run --upstream http://127.0.0.1:8000   # sidecar in front of an engine
      headroom probe --url http://127.0.0.1:9100 --levels 1,2,4,8,16
      headroom report --db headroom.duckdb --since 7d --format md
    """


if __name__ == "__main__":
    main()
