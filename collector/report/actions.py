"""Recommended actions for one model's review, each with the reason a reviewer can check.

Thresholds are conventions, kept here with their reasons:
- KNEE_MOVE 10 %: below that, a re-measured knee is within run-to-run noise; above, the pool
  (70-80 % of the knee) should follow it.
- PEAK_SHARE 80 %: a pool is 70-80 % of the knee, so a peak above 80 % of the knee is past the
  pool and into the region where TTFT stretches (docs/domain.md §2.2).
- TTFT_RISE 20 %: week-over-week p95 TTFT growth worth a look even inside the SLO (TTFT rises first).
- RATE_LIMITED and ERRORS 1 %: one request in a hundred failing is visible to users.
- LITTLE_OFF 5 %: Little's law is checked per window (collector.report.plan); a window where the
  load jumps can be off without anything wrong, a log that loses rows or clocks that step is off
  in many.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "recommend_actions",
    "KNEE_MOVE",
    "PEAK_SHARE",
    "TTFT_RISE",
    "RATE_LIMITED",
    "ERRORS",
    "LITTLE_OFF",
]

KNEE_MOVE, PEAK_SHARE, TTFT_RISE, RATE_LIMITED, ERRORS, LITTLE_OFF = 0.10, 0.80, 0.20, 0.01, 0.01, 0.05


def _label(entry: dict[str, Any], report: dict[str, Any]) -> str:
    """' (replica class l40s)' when a model runs on several classes, else ''."""
    return f" (replica class {entry['replica_class']})" if len(report.get("classes") or []) > 1 else ""


def _knee_moved(report: dict[str, Any]) -> list[dict[str, str]]:
    found = []
    for entry in report.get("classes") or []:
        estimate = entry.get("estimate") or {}
        previous = estimate.get("previous") or {}
        now, before = estimate.get("knee_requests"), previous.get("knee_requests")
        if not now or not before or abs(now - before) / before < KNEE_MOVE:
            continue
        found.append(
            {
                "action": f"Change the pool from {previous.get('recommended_pool')} to "
                f"{estimate.get('recommended_pool')} concurrent requests" + _label(entry, report),
                "reason": f"the knee moved from {before} to {now} requests "
                f"(estimates of {previous.get('created_at')} and {estimate.get('created_at')})",
            }
        )
    return found


def _limit(caliber: str) -> str:
    """The concurrency key of the limit a replica's peak (instantaneous) is judged against: the
    request knee, or the p95 of the active tokens at it (never the time-weighted mean)."""
    return "knee_requests" if caliber == "requests" else "knee_tokens_p95"


def _knee_words(concurrency: dict[str, Any], caliber: str) -> str:
    """'the knee 8' or 'the token capacity's p95 2050 (time-weighted mean 1710)'."""
    knee = concurrency[_limit(caliber)]
    if caliber == "requests":
        return f"the knee {knee:g}"
    mean = concurrency.get("knee_tokens")
    return f"the token capacity's p95 {knee:g}" + (
        f" (time-weighted mean {mean:g})" if mean is not None else ""
    )


def _near_knee(report: dict[str, Any]) -> list[dict[str, str]]:
    """Per replica class, a replica's peaks near its knee, in the caliber that binds first; never
    on a withheld token capacity (concurrency["knee_tokens_p95"] is None then:
    collector.report.build), and in tokens against the p95, never the mean."""
    found = []
    for entry in report.get("classes") or []:
        concurrency = entry["concurrency"]
        binding = concurrency.get("binding_caliber")
        for caliber in ("requests", "tokens"):
            peak, knee = concurrency.get(f"peak_{caliber}"), concurrency.get(_limit(caliber))
            if peak is not None and knee and peak >= PEAK_SHARE * knee:
                binds = f"; the {caliber} caliber binds first" if caliber == binding else ""
                share = _share(peak / knee)
                share = share if caliber == "requests" else share.replace("the knee", "the p95")
                found.append(
                    {
                        "action": f"Add capacity or cap admission ({caliber} caliber)"
                        + _label(entry, report),
                        "reason": f"peak {caliber} concurrency {peak:g} on one replica against "
                        f"{_knee_words(concurrency, caliber)}: {share}{binds}",
                    }
                )
    return found


