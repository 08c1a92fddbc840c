"""A backtest for people (a timeline in text) and for machines (`--json`).

ramp: a linear ramp from 30 % to 150 % of the knee over 2 h
  breach   +0:53:30  ttft SLO breach (llama-70b) until +2:00:00
  lead     first warning 21.0m before (HeadroomConcurrencyNearKnee), first page 8.5m before (...)
  alerts   6 pages, 11 warnings; false: 0 pages, 0 warnings
  notify   1 page, 4 ticket notifications (Alertmanager's grouping and inhibition); 1 page incident
  +0:32:00  pending   warning   HeadroomConcurrencyNearKnee  instance=replica-0 caliber=requests ...
  ...
  PASS  lead of the first page >= 5m: 8.5m (HeadroomCapacityForecast)
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from collector.backtest.run import BacktestResult
from collector.backtest.timeline import AlertSpan
from collector.backtest.truth import Breach
from collector.backtest.verdict import minutes

__all__ = ["render_text", "to_json", "offset", "scenario_table"]

_SHOWN_LABELS = (
    "cluster",
    "instance",
    "model",
    "engine",
    "caliber",
    "task_class",
    "signal",
    "slo_class",
    "reason",
)


def offset(seconds: float) -> str:
    """'+1:02:30' for 3750 s after the start."""
    sign, seconds = ("-", -seconds) if seconds < 0 else ("+", seconds)
    whole = int(round(seconds))
    return f"{sign}{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _labels(span: AlertSpan) -> str:
    return " ".join(f"{k}={span.labels[k]}" for k in _SHOWN_LABELS if k in span.labels)


def _events(result: BacktestResult, pending: bool) -> list[tuple[float, str]]:
    start, rows = result.timeline.start, []
    for span in result.timeline.alerts:
        if span.firing_at is None and not pending:
            continue
        tag = "" if span.earned else f"  FALSE ({span.why})"
        head = f"{span.severity:<8}  {span.name}  {_labels(span)}{tag}"
        rows.append((span.pending_at, f"pending   {head}"))
        if span.firing_at is not None:
            rows.append((span.firing_at, f"FIRING    {head}"))
        if span.ended_at is not None:
            rows.append(
                (span.ended_at, f"{'resolved' if span.firing_at is not None else 'dropped':<9} {head}")
            )
    return [(t - start, text) for t, text in sorted(rows, key=lambda row: row[0])]


def _lead_text(value: float | None, span: AlertSpan | None) -> str:
    """'12.0m before (HeadroomX)', '2.0m after, late (HeadroomX)' or 'none'."""
    if span is None or value is None:
        return "none"
    when = f"{minutes(value)} before" if value >= 0 else f"{minutes(-value)} after, late"
    return f"{when} ({span.name})"


def _where(breach: Breach) -> str:
    """'llama-70b', or 'llama-70b in cluster a'."""
    return f"{breach.model} in cluster {breach.cluster}" if breach.cluster else breach.model


def render_text(result: BacktestResult, *, pending: bool = False) -> str:
    """The timeline of one backtest; `pending` also lists alerts that went pending but never fired."""
    t = result.timeline
    lines = [f"{result.name}: {result.summary}"]
    breach = t.first_breach
    lines.append(
        f"  breach   {offset(breach.start - t.start)}  {breach.kind} SLO breach ({_where(breach)}) until "
        f"{offset(breach.end - t.start)}"
        if breach
        else "  breach   none: the rows show no SLO breach"
    )
    if breach:
        lines.append(
            f"  lead     first warning {_lead_text(t.lead_warning_s, t.first_warning)}, "
            f"first page {_lead_text(t.lead_page_s, t.first_page)}"
        )
    lines.append(
        f"  alerts   {len(t.pages)} pages, {len(t.warnings)} warnings; false: {len(t.false_pages)} "
        f"pages, {len(t.false_warnings)} warnings"
    )
    pages, tickets = result.notified("page"), result.notified("ticket")
    incidents = len(result.page_incidents)
    lines.append(
        f"  notify   {len(pages)} page, {len(tickets)} ticket notifications (Alertmanager's grouping "
        f"and inhibition); {incidents} page incident{'' if incidents == 1 else 's'}"
        + "".join(
            f"\n           page at {offset(n.at - t.start)}: {', '.join(n.new)}"
            + ("" if n.opens else " (updates the open incident)")
            for n in pages
        )
    )
    if result.missing:
        lines.append(
            f"  missing  {', '.join(result.missing)} (not in the request log: alerts on them cannot fire)"
        )
    lines += [f"  {offset(at)}  {text}" for at, text in _events(result, pending)]
    for check in result.checks:
        lines.append(f"  {'PASS' if check.ok else 'FAIL'}  {check.what}: {check.detail}")
    timings = result.timings_s
    lines.append(
        "  took     "
        + ", ".join(f"{k.removesuffix('_s')} {v:.1f}s" for k, v in timings.items() if k.endswith("_s"))
    )
    return "\n".join(lines)


def _when(t: float | None, start: float) -> dict[str, Any] | None:
    if t is None:
        return None
    return {"at": datetime.fromtimestamp(t, UTC).isoformat(), "offset_s": round(t - start, 3)}


def to_json(result: BacktestResult) -> dict[str, Any]:
    """The backtest as a JSON-ready dict (times as ISO-8601 and seconds from the start)."""
    t = result.timeline
    return {
        "scenario": result.name,
        "summary": result.summary,
        "start": _when(t.start, t.start),
        "end": _when(t.end, t.start),
        "passed": result.passed,
        "first_breach": None
        if t.first_breach is None
        else {
            "kind": t.first_breach.kind,
            "model": t.first_breach.model,
            "cluster": t.first_breach.cluster or None,
            "start": _when(t.first_breach.start, t.start),
            "end": _when(t.first_breach.end, t.start),
        },
        "lead_warning_s": t.lead_warning_s,
        "lead_page_s": t.lead_page_s,
        "first_warning": t.first_warning.name if t.first_warning else None,
        "first_page": t.first_page.name if t.first_page else None,
        "pages": len(t.pages),
        "warnings": len(t.warnings),
        "false_pages": len(t.false_pages),
        "false_warnings": len(t.false_warnings),
        "page_notifications": len(result.notified("page")),
        "page_incidents": len(result.page_incidents),
        "ticket_notifications": len(result.notified("ticket")),
        "notifications": [
            {
                "receiver": n.receiver,
                "group": dict(n.group),
                "at": _when(n.at, t.start),
                "new": list(n.new),
                "alerts": list(n.firing),
                "opens_incident": n.opens,
            }
            for n in result.notifications
        ],
        "problems": [
            {"name": p.name, "kind": p.kind, "start": _when(p.start, t.start), "end": _when(p.end, t.start)}
            for p in t.problems
        ],
        "alerts": [
            {
                "alert": s.name,
                "severity": s.severity,
                "labels": s.labels,
                "pending": _when(s.pending_at, t.start),
                "firing": _when(s.firing_at, t.start),
                "ended": _when(s.ended_at, t.start),
                "earned": s.earned,
                "false_because": s.why or None,
            }
            for s in t.alerts
        ],
        "checks": [{"check": c.what, "ok": c.ok, "detail": c.detail} for c in result.checks],
        "missing_series": result.missing,
        "timings_s": {k: round(v, 3) for k, v in result.timings_s.items()},
    }


def _lead_cell(value: float | None, span: AlertSpan | None) -> str:
    if span is None or value is None:
        return "none"
    when = f"{value / 60:.1f} min before" if value >= 0 else f"{-value / 60:.1f} min late"
    return f"{when} ({span.name.removeprefix('Headroom')})"


def scenario_table(results: list[BacktestResult]) -> str:
    """The markdown table of docs/rules.md: breach, lead times, alerts, notifications, false alerts.

    Notifications are what Alertmanager would send of the alerts (grouped by model, inhibited);
    page incidents what a pager keyed on the group opens of them.
    """
    lines = [
        "| scenario | what happens | first SLO breach | first warning | first page | pages / warnings "
        "| page / ticket notifications | page incidents | false pages / warnings | checks |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        t = result.timeline
        breach = (
            "none"
            if t.first_breach is None
            else f"{(t.first_breach.start - t.start) / 60:.1f} min ({t.first_breach.kind}"
            + (f", cluster {t.first_breach.cluster})" if t.first_breach.cluster else ")")
        )
        lines.append(
            f"| `{result.name}` | {result.summary} | {breach} "
            f"| {_lead_cell(t.lead_warning_s, t.first_warning) if t.first_breach else '-'} "
            f"| {_lead_cell(t.lead_page_s, t.first_page) if t.first_breach else '-'} "
            f"| {len(t.pages)} / {len(t.warnings)} "
            f"| {len(result.notified('page'))} / {len(result.notified('ticket'))} "
            f"| {len(result.page_incidents)} "
            f"| {len(t.false_pages)} / {len(t.false_warnings)} "
            f"| {'pass' if result.passed else 'FAIL'} ({sum(c.ok for c in result.checks)}/{len(result.checks)}) |"
        )
    return "\n".join(lines) + "\n"
