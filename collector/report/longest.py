"""The weekly review's longest-running requests: the tail the latency histograms round off.

Per model, the `LONGEST` requests of the window with the longest end-to-end time, from the request
log's rows (never any text): when each was admitted, on which sidecar, for which tenant, how it
ended, how much it generated and for how long. A request stuck in flight shows here once it ends
(HeadroomRequestStuck warned while it ran).

    >>> rows = {"e2e_s": np.array([3.0, 90.0]), "admitted": np.array([0.0, 60.0]),
    ...         "instance": np.array(["a", "b"]), "tenant": np.array(["t", "u"]),
    ...         "outcome": np.array(["ok", "timeout"]), "completion_tokens": np.array([10, 0])}
    >>> longest_running(rows, 1)[0]["e2e_s"], longest_running(rows, 1)[0]["outcome"]
    (90.0, 'timeout')
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np

__all__ = ["LONGEST", "longest_running", "longest_table"]

LONGEST = 5


def longest_running(rows: dict[str, np.ndarray], count: int = LONGEST) -> list[dict[str, Any]]:
    """The `count` rows with the longest e2e_s (longest first; rows without one are left out)."""
    e2e = rows["e2e_s"].astype(float)
    known = np.flatnonzero(~np.isnan(e2e))
    order = known[np.argsort(-e2e[known], kind="stable")][:count]
    return [
        {
            "e2e_s": float(e2e[i]),
            "admitted_at": datetime.fromtimestamp(float(rows["admitted"][i]), UTC).isoformat(
                timespec="seconds"
            ),
            "instance": str(rows["instance"][i]),
            "tenant": str(rows["tenant"][i]),
            "outcome": str(rows["outcome"][i]),
            "completion_tokens": int(rows["completion_tokens"][i]),
        }
        for i in order
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
