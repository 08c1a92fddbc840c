"""The review's figures (matplotlib, loaded only when an HTML review is drawn), per replica.

    load_figure(model)        load per replica over the window, per replica class, against the
                              class's knee and pool (requests left, tokens right: the token
                              capacity's time-weighted mean and p95, the pool in tokens at its p99.9)
    curve_figure(model)       p95 TTFT by one replica's concurrency at admission (ticks 1, 2, 4, ...)
    throughput_figure(model)  tokens/s per replica against requests in flight per replica, one
                              point per bin (the completed requests' tokens in the bin / its length)
    littles_figure(model)     Little's law per window: measured in-flight against rate x e2e
    *_png(model)              the same as PNG bytes

Every axis is per replica, so a fleet of 40 reads like one replica and never mixes a fleet-wide y
with a per-replica x. Time axes span the traffic (one hour reads in minutes, not years), and
series of few points carry markers, so one bin is a visible dot. Each figure is 12 x 4.2 inches at
100 dpi (1200 px wide), so it reads at a browser's full width.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = [
    "load_figure",
    "curve_figure",
    "throughput_figure",
    "littles_figure",
    "load_png",
    "curve_png",
    "throughput_png",
    "littles_png",
]

_SIZE, _DPI = (12, 4.2), 100
_CALIBERS = (("requests", "requests in flight"), ("tokens", "active tokens"))
_MARKERS_BELOW = 60  # series with fewer points are drawn with markers
_COLOURS = ("tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan")


def _figure(columns: int) -> tuple[Any, list[Any]]:
    # lazy: matplotlib loads only when an HTML review is drawn, never on the sidecar's path
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # no pyplot: no global state, safe in threads

    figure = Figure(figsize=_SIZE, dpi=_DPI)
    return figure, (list(figure.subplots(1, columns)) if columns > 1 else [figure.subplots()])


def _png(figure: Any) -> bytes:
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _marker(points: int) -> str | None:
    return "o" if points < _MARKERS_BELOW else None


def _powers_of_two(axis: Any, values: list[float]) -> None:
    """Log-2 x axis labelled 1, 2, 4, ... (not 2^n)."""
    from matplotlib.ticker import FixedLocator, NullLocator  # lazy, as in _figure

    axis.set_xscale("log", base=2)
    top = max(values + [1])
    ticks = [2**i for i in range(0, int(top).bit_length() + 1)]
    axis.xaxis.set_major_locator(FixedLocator(ticks))
    axis.xaxis.set_minor_locator(NullLocator())
    axis.set_xticklabels([f"{t:,}" for t in ticks], rotation=45 if len(ticks) > 10 else 0)


def _class_label(model: dict[str, Any], entry: dict[str, Any]) -> str:
    return f" ({entry['replica_class']})" if len(model["classes"]) > 1 else ""


def _knee_line(axis: Any, knee: float | None, *, vertical: bool, label: str, colour: str = "tab:red") -> None:
    if knee:
        (axis.axvline if vertical else axis.axhline)(knee, color=colour, linestyle="--", label=label)


def _time_axis(axis: Any, starts: list[datetime], step: int) -> None:
    """The traffic's span (a bin either side), ticks the locator picks for that span."""
    from matplotlib import dates as matplotlib_dates  # lazy, as in _figure

    dates: Any = matplotlib_dates  # partly untyped
    if not starts:
        return
    pad = timedelta(seconds=step)
    axis.set_xlim(min(starts) - pad, max(starts) + 2 * pad)
    locator = dates.AutoDateLocator(tz=UTC, minticks=3, maxticks=9)
    axis.xaxis.set_major_locator(locator)
    axis.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator, tz=UTC))
    axis.set_xlabel("time (UTC)")


def load_figure(model: dict[str, Any]) -> Any:
    """Mean load per replica in each bin over the window, per class, against each class's knee and
    pool per replica; requests left, tokens right."""
    figure, axes = _figure(2)
    for axis, (caliber, label) in zip(axes, _CALIBERS):
        starts: list[datetime] = []
        step = 60
        for colour, entry in zip(_COLOURS, model["classes"]):
            bins, name = entry["load"]["bins"], _class_label(model, entry)
            step = entry["load"]["step"] or step
            times = [datetime.fromtimestamp(b["t"], UTC) for b in bins]
            starts += times
            values = [b[f"{caliber}_per_replica"] for b in bins]
            axis.plot(
                times,
                values,
                drawstyle="steps-post" if len(times) >= _MARKERS_BELOW else "default",
                marker=_marker(len(times)),
                color=colour,
                label=f"mean per replica, {step} s bins{name}",
            )
            concurrency = entry["concurrency"]
            if caliber == "requests":
                _knee_line(axis, concurrency["knee_requests"], vertical=False, label=f"knee{name}")
            else:  # bins are means over time: the time-weighted mean reads against them; p95 beside
                _knee_line(
                    axis, concurrency.get("knee_tokens"), vertical=False, label=f"token capacity, mean{name}"
                )
                _knee_line(
                    axis,
                    concurrency.get("knee_tokens_p95"),
                    vertical=False,
                    label=f"token capacity, p95{name}",
                    colour="tab:pink",
                )
            pool = entry["plan"]["pool_per_replica"][caliber]
            if pool:
                which = " (p99.9 at the pool)" if caliber == "tokens" else ""
                axis.axhline(pool, color="tab:orange", linestyle=":", label=f"pool {pool:,.0f}{which}{name}")
        _time_axis(axis, starts, step)
        axis.set_ylim(bottom=0)
        axis.set_ylabel(f"{label} per replica")
        axis.set_title(f"{label} per replica vs the knee and the pool")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small", loc="upper left")
    return figure


