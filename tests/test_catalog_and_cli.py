"""The metric catalog's contract and the command line's shape, pinned."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from collector.catalog import BY_NAME, CATALOG, DURATION_BUCKETS_SECONDS, TTFT_BUCKETS_SECONDS
from collector.cli import COMMANDS, main

# The names the metric catalog in docs/design.md §4.4 promises; alerts and dashboards elsewhere use them.
CONTRACT = {
    "headroom_inflight_requests",
    "headroom_active_tokens",
    "headroom_requests_total",
    "headroom_prompt_tokens_total",
    "headroom_generated_tokens_total",
    "headroom_time_to_first_token_seconds",
    "headroom_time_per_output_token_seconds",
    "headroom_request_duration_seconds",
    "headroom_engine_up",
    "headroom_engine_requests_running",
    "headroom_engine_requests_waiting",
    "headroom_engine_kv_cache_usage_ratio",
    "headroom_engine_kv_cache_capacity_tokens",
    "headroom_gpu_up",
    "headroom_gpu_utilization_ratio",
    "headroom_gpu_memory_used_bytes",
    "headroom_gpu_memory_total_bytes",
    "headroom_gpu_memory_bandwidth_utilization_ratio",
    "headroom_gpu_power_watts",
    "headroom_capacity_knee_requests",
    "headroom_capacity_knee_tokens",
    "headroom_capacity_slo_max_requests",
    "headroom_capacity_slo_max_tokens",
    "headroom_capacity_recommended_pool_requests",
    "headroom_capacity_estimate_timestamp_seconds",
    "headroom_engine_max_concurrency_requests",
    "headroom_upstream_retries_total",
    "headroom_upstream_failures_total",
    "headroom_log_rows_written_total",
    "headroom_log_rows_dropped_total",
    "headroom_log_queue_rows",
    "headroom_proxy_overhead_seconds",
    "headroom_label_values_folded_total",
}


def test_catalog_holds_every_contract_name_once():
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names))
    assert CONTRACT <= set(names)


def test_names_follow_prometheus_conventions():
    for metric in CATALOG:
        assert metric.name.startswith("headroom_")
        assert metric.name.endswith("_total") == (metric.type == "counter"), metric.name
        if metric.unit == "percentunit":
            assert metric.name.endswith("_ratio"), metric.name
        if metric.unit == "s":
            assert metric.name.endswith("_seconds"), metric.name
        assert "tenant" not in metric.labels or "request_id" not in metric.labels
        assert metric.help.endswith(".")


def test_latency_buckets_reach_well_past_the_default_10_seconds():
    assert TTFT_BUCKETS_SECONDS[-1] >= 60 and DURATION_BUCKETS_SECONDS[-1] >= 300
    assert BY_NAME["headroom_time_to_first_token_seconds"].buckets == TTFT_BUCKETS_SECONDS
    for metric in CATALOG:
        if metric.type == "histogram":
            assert list(metric.buckets) == sorted(metric.buckets)


def test_per_request_labels_are_as_designed():
    assert BY_NAME["headroom_inflight_requests"].labels == ("model", "tenant")
    assert BY_NAME["headroom_requests_total"].labels == ("model", "tenant", "outcome", "source")
    assert BY_NAME["headroom_time_to_first_token_seconds"].labels == ("model", "source")
    assert BY_NAME["headroom_request_duration_seconds"].labels == ("model", "outcome", "source")
    assert BY_NAME["headroom_capacity_knee_requests"].labels == (
        "model",
        "task_class",
        "replica_class",
        "source",
        "confidence",
    )


def _commands(command: click.Command, path: list[str]) -> list[tuple[list[str], click.Command]]:
    """Every command under `command`, groups included, with the path that names it."""
    found = [(path, command)]
    if isinstance(command, click.Group):
        context = click.Context(command, info_name=path[-1] if path else "headroom")
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            assert sub is not None, name
            found += _commands(sub, [*path, name])
    return found


_ALL_COMMANDS = _commands(main, [])


def test_the_help_walk_covers_every_command():
    assert {path[0] for path, _ in _ALL_COMMANDS if path} == set(COMMANDS)


@pytest.mark.parametrize(
    "path, command", _ALL_COMMANDS, ids=[" ".join(p) or "headroom" for p, _ in _ALL_COMMANDS]
)
def test_every_help_starts_with_examples_and_explains_every_option(path, command):
    """The one --help layout: the summary, then Examples (real command lines), then the rest,
    then the options, each with its help; no \\b block other than the examples (a hand-wrapped
    paragraph in one prints broken mid-sentence)."""
    result = CliRunner().invoke(main, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    body = result.output.split("\n\n", 1)[1].split("\nOptions:")[0]
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", body) if p.strip()]
    assert len(paragraphs) >= 2 and paragraphs[1].startswith("Examples:"), (
        f"headroom {' '.join(path)} --help: the examples must follow the summary line:\n{result.output}"
    )
    examples = paragraphs[1].splitlines()[1:]
    assert any(line.strip().startswith(" ".join(["headroom", *path])) for line in examples), paragraphs[1]
    assert result.output.index("Examples:") < result.output.index("Options:")
    assert result.output.count("Examples:") == 1
    blocks = re.findall(r"\\b\n\s*(\S[^\n]*)", command.help or "")
    assert all(first.startswith("Examples:") for first in blocks), blocks
    unexplained = [
        param.opts[-1]
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()
    ]
    assert not unexplained, f"headroom {' '.join(path)}: options without help: {unexplained}"


def test_unknown_command_fails_with_usage():
    result = CliRunner().invoke(main, ["frobnicate"])
    assert result.exit_code == 2 and "No such command" in result.output


def test_the_default_runbook_url_is_the_projects_documented_home():
    """Every alert's runbook_url defaults to docs/runbooks.md under [project.urls]'s Documentation,
    and the README says how to point it elsewhere (--runbook-base-url)."""
    import tomllib
    from pathlib import Path

    from collector.rules.config import DEFAULT

    root = Path(__file__).resolve().parent.parent
    urls = tomllib.loads((root / "pyproject.toml").read_text())["project"]["urls"]
    assert DEFAULT.runbook_base_url == urls["Documentation"] + "/runbooks.md"
    assert set(urls) >= {"Homepage", "Documentation", "Repository", "Issues"}
    assert "--runbook-base-url" in (root / "README.md").read_text()
