"""Signal integrity: can each engine signal the capacity rules divide by be trusted right now?

After every poll, `SignalIntegrity.observe(snapshot)` judges each signal (running, waiting,
kv_usage, kv_capacity) and keeps one reason per signal, exported as
headroom_signal_valid{source="engine", signal, reason} (1 for ok, idle, renamed; 0 otherwise):

    scrape_failing  the poll failed (no answer, non-200, not metrics): nothing is known. Told apart
                    from an idle engine, which answers with its zeros.
    missing         the engine answers but not with this signal, under any known name, though its
                    engine always exports it (EXPECTED) or it did earlier in this run: a rename the
                    sidecar does not know, or a feature switched off.
    stuck           negative (SGLang's -1 "unknown"), or 0 for running requests or KV usage while
                    the sidecar had requests in flight at every poll for `stuck_after_s`.
    stale           KV usage unchanged for `stale_after_s` while at least `stale_min_requests`
                    requests finished through the sidecar: a frozen exporter (finished requests
                    free KV blocks, so a live value moves). Running and waiting, judged as a
                    pair: both unchanged for `stale_after_s` while `stale_min_requests` finished
                    and the sidecar's in flight was at least `stale_margin` above their sum at
                    one poll and as far below it at another (a live engine's count follows
                    the load it is sent; either alone may hold: a full batch, an empty queue).
                    KV capacity is configuration and is never stale.
    renamed         read under an older name the sidecar knows (collector.sources.renames): valid.
    idle            valid, and nothing in flight at the sidecar: zeros here are true zeros.
    ok              valid.

Traffic comes from the sidecar (`traffic`: requests in flight, requests finished so far); without
it (the probe's own source), stale, stuck-at-0 and idle are not judged. Runs on the poller's task:
nothing here touches the proxy's path.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from collector.catalog import SIGNAL_REASONS
from collector.sources.base import EngineSnapshot
from collector.sources.renames import renamed

__all__ = ["EXPECTED", "SIGNALS", "SignalIntegrity", "Traffic"]

Traffic = Callable[[], tuple[int, int]]  # () -> (requests in flight, requests finished so far)
# signal -> the EngineSnapshot field it reads
SIGNALS = {
    "running": "running",
    "waiting": "waiting",
    "kv_usage": "kv_usage_ratio",
    "kv_capacity": "kv_capacity_tokens",
}
# Signals each engine always exports (a generic mapping: only those it has shown in this run).
EXPECTED = {
    "vllm": frozenset({"running", "waiting", "kv_usage"}),
    "sglang": frozenset({"running", "waiting", "kv_usage", "kv_capacity"}),
    "tgi": frozenset({"running", "waiting"}),
    "llamacpp": frozenset({"running", "waiting"}),
}
_ZERO_WHILE_BUSY_IS_STUCK = frozenset({"running", "kv_usage"})  # a queue of 0 is normal
_STALE_CHECKED = frozenset({"kv_usage"})  # the one that moves with every finished request
_COUNTS = ("running", "waiting")  # stale only together, against the sidecar's in flight


@dataclass
class _Track:
    value: float
    changed_at: float  # monotonic
    finished_at_change: int


@dataclass
class _Counts:
    """Running and waiting since they last changed, and the sidecar's in flight at those polls."""

    value: tuple[int, int]
    changed_at: float  # monotonic
    finished_at_change: int
    lowest: int
    highest: int


