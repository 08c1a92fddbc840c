"""The weekly review's longest-running requests: the tail the latency histograms round off.

Per model, the `LONGEST` requests of the window with the longest end-to-end time, from the request
log's rows (never any text): when each was admitted, on which sidecar, for which tenant, how it
ended, how much it generated and for how long. A request stuck in flight shows here once it ends
(HeadroomRequestStuck warned while it ran).

    >>> longest = [{"e2e_s": 90.0, "a": 60.0, "instance": "b", "tenant": "u", "outcome": "timeout", "g": 0}]
    >>> longest_running(longest)[0]["admitted_at"], longest_running(longest)[0]["outcome"]
    ('1970-01-01T00:01:00+00:00', 'timeout')
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["LONGEST", "longest_running", "longest_table"]

LONGEST = 5


def longest_running(longest: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The store's longest requests of a model (collector.report.collect, longest first: e2e_s,
    admission `a` in POSIX seconds, instance, tenant, outcome, completion tokens `g`) as the
    review shows them."""
    return [
        {
            "e2e_s": float(row["e2e_s"]),
            "admitted_at": datetime.fromtimestamp(float(row["a"]), UTC).isoformat(timespec="seconds"),
            "instance": str(row["instance"]),
            "tenant": str(row["tenant"]),
            "outcome": str(row["outcome"]),
            "completion_tokens": int(row["g"]),
        }
        for row in longest
    ]


def longest_table(entries: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the review's "longest-running requests" table (text cells)."""
    header = ["longest-running request", "e2e (s)", "sidecar", "tenant", "outcome", "tokens out"]
    rows = [
        [
            e["admitted_at"],
            f"{e['e2e_s']:.1f}",
            e["instance"],
            e["tenant"],
            e["outcome"],
            str(e["completion_tokens"]),
        ]
        for e in entries
    ]
    return header, rows
