"""The review's figures as PNG bytes (matplotlib, loaded only when an HTML review is drawn).

    week_png(model)        peak concurrency per hour over the window against the knee, both calibers
    curve_png(model)       p95 TTFT by concurrency bucket (ticks 1, 2, 4, ...), both calibers
    throughput_png(model)  tokens/s against mean in-flight requests per hour, the knee marked

Each figure is 12 x 4.2 inches at 100 dpi (1200 px wide), so it reads at a browser's full width.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

__all__ = ["week_png", "curve_png", "throughput_png"]

_SIZE, _DPI = (12, 4.2), 100
_CALIBERS = (("requests", "in-flight requests"), ("tokens", "active tokens"))


def _figure(columns: int) -> tuple[Any, list[Any]]:
    # lazy: matplotlib loads only when an HTML review is drawn, never on the sidecar's path
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # no pyplot: no global state, safe in threads

    figure = Figure(figsize=_SIZE, dpi=_DPI)
    return figure, (figure.subplots(1, columns) if columns > 1 else [figure.subplots()])


def _png(figure: Any) -> bytes:
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _powers_of_two(axis: Any, values: list[float]) -> None:
    """Log-2 x axis labelled 1, 2, 4, ... (not 2^n)."""
    from matplotlib.ticker import FixedLocator, NullLocator  # lazy, as in _figure

    axis.set_xscale("log", base=2)
    top = max(values + [1])
    ticks = [2**i for i in range(0, int(top).bit_length() + 1)]
    axis.xaxis.set_major_locator(FixedLocator(ticks))
    axis.xaxis.set_minor_locator(NullLocator())
    axis.set_xticklabels([f"{t:,}" for t in ticks], rotation=45 if len(ticks) > 10 else 0)


def _knee_line(axis: Any, knee: float | None, *, vertical: bool) -> None:
    if knee:
        (axis.axvline if vertical else axis.axhline)(
            knee, color="tab:red", linestyle="--", label=f"knee {knee:g}"
        )


def week_png(model: dict[str, Any]) -> bytes:
    """Hourly peak concurrency over the window against the knee, requests left and tokens right."""
    figure, axes = _figure(2)
    hours = [datetime.fromtimestamp(h["hour"], UTC) for h in model["hourly"]]
    for axis, (caliber, label) in zip(axes, _CALIBERS):
        peaks = [h[f"peak_{caliber}"] for h in model["hourly"]]
        axis.plot(hours, peaks, drawstyle="steps-post", color="tab:blue", label=f"peak {label} per hour")
        _knee_line(axis, model["concurrency"][f"knee_{caliber}"], vertical=False)
        axis.set_ylabel(label)
        axis.set_title(f"peak {label} vs the knee")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small", loc="upper left")
        for tick in axis.get_xticklabels():
            tick.set_rotation(30)
    return _png(figure)


def curve_png(model: dict[str, Any]) -> bytes:
    """The passive capacity curve: p95 TTFT by concurrency bucket at admission, both calibers."""
    figure, axes = _figure(2)
    slo = model["slo"]["ttft_p95_s"]
    for axis, (key, caliber, label) in zip(
        axes, (("curve", "requests", "in-flight requests"), ("curve_tokens", "tokens", "active tokens"))
    ):
        points = [(b["bucket"], b["ttft_p95_s"]) for b in model[key] if b["ttft_p95_s"] is not None]
        if points:
            axis.plot(*zip(*points), marker="o", color="tab:purple", label="p95 TTFT")
            _powers_of_two(axis, [x for x, _ in points] + [model["concurrency"][f"knee_{caliber}"] or 1])
        _knee_line(axis, model["concurrency"][f"knee_{caliber}"], vertical=True)
        if slo:
            axis.axhline(slo, color="tab:orange", linestyle=":", label=f"SLO {slo:g} s")
        axis.set_xlabel(f"{label} at admission (bucket)")
        axis.set_ylabel("p95 TTFT (s)")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
    return _png(figure)


def throughput_png(model: dict[str, Any]) -> bytes:
    """Tokens/s against mean in-flight requests, one point per hour, with the knee."""
    figure, (axis,) = _figure(1)
    points = [(h["mean_requests"], h["tokens_per_s"]) for h in model["hourly"] if h["mean_requests"]]
    if points:
        axis.scatter(*zip(*points), color="tab:blue", alpha=0.7, label="one hour")
    _knee_line(axis, model["concurrency"]["knee_requests"], vertical=True)
    axis.set_xlabel("mean in-flight requests at admission")
    axis.set_ylabel("tokens/s (prompt + generated)")
    axis.set_title("throughput vs concurrency: flat past the knee means more concurrency buys only latency")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small")
    return _png(figure)
