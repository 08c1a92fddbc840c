"""The capacity plot: tokens/s and p95 TTFT against concurrency, knee, SLO and pool marked.

`render_png()` returns PNG bytes of a fixed pixel size (no tight bounding box, so the size is
exactly width x height); `write_plot()` writes the PNG and a self-contained HTML page that embeds
it as base64 beside a table of the levels, so the page can be mailed or attached to a ticket.
When the estimate carries an open-loop ladder (`--rates`), `render_rates_png()` draws it too:
written beside as `<name>-rates.png` and embedded in the same page.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from collector.analysis.render import token_summary

__all__ = [
    "render_png",
    "render_rates_png",
    "render_html",
    "write_plot",
    "rates_plot_path",
    "DEFAULT_SIZE_PX",
]

DEFAULT_SIZE_PX = (1200, 800)
_DPI = 100


def _mark(ax: Any, x: int | None, label: str, color: str, style: str) -> None:
    if x:
        ax.axvline(x, color=color, linestyle=style, linewidth=1.5, label=label)


def _queue_bars(ax: Any, levels: Any) -> None:
    """The engine's mean queue per level, as bars on a right-hand axis, when it was read."""
    queue = [
        (s.concurrency, s.engine_waiting_mean)
        for s in levels
        if getattr(s, "engine_waiting_mean", None) is not None
    ]
    if not queue:
        return
    right = ax.twinx()
    right.bar(
        [c for c, _ in queue],
        [w for _, w in queue],
        width=[c * 0.25 for c, _ in queue],
        color="tab:gray",
        alpha=0.35,
        label="engine queue (mean)",
    )
    right.set_ylabel("requests waiting in the engine")
    right.set_ylim(bottom=0, top=max(1.0, max(w for _, w in queue)) * 1.2)
    right.legend(loc="upper center")


def render_png(estimate: Any, size_px: tuple[int, int] = DEFAULT_SIZE_PX) -> bytes:
    """PNG bytes of the two-panel plot for a CapacityEstimate."""
    # lazy: matplotlib loads only when a plot is drawn, never on the probe's or the sidecar's path
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # no pyplot: no global state, safe in threads

    levels = estimate.levels
    xs = [s.concurrency for s in levels]
    fig = Figure(figsize=(size_px[0] / _DPI, size_px[1] / _DPI), dpi=_DPI)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(xs, [s.total_tokens_per_s for s in levels], "o-", color="tab:blue", label="total tokens/s")
    top.plot(xs, [s.output_tokens_per_s for s in levels], "s--", color="tab:cyan", label="output tokens/s")
    top.set_ylim(bottom=0)  # a plateau drawn from zero looks like one
    bottom.plot(xs, [s.ttft_p95_s for s in levels], "o-", color="tab:purple", label="p95 TTFT")
    _queue_bars(bottom, levels)
    for ax in (top, bottom):
        _mark(ax, estimate.knee.requests, f"knee {estimate.knee.requests}", "tab:red", "--")
        _mark(ax, estimate.slo_max, f"SLO max {estimate.slo_max}", "tab:orange", ":")
        _mark(
            ax,
            estimate.recommended_pool,
            f"pool {estimate.recommended_pool} ({estimate.profile})",
            "tab:green",
            "-.",
        )
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    if estimate.slo.ttft_p95_s is not None:
        bottom.axhline(
            estimate.slo.ttft_p95_s,
            color="tab:orange",
            linewidth=1,
            label=f"SLO p95 TTFT {estimate.slo.ttft_p95_s:g} s",
        )
    top.set_ylabel("tokens/s")
    bottom.set_ylabel("p95 TTFT (s)")
    bottom.set_xlabel("concurrency (requests in flight)")
    bottom.set_xticks(xs, [str(x) for x in xs])
    model = Path(estimate.model).name if estimate.model else "model"  # llama.cpp ids are paths
    top.set_title(f"Capacity of {model} ({estimate.source}, run {estimate.run_id or '-'})")
    top.legend(loc="lower right")
    bottom.legend(loc="upper left")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=_DPI)
    return buffer.getvalue()


