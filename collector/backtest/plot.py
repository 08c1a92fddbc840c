"""The backtest as a picture: both calibers, the SLO breaches and every alert on one time axis.

Three panels share the x axis (minutes from the start): in-flight requests with the published knee,
active tokens with the token knee (the calibers are never drawn on one axis: their units differ),
and one row per alert, pending pale and firing solid, red for pages and orange for warnings. SLO
breaches are shaded grey across all three. A caliber's axis stops at CLIP_AT_KNEES x its knee line
when an overload's queue climbs past it (and says where the peak was).

    plot_backtest(result, Path("ramp.png"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collector.backtest.run import BacktestResult

__all__ = ["plot_backtest"]

_COLOURS = {"critical": "#c0392b", "warning": "#e67e22"}


def _minutes(t: float, start: float) -> float:
    return (t - start) / 60


# a caliber's axis reaches this many times its knee line at most: past it an overload's queue
# (hundreds in flight against a knee of 32) would flatten the approach to the knee, the part that matters
CLIP_AT_KNEES = 3.0


def _y_top(values: list[float], knee_line: float | None) -> tuple[float, bool]:
    """The axis top for a caliber: its peak with 5 % room, or CLIP_AT_KNEES x the knee line when
    the peak is higher than that; and whether it clipped.

    Examples: ([10, 40], 32) -> (42.0, False); ([10, 550], 32) -> (96.0, True); ([0], None) -> (1.0, False)
    """
    peak = max(values, default=0.0)
    top = max(peak * 1.05, (knee_line or 0.0) * 1.1, 1.0)
    if knee_line and peak > CLIP_AT_KNEES * knee_line:
        return CLIP_AT_KNEES * knee_line, True
    return top, False


def _caliber(axis: Any, result: BacktestResult, caliber: str, label: str, replicas: int) -> None:
    start = result.timeline.start
    points = result.calibers.get(caliber, [])
    values = [v for _, v in points]
    axis.plot([_minutes(t, start) for t, _ in points], values, color="#2c3e50", linewidth=0.8)
    knee = result.knee.get(caliber)
    knee_line = knee * replicas if knee else None
    if knee_line:
        axis.axhline(
            knee_line,
            color="#8e44ad",
            linestyle="--",
            linewidth=1,
            label=f"knee x {replicas} replica(s)" if replicas > 1 else "knee",
        )
        axis.legend(loc="upper left", fontsize=7)
    top, clipped = _y_top(values, knee_line)
    axis.set_ylim(0, top)
    if clipped:  # say what the axis leaves out rather than squash the knee into the floor
        axis.text(
            0.99,
            0.95,
            f"off scale: peaks at {max(values):,.0f}",
            transform=axis.transAxes,
            ha="right",
            va="top",
            fontsize=7,
            color="#7f8c8d",
        )
    axis.set_ylabel(label, fontsize=8)


def _alerts(axis: Any, result: BacktestResult) -> None:
    t = result.timeline
    names = sorted({span.name for span in t.alerts if span.firing_at is not None})
    for row, name in enumerate(names):
        for span in (s for s in t.alerts if s.name == name):
            end = span.ended_at if span.ended_at is not None else t.end
            colour = _COLOURS.get(span.severity, "#7f8c8d")
            fire = span.firing_at if span.firing_at is not None else end
            axis.broken_barh(
                [(_minutes(span.pending_at, t.start), (fire - span.pending_at) / 60)],
                (row - 0.35, 0.7),
                color=colour,
                alpha=0.25,
            )
            if span.firing_at is not None:
                axis.broken_barh(
                    [(_minutes(span.firing_at, t.start), (end - span.firing_at) / 60)],
                    (row - 0.35, 0.7),
                    color=colour,
                )
    axis.set_yticks(range(len(names)), [name.removeprefix("Headroom") for name in names], fontsize=7)
    axis.set_ylim(-0.7, max(len(names), 1) - 0.3)
    axis.set_xlabel("minutes from the start", fontsize=8)


def plot_backtest(result: BacktestResult, path: Path, replicas: int = 1) -> Path:
    """Write the picture of `result` to `path` (PNG or SVG by suffix); returns the path."""
    # lazy: matplotlib takes a second to import and only --plot needs it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy, as above: after choosing the file-only backend

    t = result.timeline
    alerts = len({span.name for span in t.alerts if span.firing_at is not None})
    figure, axes = plt.subplots(
        3,
        1,
        sharex=True,
        figsize=(11, 5 + 0.22 * alerts),
        gridspec_kw={"height_ratios": [2, 2, max(1.5, 0.3 * alerts)]},
    )
    _caliber(axes[0], result, "requests", "in-flight requests", replicas)
    _caliber(axes[1], result, "tokens", "active tokens", replicas)
    _alerts(axes[2], result)
    for problem in t.problems:
        for axis in axes:
            axis.axvspan(
                _minutes(problem.start, t.start),
                _minutes(problem.end, t.start),
                color="#95a5a6",
                alpha=0.18 if problem.kind == "breach" else 0.08,
                linewidth=0,
            )
    if t.first_breach is not None:
        for axis in axes:
            axis.axvline(_minutes(t.first_breach.start, t.start), color="black", linewidth=0.8, linestyle=":")
    axes[0].set_title(
        f"{result.name}: {result.summary}\n(grey: SLO breaches and incidents; dotted: the first "
        f"breach; red pages, orange warnings, pale while pending)",
        fontsize=9,
    )
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
