"""SeriesSet: timestamped samples by series, and their OpenMetrics text for promtool's backfill.

`promtool tsdb create-blocks-from openmetrics` reads one sample per line with a timestamp in
seconds and `# EOF` at the end; metadata lines are optional, so none are written (the TSDB keeps no
types). Lines come sorted by series, then time, so the same samples give the same bytes:

    series = SeriesSet()
    series.add("up", {"job": "j", "instance": "a"}, 1767571200.0, 1)
    series.to_openmetrics()  ->  'up{instance="a",job="j"} 1 1767571200.000\\n# EOF\\n'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

__all__ = ["SeriesKey", "SeriesSet", "labels_text"]

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # (metric name, sorted (label, value) pairs)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labels_text(labels: tuple[tuple[str, str], ...]) -> str:
    """'{a="1",b="x"}' for sorted pairs; '' without labels."""
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in labels) + "}"


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) else str(int(value))


class SeriesSet:
    """Samples keyed by series; `add` in time order per series (each series' samples must rise in time)."""

    def __init__(self) -> None:
        self._samples: dict[SeriesKey, list[tuple[float, float]]] = {}

    def add(self, name: str, labels: dict[str, str], t: float, value: float) -> None:
        """Append one sample at POSIX time `t` to series `name{labels}`."""
        key = (name, tuple(sorted(labels.items())))
        self._samples.setdefault(key, []).append((t, float(value)))

    def add_key(self, key: SeriesKey, t: float, value: float) -> None:
        """Append to a series by its key (the fast path of the exposition loop)."""
        self._samples.setdefault(key, []).append((t, value))

    def keys(self) -> list[SeriesKey]:
        return sorted(self._samples)

    def samples(self, key: SeriesKey) -> list[tuple[float, float]]:
        return self._samples.get(key, [])

    def names(self) -> set[str]:
        return {name for name, _ in self._samples}

    def __len__(self) -> int:
        return sum(len(points) for points in self._samples.values())

    def transform(self, change: Callable[[SeriesKey, float, float], float | None]) -> None:
        """Replace each sample's value with change(key, t, value); None removes the sample."""
        for key in list(self._samples):
            points = [
                (t, v) for t, v in ((t, change(key, t, v)) for t, v in self._samples[key]) if v is not None
            ]
            if points:
                self._samples[key] = points
            else:
                del self._samples[key]

    def merge(self, other: SeriesSet) -> None:
        """Add every series of `other` (their keys must not collide with ours)."""
        for key, points in other._samples.items():
            if key in self._samples:
                raise ValueError(f"series {key[0]}{labels_text(key[1])} is in both sets")
            self._samples[key] = list(points)

    def lines(self) -> Iterator[str]:
        """OpenMetrics sample lines, sorted by series then time, without the `# EOF`."""
        for key in self.keys():
            prefix = key[0] + labels_text(key[1]) + " "
            for t, value in self._samples[key]:
                yield f"{prefix}{_number(value)} {t:.3f}"

    def to_openmetrics(self) -> str:
        """The whole OpenMetrics document, ending in `# EOF` and a newline."""
        return "".join(line + "\n" for line in self.lines()) + "# EOF\n"
