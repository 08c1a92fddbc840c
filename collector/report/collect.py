"""Read what the review needs from a RequestStore: traffic columns for two windows and estimates.

The only impure part of the report: SQL with parameters, results as numpy arrays keyed by column.
Estimates are what collector.store.decision publishes per model and replica class (task class
all); an instance's replica class is the one its rows name (the sidecar records its class in each
row) where that class has a published estimate, else the class of the probe runs it served (its
rows of a probe run whose estimate names the class), else the model's, as the rules fall back
(collector.report.build, `_class_of`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from collector.store.db import RequestStore
from collector.store.decision import Decision, Published, decisions

__all__ = ["ReportInputs", "collect_inputs", "empty_columns", "COLUMNS"]

# name -> SQL; timestamps as POSIX seconds so the pure side needs no time zones.
COLUMNS = {
    "model": "coalesce(model, 'unknown')",
    "instance": "coalesce(instance, 'unknown')",
    "tenant": "coalesce(tenant, 'anonymous')",
    "outcome": "coalesce(outcome, 'unknown')",
    "adapter": "adapter",  # the LoRA adapter a request named (NULL: the base model itself)
    "admitted": "epoch(admitted_at)",
    "first_token": "epoch(first_token_at)",
    "completed": "epoch(completed_at)",
    "ttft_s": "ttft_s",
    "tpot_s": "tpot_s",
    "e2e_s": "e2e_s",
    "prompt_tokens": "coalesce(prompt_tokens, 0)",
    "completion_tokens": "coalesce(completion_tokens, 0)",
    "cached_prompt_tokens": "coalesce(cached_prompt_tokens, 0)",
    "inflight": "inflight_at_admit",
    "active_tokens": "active_tokens_at_admit",
}
_SELECT = ", ".join(f"{sql} AS {name}" for name, sql in COLUMNS.items())
_TEXT = ("model", "instance", "tenant", "outcome", "adapter")
# (model, instance) -> replica class, from the probe runs an instance served
_PROBED = """
SELECT DISTINCT coalesce(r.model, 'unknown'), coalesce(r.instance, 'unknown'),
       coalesce(e.replica_class, 'default')
FROM requests r JOIN capacity_estimates e ON r.run_id = e.run_id
WHERE r.source = 'probe' AND e.created_at <= ?"""
# (model, instance) -> the replica class its sidecar recorded, the most frequent in the window
_SERVED = """
SELECT coalesce(model, 'unknown'), coalesce(instance, 'unknown'), mode(replica_class)
FROM requests WHERE replica_class IS NOT NULL AND admitted_at >= ? AND admitted_at < ?
GROUP BY 1, 2"""
_HAS_ESTIMATES = "SELECT count(*) FROM information_schema.tables WHERE table_name = 'capacity_estimates'"

Key = tuple[str, str]  # (model, replica class)


@dataclass
class ReportInputs:
    """Everything build_report needs; `current`/`previous` map a column name to a numpy array."""

    since: datetime
    until: datetime
    current: dict[str, np.ndarray]
    previous: dict[str, np.ndarray]
    # (model, replica class) -> the published estimate, with `published_because`
    estimates: dict[Key, dict[str, Any]] = field(default_factory=dict)
    previous_estimates: dict[Key, dict[str, Any]] = field(default_factory=dict)
    slo_ttft_p95_s: float | None = None
    # model -> what is published per task class and replica class: {task_class, ..., reason}
    classes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # (model, instance) -> the replica class of the probe runs it served
    instance_classes: dict[Key, str] = field(default_factory=dict)
    # (model, instance) -> the replica class its rows name (its sidecar's)
    served_classes: dict[Key, str] = field(default_factory=dict)

    @property
    def previous_since(self) -> datetime:
        """Start of the previous window, as long as the current one."""
        return self.since - (self.until - self.since)


def _columns(store: RequestStore, since: datetime, until: datetime) -> dict[str, np.ndarray]:
    # store.query (tuples) rather than store.arrow: RequestStore.arrow calls fetch_arrow_table,
    # which DuckDB 2 no longer has.
    rows = store.query(
        f"SELECT {_SELECT} FROM requests WHERE source = 'traffic' AND admitted_at >= ? AND admitted_at < ?",
        [since, until],
    )
    if not rows:
        return empty_columns()
    result = {}
    for name, values in zip(COLUMNS, zip(*rows)):
        if name in _TEXT:
            result[name] = np.array(values, dtype=object)
        else:
            result[name] = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    return result


def _published(decisions: list[Decision]) -> dict[Key, dict[str, Any]]:
    """What the gauges publish per model and replica class (collector.store.decision), task class
    all: the same estimate the sidecar, the store and the other readers use, in its JSON form (the
    review's document is JSON and HTML)."""
    return {
        (d.model, d.replica_class): Published(d.estimate, d.reason).to_dict()
        for d in decisions
        if d.estimate is not None and d.task_class == "all"
    }


def _probed(store: RequestStore, until: datetime) -> dict[Key, str]:
    if not store.query(_HAS_ESTIMATES)[0][0]:
        return {}
    return {(str(m), str(i)): str(c) for m, i, c in store.query(_PROBED, [until])}


def _served(store: RequestStore, since: datetime, until: datetime) -> dict[Key, str]:
    return {(str(m), str(i)): str(c) for m, i, c in store.query(_SERVED, [since, until])}


def _classes(decisions: list[Decision]) -> dict[str, list[dict[str, Any]]]:
    """Per model, the decision for every task class, published or not, with its reason."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for d in decisions:
        estimate = d.estimate
        by_model.setdefault(d.model, []).append(
            {
                "task_class": d.task_class,
                "replica_class": d.replica_class,
                "knee_requests": estimate.knee_requests if estimate else None,
                "recommended_pool": estimate.recommended_pool if estimate else None,
                "slo_max": estimate.slo_max if estimate else None,
                "source": estimate.source if estimate else None,
                "engine_max_concurrency": estimate.extra.get("engine_max_concurrency") if estimate else None,
                "reason": d.reason,
            }
        )
    return by_model


def collect_inputs(
    store: RequestStore, since: datetime, until: datetime, *, slo_ttft_p95_s: float | None = None
) -> ReportInputs:
    """Rows of [since, until) and of the window before it, plus what was published at its end and
    at its start, per model (collector.store.decision)."""
    if until <= since:
        raise ValueError(
            f"report window is empty: since {since.isoformat()} is not before until {until.isoformat()}"
        )
    previous_since = since - (until - since)
    made = decisions(store, as_of=until)
    return ReportInputs(
        since,
        until,
        _columns(store, since, until),
        _columns(store, previous_since, since),
        _published(made),
        _published(decisions(store, as_of=since)),  # what was published when the window began
        slo_ttft_p95_s,
        _classes(made),
        _probed(store, until),
        _served(store, previous_since, until),
    )


def empty_columns() -> dict[str, np.ndarray]:
    """No rows, every column present (for tests and empty windows)."""
    return {name: np.array([], dtype=object if name in _TEXT else np.float64) for name in COLUMNS}
