"""Terminal output of the analysis: the levels table and the summary lines (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["levels_table", "print_estimate"]


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def levels_table(estimate: Any, title: str = "concurrency gradient") -> Table:
    """One row per level: rates, p50/p95 TTFT, p95 TPOT/e2e, errors, Little's-law ratio."""
    table = Table(title=title, caption="latencies in seconds; L/λW = Little's-law ratio")
    for header in (
        "conc",
        "n",
        "req/s",
        "tok/s",
        "ttft50",
        "ttft95",
        "tpot95",
        "e2e95",
        "429",
        "err",
        "L/λW",
        "",
    ):
        table.add_column(header, justify="right", no_wrap=True)
    knee, pool = estimate.knee.requests, estimate.recommended_pool
    for s in estimate.levels:
        marks = " ".join(name for name, at in (("knee", knee), ("pool", pool)) if s.concurrency == at)
        little = s.littles_law.ratio if s.littles_law else None
        table.add_row(
            str(s.concurrency),
            str(s.samples),
            _num(s.requests_per_s, 1),
            _num(s.total_tokens_per_s, 0),
            _num(s.ttft_p50_s),
            _num(s.ttft_p95_s),
            _num(s.tpot_p95_s),
            _num(s.e2e_p95_s),
            f"{s.rate_limited_ratio:.0%}",
            f"{s.error_ratio:.0%}",
            _num(little, 2),
            marks,
        )
    return table


def print_estimate(estimate: Any, console: Console | None = None) -> None:
    """The table, then the knee in both calibers, how it was found, SLO max and the pool."""
    console = console or Console()
    console.print(levels_table(estimate))
    knee = estimate.knee
    reached = "" if knee.reached else " (not reached: the highest level measured; a lower bound)"
    console.print(f"knee: {knee.requests} requests, {knee.tokens} tokens{reached}")
    console.print(f"  rule: {knee.rule_reason}")
    console.print(
        f"  Kneedle: throughput {knee.kneedle_throughput}, p95 TTFT {knee.kneedle_latency}; {knee.note}"
    )
    slo = "no SLO given" if estimate.slo_max is None else f"{estimate.slo_max}"
    console.print(f"SLO max: {slo}")
    console.print(f"recommended pool ({estimate.profile}): {estimate.recommended_pool}")
    if estimate.stopped_early:
        console.print(f"[yellow]{estimate.stopped_early}[/yellow]")