class SignalIntegrity:
    """One reason per signal, judged after each poll of one engine source."""

    def __init__(
        self,
        traffic: Traffic | None = None,
        *,
        stale_after_s: float = 60.0,
        stale_min_requests: int = 5,
        stale_margin: int = 2,
        stuck_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.traffic = traffic
        self.stale_after_s, self.stale_min_requests = stale_after_s, stale_min_requests
        self.stale_margin = stale_margin
        self.stuck_after_s = stuck_after_s
        self._clock = clock
        self._seen: set[str] = set()
        self._tracks: dict[str, _Track] = {}
        self._counts: _Counts | None = None
        self._busy_since: float | None = None
        self.reasons: dict[str, str] = {}

    def observe(self, snapshot: EngineSnapshot) -> dict[str, str]:
        """Judge every signal of `snapshot`; returns (and keeps in `reasons`) {signal: reason}."""
        now = self._clock()
        inflight, finished = self.traffic() if self.traffic is not None else (None, None)
        if inflight is None or inflight <= 0:
            self._busy_since = None
        elif self._busy_since is None:
            self._busy_since = now
        wanted = self._seen | EXPECTED.get(snapshot.engine, frozenset())
        if not snapshot.up:
            self.reasons = dict.fromkeys(sorted(wanted), "scrape_failing")
            self._counts = None
            return self.reasons
        counts_stale = self._counts_stale(snapshot, now, inflight, finished)
        read_from = dict(snapshot.read_from)
        reasons: dict[str, str] = {}
        for signal, attribute in SIGNALS.items():
            value = getattr(snapshot, attribute)
            if value is None:
                if signal in wanted:
                    reasons[signal] = "missing"
                    self._tracks.pop(signal, None)
                continue
            self._seen.add(signal)
            reasons[signal] = self._judge(
                signal, float(value), read_from.get(signal), now, inflight, finished
            )
            if counts_stale and signal in _COUNTS and SIGNAL_REASONS[reasons[signal]]:
                reasons[signal] = "stale"
        self.reasons = reasons
        return reasons

    def _counts_stale(
        self, snapshot: EngineSnapshot, now: float, inflight: int | None, finished: int | None
    ) -> bool:
        """Whether running and waiting held one pair of values for `stale_after_s` while
        `stale_min_requests` finished and the sidecar's in flight crossed their sum both ways.

        Frozen at (4, 2), in flight 9 at one poll and 3 at another: stale (a live engine holding
        six of the sidecar's requests cannot while it has 3, nor show six while it has 9). In
        flight always above the sum (queued at a limit the engine does not count) or always
        near it (a closed loop): not stale.
        """
        if snapshot.running is None or snapshot.waiting is None or inflight is None or finished is None:
            self._counts = None
            return False
        pair = (int(snapshot.running), int(snapshot.waiting))
        track = self._counts
        if track is None or track.value != pair:
            track = self._counts = _Counts(pair, now, finished, inflight, inflight)
        track.lowest, track.highest = min(track.lowest, inflight), max(track.highest, inflight)
        total = sum(pair)
        return (
            now - track.changed_at >= self.stale_after_s
            and finished - track.finished_at_change >= self.stale_min_requests
            and track.highest >= total + self.stale_margin
            and track.lowest <= total - self.stale_margin
        )

    def _judge(
        self,
        signal: str,
        value: float,
        name: str | None,
        now: float,
        inflight: int | None,
        finished: int | None,
    ) -> str:
        track = self._tracks.get(signal)
        if track is None or track.value != value:
            track = self._tracks[signal] = _Track(value, now, finished or 0)
        if value < 0:
            return "stuck"
        busy = self._busy_since is not None and now - self._busy_since >= self.stuck_after_s
        if (
            signal in _ZERO_WHILE_BUSY_IS_STUCK
            and value == 0
            and busy
            and now - track.changed_at >= self.stuck_after_s
        ):
            return "stuck"
        if (
            signal in _STALE_CHECKED
            and finished is not None
            and now - track.changed_at >= self.stale_after_s
            and finished - track.finished_at_change >= self.stale_min_requests
        ):
            return "stale"
        if name is not None and renamed(name) is not None:
            return "renamed"
        if inflight == 0:
            return "idle"
        return "ok"

    def valid(self) -> list[tuple[str, str, float]]:
        """(signal, reason, 1.0 or 0.0) per judged signal, for headroom_signal_valid."""
        return [
            (signal, reason, 1.0 if SIGNAL_REASONS[reason] else 0.0)
            for signal, reason in sorted(self.reasons.items())
        ]