def _replicas(report: dict[str, Any]) -> list[dict[str, str]]:
    """Run more replicas when the week's peak, or next week's at the trend, needs more than ran."""
    found = []
    for entry in report.get("classes") or []:
        plan = entry.get("plan") or {}
        needed, ran = plan.get("replicas_needed"), plan.get("replicas_run")
        ahead = (plan.get("trend") or {}).get("replicas_needed")
        caliber = plan.get("binding_caliber")
        if needed is not None and ran is not None and needed > ran:
            found.append(
                {
                    "action": f"Run {needed} replicas of class {entry['replica_class']} at the peak "
                    f"(ran {ran})",
                    "reason": f"the busiest minute's {caliber} load {plan['peak'][caliber]:g} over a "
                    f"pool of {plan['pool_per_replica'][caliber]:g} per replica"
                    + (
                        " (the pool in tokens: the p99.9 of the active tokens with the pool in flight)"
                        if caliber == "tokens"
                        else ""
                    ),
                }
            )
        elif ahead is not None and ran is not None and ahead > ran:
            found.append(
                {
                    "action": f"Plan {ahead} replicas of class {entry['replica_class']} for next week "
                    f"(ran {ran})",
                    "reason": "the daily peaks' trend over the last two windows",
                }
            )
    return found


def _share(ratio: float) -> str:
    """1.0 -> 'peak is 1.0 × the knee'; 0.85 -> 'peak is 85 % of the knee'."""
    return (
        f"peak is {ratio:.1f} × the knee"
        if ratio >= 1
        else f"peak is {ratio:.0%} of the knee".replace("%", " %")
    )


def _latency(report: dict[str, Any]) -> list[dict[str, str]]:
    found = []
    ttft = report["latency"]["ttft_s"]
    slo = report["slo"]
    if slo["met"] is False:
        found.append(
            {
                "action": "Bring p95 TTFT back inside the SLO (scale out or lower the pool)",
                "reason": f"p95 TTFT {ttft['p95']:.3f} s is above the SLO {slo['ttft_p95_s']:.3f} s",
            }
        )
    rise = ttft.get("change_p95")
    if rise is not None and rise >= TTFT_RISE:
        found.append(
            {
                "action": "Find what raised TTFT this period (load mix, prompt length, engine change)",
                "reason": f"p95 TTFT rose {rise:.0%} week over week "
                f"({ttft['previous']['p95']:.3f} s -> {ttft['p95']:.3f} s)",
            }
        )
    return found


def _failures(report: dict[str, Any]) -> list[dict[str, str]]:
    found = []
    outcomes = report["outcomes"]
    if (outcomes["rate_limited_ratio"] or 0) > RATE_LIMITED:
        found.append(
            {
                "action": "Raise the quota or the pool, or shape the heaviest tenants",
                "reason": f"{outcomes['rate_limited_ratio']:.1%} of requests were rate-limited (429)",
            }
        )
    if (outcomes["error_ratio"] or 0) > ERRORS:
        found.append(
            {
                "action": "Investigate upstream errors and timeouts",
                "reason": f"{outcomes['error_ratio']:.1%} of requests failed upstream or timed out",
            }
        )
    return found


def _evidence(report: dict[str, Any]) -> list[dict[str, str]]:
    found = []
    unmeasured = [c["replica_class"] for c in report.get("classes") or [] if c.get("estimate") is None]
    if unmeasured and report["traffic"]["requests"]:
        found.append(
            {
                "action": "Measure the knee: run headroom probe against this model",
                "reason": "no capacity estimate is published for replica class "
                + ", ".join(unmeasured)
                + ", so headroom cannot be judged",
            }
        )
    law = report["littles_law"]
    worst = law.get("worst")
    if worst is not None and law["inconsistent"] > LITTLE_OFF * law["checked"]:
        found.append(
            {
                "action": "Check the request log (clocks, lost rows, counting)",
                "reason": f"Little's law is off in {law['inconsistent']} of {law['checked']} windows "
                f"of {law['window_s']} s; worst: measured in-flight {worst['measured_inflight']} vs "
                f"rate x e2e {worst['predicted_inflight']}",
            }
        )
    return found


def recommend_actions(report: dict[str, Any]) -> list[dict[str, str]]:
    """[{'action', 'reason'}] for one model's figures; 'No change' with its reason when nothing trips."""
    actions = (
        _replicas(report)
        + _knee_moved(report)
        + _near_knee(report)
        + _latency(report)
        + _failures(report)
        + _evidence(report)
    )
    if actions:
        return actions
    return [
        {
            "action": "No change",
            "reason": "the replicas run carry the peak, peaks below the knee, latency within SLO "
            "and steady, failures under 1 %",
        }
    ]
