"""Alerts on the pipeline itself: the sidecar's scrape, the engine's /metrics, the request log.

A sidecar Prometheus cannot scrape pages (it proxies traffic, so its clients fail too), and so does
a scrape job that vanished (`absent()`: every other alert is blind, and `up == 0` cannot fire
without an `up`). The rest warn: the engine's metrics failing (KV and queue signals blind), rows
dropped, the log sink (the lake) failing or behind while rows wait in the sidecar's spool, the lake
committer not committing while staged files wait, and staged files in quarantine.
"""

from __future__ import annotations

import re

from collector.alerts.alert import Alert, number
from collector.rules.config import RulesConfig
from collector.rules.naming import sample

__all__ = ["pipeline_alerts", "absent_labels"]


def absent_labels(selector: str) -> dict[str, str]:
    """The labels absent() puts on its result: the selector's equality matchers ('job="x"' -> {"job": "x"})."""
    return dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', selector))


def pipeline_alerts(c: RulesConfig) -> list[Alert]:
    """The pipeline group: sidecar down or absent, engine scrape, drops, store and shipping."""
    dropped, up = sample("headroom_log_rows_dropped_total"), f"up{{{c.job_selector}}}"
    return [
        Alert(
            "HeadroomSidecarDown",
            "headroom-pipeline",
            f"{up} == 0",
            "critical",
            "Sidecar <instance> is down",
            "Prometheus cannot scrape the sidecar <instance>; it proxies traffic, so clients behind it "
            "are failing too.",
            {"component": "pipeline"},
        ),
        Alert(
            "HeadroomSidecarJobAbsent",
            "headroom-pipeline",
            _absence(c, up),
            "critical",
            "No sidecar is scraped" + (" in a cluster that had them" if c.cluster_by else " at all"),
            f"Prometheus has no `up` series for {_named(c.job_selector)}"
            + (
                f" in the cluster the alert's `{c.cluster_label}` label names (anywhere, without one), "
                f"though it had within {c.absence_lookback}"
                if c.cluster_by
                else ""
            )
            + ": the scrape job or its targets are gone, so every llm-headroom alert"
            + (" there" if c.cluster_by else "")
            + " is blind. "
            "Check the scrape config or the PodMonitor.",
            {"component": "pipeline"},
        ),
        Alert(
            "HeadroomEngineScrapeFailing",
            "headroom-pipeline",
            f"{sample('headroom_engine_up')} == 0",
            "warning",
            "Sidecar <instance> cannot read the <engine> engine's metrics",
            "The sidecar on <instance> fails to scrape the <engine> engine's /metrics: KV-cache and "
            "queue signals for it are blind.",
            {"component": "pipeline"},
        ),
        Alert(
            "HeadroomLogRowsDropped",
            "headroom-pipeline",
            f"sum by (instance, reason) (increase({dropped}[10m])) > 0",
            "warning",
            "Request-log rows dropped on <instance> (<reason>)",
            "<value:humanize> request-log rows were dropped on <instance> in 10 minutes (reason "
            "<reason>): capacity curves and the weekly review will miss them.",
            {"component": "pipeline"},
        ),
        Alert(
            "HeadroomLogSinkDown",
            "headroom-pipeline",
            f"{sample('headroom_log_sink_up')} == 0",
            "warning",
            "Sidecar <instance> cannot write its request log",
            "The last write of <instance>'s log sink failed (with --lake: the lake did not take the "
            "last staged file): rows are spooling on the sidecar's disk (headroom_log_spool_bytes) and "
            "are staged when the lake takes writes again.",
            {"component": "pipeline"},
        ),
        Alert(
            "HeadroomLogSinkLagging",
            "headroom-pipeline",
            # the lag, or the spool's oldest batch from a sidecar that exports only the spool's gauges
            f"(\n  {sample('headroom_log_sink_lag_seconds')}\n  or {sample('headroom_log_spool_oldest_age_seconds')}\n)"
            f"\n> {number(c.sink_lag_warning_seconds)}",
            "warning",
            "Request log of <instance> is <value:humanizeDuration> behind",
            "The oldest row <instance>'s log sink has not taken is <value:humanizeDuration> old: the "
            "fleet's table, its capacity curves and weekly review are that far behind, and a full spool "
            "drops rows.",
            {"component": "pipeline"},
        ),
        Alert(
            "HeadroomLakeCommitStalled",
            "headroom-pipeline",
            # no pass has succeeded for the threshold while files wait, or a writer's oldest
            # staged file has waited that long though passes succeed
            f"(\n  time() - {sample('headroom_lake_commit_last_success_timestamp_seconds')}"
            f" > {number(c.lake_commit_stall_seconds)}\n"
            f"  and {sample('headroom_lake_staged_files_waiting')} > 0\n)\n"
            f"or\nmax without (writer) ({sample('headroom_lake_commit_lag_seconds')})"
            f" > {number(c.lake_commit_stall_seconds)}",
            "warning",
            "Lake committer <instance> has not committed for <value:humanizeDuration>",
            "Staged files wait and the lake committer on <instance> has not registered them for "
            "<value:humanizeDuration> (its catalog or the lake fails, or a file it cannot read): the "
            "fleet's table, its capacity curves and weekly review are that far behind.",
            {"component": "pipeline"},
        ),
        Alert(
            "HeadroomLakeFilesQuarantined",
            "headroom-pipeline",
            f"{sample('headroom_lake_quarantine_files')} > 0",
            "warning",
            "<value> staged files are in the lake's quarantine",
            "The lake committer on <instance> set <value> staged files aside under quarantine/ "
            "(unreadable, a schema the table does not take, a malformed name or a sequence far "
            "ahead); their rows are not in the table until someone re-stages or deletes them.",
            {"component": "pipeline"},
        ),
    ]


def _absence(c: RulesConfig, up: str) -> str:
    """No `up` for the job at all, or, per cluster, none now where there was within the lookback.

    `absent()` evaluated centrally fires only when every cluster's sidecars are gone; the second
    half names the one cluster that stopped reporting while the others still do.
    """
    if not c.cluster_by:
        return f"absent({up})"
    seen, now = f"max_over_time({up}[{c.absence_lookback}])", up
    return f"absent({up})\nor\n(\n  group by (job) ({seen})\n  unless on (job)\n  group by (job) ({now})\n)"


def _named(selector: str) -> str:
    """The job as a template when absent() will carry it (an equality matcher), else the selector."""
    return "job <job>" if "job" in absent_labels(selector) else selector