def curve_figure(model: dict[str, Any]) -> Any:
    """The passive capacity curve: p95 TTFT by one replica's concurrency at admission, both calibers."""
    figure, axes = _figure(2)
    slo = model["slo"]["ttft_p95_s"]
    for axis, (key, caliber, label) in zip(
        axes, (("curve", "requests", "requests in flight"), ("curve_tokens", "tokens", "active tokens"))
    ):
        points = [(b["bucket"], b["ttft_p95_s"]) for b in model[key] if b["ttft_p95_s"] is not None]
        # the buckets are counts at admission, instants: in tokens the knee is the p95
        limit = "knee_requests" if caliber == "requests" else "knee_tokens_p95"
        knees = [e["concurrency"].get(limit) for e in model["classes"]]
        if points:
            axis.plot(*zip(*points), marker="o", color="tab:purple", label="p95 TTFT")
            _powers_of_two(axis, [x for x, _ in points] + [k or 1 for k in knees])
        for entry in model["classes"]:
            knee = entry["concurrency"].get(limit)
            which = "" if caliber == "requests" else " (p95)"
            _knee_line(
                axis, knee, vertical=True, label=f"knee {knee or 0:,g}{which}{_class_label(model, entry)}"
            )
        if slo:
            axis.axhline(slo, color="tab:orange", linestyle=":", label=f"SLO {slo:g} s")
        axis.set_ylim(bottom=0)
        axis.set_xlabel(f"{label} on the replica at admission (bucket)")
        axis.set_ylabel("p95 TTFT (s)")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
    return figure


def throughput_figure(model: dict[str, Any]) -> Any:
    """Tokens/s per replica against requests in flight per replica, one point per bin, the knee marked."""
    figure, (axis,) = _figure(1)
    for colour, entry in zip(_COLOURS, model["classes"]):
        bins = [b for b in entry["load"]["bins"] if b["requests"] > 0]
        name = _class_label(model, entry)
        if bins:
            axis.scatter(
                [b["requests_per_replica"] for b in bins],
                [b["tokens_per_s_per_replica"] for b in bins],
                color=colour,
                alpha=0.7,
                label=f"one {entry['load']['step']} s bin{name}",
            )
        knee = entry["concurrency"]["knee_requests"]
        _knee_line(axis, knee, vertical=True, label=f"knee {knee or 0:g}{name}")
    axis.set_xlim(left=0)
    axis.set_ylim(bottom=0)
    axis.set_xlabel("mean requests in flight per replica")
    axis.set_ylabel("tokens/s per replica (prompt + generated)")
    axis.set_title("throughput vs concurrency: flat past the knee means more concurrency buys only latency")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small")
    return figure


def littles_figure(model: dict[str, Any]) -> Any:
    """Little's law per window: measured mean in-flight against completion rate x mean e2e; on the
    diagonal when the log's counting, clocks and durations agree."""
    figure, (axis,) = _figure(1)
    law = model["littles_law"]
    windows = law["windows"]
    if windows:
        good = [w for w in windows if w["consistent"]]
        off = [w for w in windows if not w["consistent"]]
        for group, colour, label in ((good, "tab:blue", "within 15 %"), (off, "tab:red", "off by more")):
            if group:
                axis.scatter(
                    [w["predicted_inflight"] for w in group],
                    [w["measured_inflight"] for w in group],
                    color=colour,
                    alpha=0.7,
                    label=f"one {law['window_s']} s window, {label}",
                )
        top = max(max(w["predicted_inflight"], w["measured_inflight"]) for w in windows) * 1.1 or 1.0
        axis.plot([0, top], [0, top], color="grey", linestyle="--", label="measured = rate × e2e")
        axis.set_xlim(0, top)
        axis.set_ylim(0, top)
    axis.set_xlabel("completion rate × mean e2e (requests)")
    axis.set_ylabel("measured mean in flight (requests)")
    axis.set_title("Little's law per window")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small")
    return figure


def load_png(model: dict[str, Any]) -> bytes:
    return _png(load_figure(model))


def curve_png(model: dict[str, Any]) -> bytes:
    return _png(curve_figure(model))


def throughput_png(model: dict[str, Any]) -> bytes:
    return _png(throughput_figure(model))


def littles_png(model: dict[str, Any]) -> bytes:
    return _png(littles_figure(model))
