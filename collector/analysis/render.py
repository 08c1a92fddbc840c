"""Terminal output of the analysis: the levels table and the summary lines (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from collector.terminal import compact_table, output_console

__all__ = [
    "LEVEL_HEADERS",
    "levels_table",
    "print_estimate",
    "print_rates",
    "failure_lines",
    "token_lines",
    "token_summary",
]


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _bend(curve: str, value: int | None) -> str:
    """A Kneedle answer as a phrase: ('tokens/s', 8) -> 'tokens/s bends at concurrency 8',
    ('p95 TTFT', None) -> 'p95 TTFT shows no bend'."""
    return f"{curve} shows no bend" if value is None else f"{curve} bends at concurrency {value}"


# the levels table's columns, for people (two-line headers keep an 80-column terminal whole)
# (the 429s are among the errors and in the outcome lines below the table; p50 TTFT in --json)
LEVEL_HEADERS = (
    "in\nflight",
    "samples",
    "req/s",
    "tok/s",
    "TTFT\np95",
    "TPOT\np95",
    "e2e\np95",
    "active\ntokens",
    "errors",
    "L/λW",
    "mark",
)


def levels_table(estimate: Any, title: str = "concurrency gradient") -> Table:
    """One row per level: rates, p95 TTFT/TPOT/e2e, mean active tokens, errors, Little's-law ratio."""
    table = compact_table(
        title,
        LEVEL_HEADERS,
        caption="in flight: concurrent requests; latencies in seconds; active tokens: mean at admission; "
        "L/λW: Little's-law ratio; errors include 429s",
        wrap=("mark",),
    )
    knee, pool = estimate.knee.requests, estimate.recommended_pool
    for s in estimate.levels:
        marks = " ".join(name for name, at in (("knee", knee), ("pool", pool)) if s.concurrency == at)
        little = s.littles_law.ratio if s.littles_law else None
        table.add_row(
            str(s.concurrency),
            str(s.samples),
            _num(s.requests_per_s, 1),
            _num(s.total_tokens_per_s, 0),
            _num(s.ttft_p95_s),
            _num(s.tpot_p95_s),
            _num(s.e2e_p95_s),
            _num(s.mean_active_tokens, 0),
            f"{s.error_ratio:.0%}",
            _num(little, 2),
            marks,
        )
    return table


def print_estimate(estimate: Any, console: Console | None = None) -> None:
    """The table, then the knee in both calibers, how it was found, SLO max and the pool."""
    console = console or output_console()
    console.print(levels_table(estimate))
    knee = estimate.knee
    reached = "" if knee.reached else " (not reached: the highest level measured; a lower bound)"
    tokens = token_summary(estimate)
    console.print(f"knee: {knee.requests} requests, {tokens}{reached}")
    if estimate.extra.get("adapters"):
        console.print(
            f"  measured with {estimate.extra['adapters']} LoRA adapters in the mix, in turn per request"
        )
    # soft_wrap: the terminal wraps these sentences, never a line break in the middle of one
    console.print(f"  rule: {knee.rule_reason}", soft_wrap=True, markup=False)
    console.print(
        f"  Kneedle: {_bend('tokens/s', knee.kneedle_throughput)}, "
        f"{_bend('p95 TTFT', knee.kneedle_latency)}; {knee.note}",
        soft_wrap=True,
        markup=False,
    )
    for line in token_lines(estimate):
        console.print(line, markup=False)
    slo = "no SLO given" if estimate.slo_max is None else f"{estimate.slo_max}"
    console.print(f"SLO max: {slo}")
    pool_reason = estimate.extra.get("pool_reason")
    console.print(
        f"recommended pool ({estimate.profile}): {estimate.recommended_pool}"
        + (f": {pool_reason}" if pool_reason else ""),
        markup=False,
    )
    for line in failure_lines(estimate):
        console.print(line, markup=False)
    if estimate.confidence == "none":
        reason = estimate.confidence_reason or "confidence none"
        console.print(f"[red]publishes nothing:[/red] {escape(reason)}")
    if estimate.stopped_early:
        console.print(f"[yellow]{estimate.stopped_early}[/yellow]")


