"""`headroom run` with the in-flight age pass taken out: the control arm of style_pairs.py --versus-no-age.

The production sidecar computes headroom_inflight_oldest_age_seconds and
headroom_inflight_older_than_requests in the same pass over the live set as the in-flight gauges
(collector.sidecar.exported.TrackerMetrics._live). `NoAgeMetrics` sums only the four in-flight
gauges and exports only them; run as a script, the tracker builds it instead and the CLI runs
unchanged:

    python benchmarks/_no_age_headroom.py run --upstream ... --listen ...

`scrape_us(live)` times the tracker's part of /metrics both ways in this process.
"""

from __future__ import annotations

import runpy
import sys
import time

from prometheus_client import CollectorRegistry

from collector.sidecar import tracker as tracker_module
from collector.sidecar.exported import TrackerMetrics
from collector.sidecar.live import LiveRequest
from collector.sidecar.tracker import Tracker


class NoAgeMetrics(TrackerMetrics):
    """TrackerMetrics without the two age gauges and without keeping admitted times in the pass."""

    def __init__(self, tracker: Tracker) -> None:
        super().__init__(tracker)
        self._gauges = self._gauges[:4]  # the in-flight gauges; the two age gauges dropped
        self._prefixes = self._prefixes[:4]

    def _live(self) -> tuple[dict[tuple[str, ...], float], ...]:
        tracker = self._tracker
        pairs = tracker._label_sets or {("", "")}
        tasks = tracker._task_label_sets or {("", "")}
        inflight: dict[tuple[str, ...], float] = dict.fromkeys(pairs, 0)
        tokens: dict[tuple[str, ...], float] = dict.fromkeys(pairs, 0)
        task_inflight: dict[tuple[str, ...], float] = dict.fromkeys(tasks, 0)
        task_tokens: dict[tuple[str, ...], float] = dict.fromkeys(tasks, 0)
        for request in list(tracker.live.values()):
            key = (request.model_label, request.tenant_label)
            task = (request.model_label, request.task_class_label)
            weight = request.active_tokens
            inflight[key] = inflight.get(key, 0) + 1
            tokens[key] = tokens.get(key, 0) + weight
            task_inflight[task] = task_inflight.get(task, 0) + 1
            task_tokens[task] = task_tokens.get(task, 0) + weight
        return inflight, tokens, task_inflight, task_tokens


def scrape_us(live: int, rounds: int = 7, calls: int = 300) -> dict[str, float]:
    """Microseconds per tracker text() with `live` requests in flight, with and without the age
    pass: the best of `rounds` alternating batches of `calls` calls each."""
    tracker = Tracker(CollectorRegistry(), instance="bench")
    for _ in range(live):
        tracker.admit(LiveRequest("bench", "anonymous", "/v1/chat/completions", True, 100, 60))
    arms = {"with_age": tracker.exported, "without_age": NoAgeMetrics(tracker)}
    best = dict.fromkeys(arms, float("inf"))
    for _ in range(rounds):
        for name, metrics in arms.items():
            began = time.perf_counter()
            for _ in range(calls):
                metrics.text()
            best[name] = min(best[name], (time.perf_counter() - began) / calls * 1e6)
    return {name: round(value, 1) for name, value in best.items()}


if __name__ == "__main__":
    tracker_module.TrackerMetrics = NoAgeMetrics  # type: ignore[misc]
    sys.argv = ["headroom", *sys.argv[1:]]
    runpy.run_module("collector.cli", run_name="__main__")
