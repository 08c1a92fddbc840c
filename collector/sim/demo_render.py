"""Rich rendering of the `headroom demo` summary (numbers come from demo_summary, never computed here)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from collector.sim.demo_summary import DemoSummary, sparkline
from collector.terminal import compact_table

__all__ = ["render_summary", "ms"]


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds with one decimal; '-' for none. Example: 0.01234 -> '12.3'."""
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _triple(p50: float | None, p95: float | None, p99: float | None) -> str:
    return " / ".join(ms(seconds) for seconds in (p50, p95, p99))


def _level_table(summary: DemoSummary) -> Table:
    table = compact_table(
        f"Per concurrency level, exact percentiles from {summary['db']}",
        (
            "conc.",
            "requests",
            "429",
            "out\ntok/s",
            "TTFT ms\np50 / p95 / p99",
            "TPOT ms\np50 / p95 / p99",
            "peak\nin-flight",
            "peak\nactive tok",
        ),
    )
    peaks = summary["calibers"]["per_level_peaks"]
    for level in summary["levels"]:
        peak = peaks.get(level["concurrency"], {})
        table.add_row(
            str(level["concurrency"]),
            str(level["requests"]),
            str(level["rate_limited"]),
            f"{level['output_tokens_per_s'] or 0:.0f}",
            _triple(level["ttft_p50_s"], level["ttft_p95_s"], level["ttft_p99_s"]),
            _triple(level["tpot_p50_s"], level["tpot_p95_s"], level["tpot_p99_s"]),
            f"{peak.get('inflight', 0):.0f}",
            f"{peak.get('active_tokens', 0):.0f}",
        )
    return table


def render_summary(summary: DemoSummary, console: Console) -> None:
    """Print the level table, the caliber time course, the capacity verdict and where data lives."""
    console.print(_level_table(summary))
    calibers = summary["calibers"]
    course = calibers["time_course"]
    console.print(f"\n[bold]Both calibers over time[/] ({len(course)} scrapes of the sidecar's /metrics)")
    console.print(
        f"  in-flight requests  peak {calibers['peak_inflight']:.0f}  "
        f"{sparkline([s.get('inflight', 0.0) for s in course])}"
    )
    console.print(
        f"  active tokens       peak {calibers['peak_active_tokens']:.0f}  "
        f"{sparkline([s.get('active_tokens', 0.0) for s in course])}"
    )
    console.print(
        f"  engine waiting      peak {max((s.get('engine_waiting', 0.0) for s in course), default=0):.0f}  "
        f"{sparkline([s.get('engine_waiting', 0.0) for s in course])}"
    )
    capacity = summary.get("capacity")
    if capacity:
        knee, tokens = capacity["knee"], capacity.get("token_capacity") or {}
        in_tokens = (
            f"{tokens['mean']:,} active tokens time-weighted (p95 {tokens['p95']:,})"
            if tokens.get("mean") is not None
            else f"tokens withheld: {tokens.get('withheld') or 'not computed'}"
        )
        console.print(
            f"\n[bold]Capacity[/]: knee at {knee['requests']} requests / {in_tokens} "
            f"({knee['rule_reason']}); recommended pool "
            f"{capacity['recommended_pool']} ({capacity['profile']}); "
            f"simulator max_num_seqs={summary['sim']['max_num_seqs']}"
        )
    else:
        console.print(
            "\n[bold]Capacity[/]: analysis not available in this build; the table above is the raw data"
        )
    console.print(
        f"\n[bold]Where things live[/]\n  request log  {summary['db']}\n"
        f"  review       headroom report --db {summary['db']} --since 1d\n"
        f"  sidecar      {summary['sidecar_url']}/metrics (headroom_*, incl. headroom_capacity_*)\n"
        f"  engine       {summary['sim_url']}/metrics (vllm:*) and /sim/state"
    )
    if summary.get("serving"):
        console.print("  both keep serving until Ctrl-C")
    else:
        console.print("  both stopped with the demo; --keep-serving keeps them up to explore")
    if summary.get("json"):
        console.print(f"  summary      {summary['json']}")