def render_rates_png(
    rates: dict[str, Any],
    *,
    ttft_slo_s: float | None = None,
    title: str = "Open loop",
    reference: tuple[str, float] | None = None,
    size_px: tuple[int, int] = DEFAULT_SIZE_PX,
) -> bytes:
    """PNG bytes of the open-loop ladder (an estimate's `rates` section, RateResult.to_dict()):
    achieved against offered rate (the diagonal is 'keeps up'), and p95 TTFT against offered
    rate on a log axis, μ_slo marked on both (and `reference`, a labelled rate such as a known
    saturation rate); drifting levels drawn hollow."""
    import matplotlib  # lazy, as render_png

    matplotlib.use("Agg")
    # lazy: matplotlib only when a plot is drawn
    from matplotlib.figure import Figure

    levels = sorted(rates.get("levels") or [], key=lambda lv: lv["offered_per_s"])
    offered = [lv["offered_per_s"] for lv in levels]
    fig = Figure(figsize=(size_px[0] / _DPI, size_px[1] / _DPI), dpi=_DPI)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(offered, offered, ":", color="tab:gray", label="offered (keeps up)")
    top.plot(offered, [lv["achieved_per_s"] for lv in levels], "o-", color="tab:blue", label="achieved")
    bottom.plot(offered, [lv["ttft_p95_s"] for lv in levels], "o-", color="tab:purple", label="p95 TTFT")
    drifting = [lv for lv in levels if lv.get("drifting") or lv.get("ended_early")]
    if drifting:
        top.plot(
            [lv["offered_per_s"] for lv in drifting],
            [lv["achieved_per_s"] for lv in drifting],
            "o",
            markerfacecolor="white",
            color="tab:red",
            label="queue drifts",
        )
    mu = rates.get("mu_slo_requests_per_s")
    for ax in (top, bottom):
        if mu:
            ax.axvline(mu, color="tab:red", linestyle="--", linewidth=1.5, label=f"μ_slo {mu:.3g}/s")
        if reference is not None:
            ax.axvline(reference[1], color="tab:green", linestyle="-.", linewidth=1.5, label=reference[0])
        ax.grid(True, alpha=0.3)
    if ttft_slo_s is not None:
        bottom.axhline(ttft_slo_s, color="tab:orange", linewidth=1, label=f"SLO p95 TTFT {ttft_slo_s:g} s")
    top.set_ylim(bottom=0)
    bottom.set_yscale("log")
    top.set_ylabel("achieved requests/s")
    bottom.set_ylabel("p95 TTFT (s)")
    bottom.set_xlabel("offered requests/s (Poisson arrivals)")
    top.set_title(title)
    top.legend(loc="upper left")
    bottom.legend(loc="upper left")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=_DPI)
    return buffer.getvalue()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):  # the outcome mix: "ok 30, http 400 10"
        return html.escape(", ".join(f"{k} {v}" for k, v in value.items()))
    return html.escape("" if value is None else str(value))


# the page's levels table: (LevelStats field, the column's name for people)
HTML_COLUMNS = (
    ("concurrency", "requests in flight"),
    ("samples", "requests measured"),
    ("total_tokens_per_s", "tokens/s"),
    ("mean_active_tokens", "active tokens (mean at admission)"),
    ("ttft_p50_s", "TTFT p50 (s)"),
    ("ttft_p95_s", "TTFT p95 (s)"),
    ("tpot_p95_s", "TPOT p95 (s)"),
    ("e2e_p95_s", "end-to-end p95 (s)"),
    ("error_ratio", "errors (share)"),
    ("outcomes", "outcomes"),
    ("first_error", "first error"),
)