def failure_lines(estimate: Any) -> list[str]:
    """Per level with failures: its outcome mix and first error, e.g.
    'concurrency 4: ok 30, http 400 10 (25 % failed, not capacity); first error: HTTP 400: ...'."""
    lines = []
    for s in estimate.levels:
        mix = s.outcomes or {}
        if not any(name != "ok" for name in mix):
            continue
        shown = ", ".join(f"{name} {count}" for name, count in mix.items())
        other = s.non_capacity_error_ratio
        share = "" if other is None else f" ({other:.0%} failed for reasons other than capacity)"
        first = f"; first error: {s.first_error}" if s.first_error else ""
        lines.append(f"concurrency {s.concurrency}: {shown}{share}{first}")
    if lines:
        lines.insert(0, "outcomes per level:")
    return lines


def token_summary(estimate: Any) -> str:
    """'952 tokens (time-weighted; p95 1,180)', or 'tokens withheld' when there is no figure."""
    if estimate.knee_tokens is None:
        return "tokens withheld"
    return f"{estimate.knee_tokens:,} tokens (time-weighted; p95 {estimate.knee_tokens_p95:,})"


def token_lines(estimate: Any) -> list[str]:
    """The token capacity's evidence: withheld and why, or the traffic's mix, the admission average
    it is not, and the KV cap."""
    capacity = estimate.token_capacity
    lines = []
    if estimate.token_knee_withheld and estimate.knee.reached:
        lines.append(f"  token capacity withheld: {estimate.token_knee_withheld}")
    if not isinstance(capacity, dict):
        return lines
    if capacity.get("mean") is not None:
        lines.append(
            f"  token capacity at the knee: mean {capacity['mean']:,}, p50 {capacity['p50']:,}, "
            f"p95 {capacity['p95']:,}, max {capacity['max']:,} active tokens; largest request "
            f"{capacity.get('max_request_tokens') or 0:,} tokens"
        )
    if capacity.get("kv_capacity_tokens"):
        lines.append(f"  engine KV capacity: {capacity['kv_capacity_tokens']:,} tokens")
    lines.extend(f"  {note}" for note in capacity.get("notes") or [])
    return lines


def print_rates(rates: Any, console: Console | None = None) -> None:
    """The open-loop ladder (collector.analysis.openloop.RateResult): one row per offered rate,
    then μ_slo, V_P and the Little's-law check against the knee."""
    table = compact_table(
        "open loop (Poisson arrivals)",
        (
            "offered",
            "sent/s",
            "done/s",
            "queue",
            "growth",
            "ttft95",
            "tpot95",
            "e2e95",
            "prefill/s",
            "err",
            "verdict",
        ),
        caption="rates per second, latencies in seconds; queue = mean outstanding requests",
    )
    for level in rates.levels:
        table.add_row(
            f"{level.offered_per_s:g}",
            _num(level.sent_per_s, 2),
            _num(level.achieved_per_s, 2),
            _num(level.outstanding_mean, 1),
            f"{level.outstanding_growth:+.1f}",
            _num(level.ttft_p95_s),
            _num(level.tpot_p95_s),
            _num(level.e2e_p95_s),
            _num(level.prefill_tokens_per_s, 0),
            str(level.errors),
            escape(level.why_not or "ok"),
        )
    out = console or output_console()
    out.print(table)
    if rates.mu_slo_per_s is None:
        out.print(f"μ_slo: not measured ({escape(rates.reason)})")
    else:
        out.print(
            f"μ_slo {rates.mu_slo_per_s:.3g} requests/s, V_P {rates.prefill_tokens_per_s:.0f} prefill "
            f"tokens/s ({escape(rates.reason)})"
        )
    if rates.stopped_early:
        out.print(f"open loop {escape(rates.stopped_early)}")
    if rates.little is not None:
        verdict = "consistent" if rates.little.consistent else "NOT consistent"
        out.print(f"Little's law: {verdict}: {escape(rates.little.explanation)}")
