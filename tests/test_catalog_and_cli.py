"""The metric catalog's contract and the command line's shape, pinned."""

from __future__ import annotations

import re

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
    "headroom_capacity_knee",
    "headroom_capacity_slo_max",
    "headroom_capacity_recommended_pool",
    "headroom_capacity_knee_requests",
    "headroom_capacity_knee_tokens",
    "headroom_capacity_slo_max_requests",
    "headroom_capacity_slo_max_tokens",
    "headroom_capacity_recommended_pool_requests",
    "headroom_capacity_estimate_timestamp_seconds",
    "headroom_engine_max_concurrency_requests",
    "headroom_upstream_retries_total",
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
    assert BY_NAME["headroom_capacity_knee"].labels == ("model", "caliber")


def _leaves(name: str):
    command = main.get_command(None, name)
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        return [[name]]
    return [[name, sub] for sub in sorted(subcommands)]


@pytest.mark.parametrize("path", [p for name in COMMANDS for p in _leaves(name)], ids=" ".join)
def test_every_command_has_help_with_an_example(path):
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "not built yet" not in result.output
    assert re.search(r"example", result.output, re.IGNORECASE), result.output
    assert "headroom " + path[0] in result.output  # the examples are real command lines


def test_unknown_command_fails_with_usage():
    result = CliRunner().invoke(main, ["frobnicate"])
    assert result.exit_code == 2 and "No such command" in result.output
