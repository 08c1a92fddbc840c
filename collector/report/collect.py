"""Read what the review needs from a RequestStore: traffic columns for two windows and estimates.

The only impure part of the report: SQL with parameters, results as numpy arrays keyed by column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from collector.store.db import RequestStore
from collector.store.decision import Decision, decisions

__all__ = ["ReportInputs", "collect_inputs", "empty_columns", "COLUMNS"]

# name -> SQL; timestamps as POSIX seconds so the pure side needs no time zones.
COLUMNS = {
    "model": "coalesce(model, 'unknown')",
    "tenant": "coalesce(tenant, 'anonymous')",
    "outcome": "coalesce(outcome, 'unknown')",
    "admitted": "epoch(admitted_at)",
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
_TEXT = ("model", "tenant", "outcome")


@dataclass
class ReportInputs:
    """Everything build_report needs; `current`/`previous` map a column name to a numpy array."""

    since: datetime
    until: datetime
    current: dict[str, np.ndarray]
    previous: dict[str, np.ndarray]
    estimates: dict[str, dict[str, Any]] = field(default_factory=dict)
    previous_estimates: dict[str, dict[str, Any]] = field(default_factory=dict)
    slo_ttft_p95_s: float | None = None
    # model -> what is published per task class: {task_class, knee_requests, ..., reason}
    classes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

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


def _published(decisions: list[Decision]) -> dict[str, dict[str, Any]]:
    """What the gauges publish per model (collector.store.decision), task class all: the same
    estimate the sidecar, the store and the other readers use."""
    return {
        d.model: dict(d.estimate) | {"published_because": d.reason}
        for d in decisions
        if d.estimate is not None and d.task_class == "all"
    }


def _classes(decisions: list[Decision]) -> dict[str, list[dict[str, Any]]]:
    """Per model, the decision for every task class, published or not, with its reason."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for d in decisions:
        estimate = d.estimate or {}
        by_model.setdefault(d.model, []).append(
            {
                "task_class": d.task_class,
                "knee_requests": estimate.get("knee_requests"),
                "recommended_pool": estimate.get("recommended_pool") if estimate else None,
                "slo_max": estimate.get("slo_max"),
                "source": estimate.get("source"),
                "engine_max_concurrency": estimate.get("engine_max_concurrency"),
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
    made = decisions(store, until)
    return ReportInputs(
        since,
        until,
        _columns(store, since, until),
        _columns(store, previous_since, since),
        _published(made),
        _published(decisions(store, since)),  # what was published when the window began
        slo_ttft_p95_s,
        _classes(made),
    )


def empty_columns() -> dict[str, np.ndarray]:
    """No rows, every column present (for tests and empty windows)."""
    return {name: np.array([], dtype=object if name in _TEXT else np.float64) for name in COLUMNS}