def render_html(estimate: Any, png: bytes, rates_png: bytes | None = None) -> str:
    """A self-contained HTML page: summary, the plot(s) inlined as base64, and the levels table."""
    rows = "".join(
        "<tr>" + "".join(f"<td>{_cell(level.to_dict().get(key))}</td>" for key, _ in HTML_COLUMNS) + "</tr>"
        for level in estimate.levels
    )
    knee = estimate.knee
    tokens = token_summary(estimate)
    pool_reason = estimate.extra.get("pool_reason")
    summary = (
        f"knee {knee.requests} requests / {tokens}; SLO max "
        f"{_cell(estimate.slo_max)}; recommended pool {estimate.recommended_pool} "
        f"({_cell(estimate.profile)}){': ' + _cell(pool_reason) if pool_reason else ''}; "
        f"confidence {_cell(estimate.confidence)}"
    )
    notes = [
        f"Token capacity withheld: {estimate.token_knee_withheld}"
        if estimate.token_knee_withheld and knee.reached
        else None,
        f"Publishes nothing: {estimate.confidence_reason}" if estimate.confidence == "none" else None,
    ]
    summary += "".join(f"</p>\n<p>{_cell(note)}" for note in notes if note)
    images = f"<img alt='capacity plot' src='data:image/png;base64,{_base64(png)}'>\n"
    if rates_png is not None:
        images += (
            "<p>Open loop: achieved rate and p95 TTFT against the offered rate, μ_slo marked.</p>\n"
            f"<img alt='open-loop plot' src='data:image/png;base64,{_base64(rates_png)}'>\n"
        )
    return (
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>headroom capacity</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}"
        "</style></head><body>\n"
        f"<h1>Capacity: {_cell(estimate.model)}</h1>\n<p>{summary}</p>\n"
        f"<p>Knee rule: {_cell(knee.rule_reason)}. Kneedle: {_cell(knee.note)}</p>\n"
        f"{images}<table><tr>"
        + "".join(f"<th>{html.escape(header)}</th>" for _, header in HTML_COLUMNS)
        + f"</tr>{rows}</table>\n"
        "</body></html>\n"
    )


def _base64(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")


def rates_plot_path(png_path: str | Path) -> Path:
    """Where write_plot puts the open-loop plot: cap.png -> cap-rates.png."""
    path = Path(png_path)
    return path.with_name(f"{path.stem}-rates.png")


def _rates_png(estimate: Any, size_px: tuple[int, int]) -> bytes | None:
    """The open-loop plot of an estimate whose probe ran --rates (levels measured), else None."""
    rates = getattr(estimate, "rates", None)
    if not rates or not rates.get("levels"):
        return None
    model = Path(estimate.model).name if estimate.model else "model"  # llama.cpp ids are paths
    mu = rates.get("mu_slo_requests_per_s")
    shown = f"μ_slo {mu:.3g}/s" if mu is not None else f"no μ_slo: {rates.get('reason')}"
    return render_rates_png(
        rates,
        ttft_slo_s=estimate.slo.ttft_p95_s,
        title=f"Open loop of {model} ({estimate.source}, run {estimate.run_id or '-'}): {shown}"[:140],
        size_px=size_px,
    )


def write_plot(
    estimate: Any, path: str | Path, size_px: tuple[int, int] = DEFAULT_SIZE_PX
) -> tuple[Path, Path]:
    """Write PATH (PNG) and PATH with .html (self-contained); returns both paths. With an
    open-loop ladder, also rates_plot_path(PATH), embedded in the page."""
    png_path = Path(path)
    if png_path.suffix.lower() == ".html":
        png_path = png_path.with_suffix(".png")
    png_path.parent.mkdir(parents=True, exist_ok=True)
    png = render_png(estimate, size_px)
    png_path.write_bytes(png)
    rates_png = _rates_png(estimate, size_px)
    if rates_png is not None:
        rates_plot_path(png_path).write_bytes(rates_png)
    html_path = png_path.with_suffix(".html")
    html_path.write_text(render_html(estimate, png, rates_png), encoding="utf-8")
    return png_path, html_path
