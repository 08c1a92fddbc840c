"""Dual-caliber concurrency of a set of live requests: in flight, active tokens, and its integral.

One type for the two places that keep it: the sidecar's tracker (the admission snapshot every
row carries) and the probe, which is its own client (each probe row's inflight_at_admit, and the
mean in-flight over a measuring window for the Little's-law check). Single-threaded, like the
event loop both run on.

    load = Inflight(); load.admit(100) -> (1, 100); load.generated(5); load.admit(50) -> (2, 155)
    load.release(105) -> 1 request and 50 tokens left, load.finished == 1
"""

from __future__ import annotations

import time

__all__ = ["Inflight"]


class Inflight:
    """Requests in flight and their tokens (prompt + generated so far), with ∫ in-flight dt."""

    __slots__ = ("requests", "tokens", "finished", "_area", "_last")

    def __init__(self) -> None:
        self.requests = 0
        self.tokens = 0
        self.finished = 0  # requests released so far (the engine's signal integrity reads it)
        self._area = 0.0
        self._last = time.monotonic()

    def _tick(self) -> None:
        now = time.monotonic()
        self._area += self.requests * (now - self._last)
        self._last = now

    def admit(self, prompt_tokens: int) -> tuple[int, int]:
        """Count a new request; returns (requests, tokens) in flight, the new one included."""
        self._tick()
        self.requests += 1
        self.tokens += prompt_tokens
        return self.requests, self.tokens

    def generated(self, tokens: int) -> None:
        """An in-flight request produced `tokens` more."""
        self.tokens += tokens

    def release(self, tokens: int) -> None:
        """A request ended: remove it and every token it added (prompt + generated)."""
        self._tick()
        self.requests -= 1
        self.tokens -= tokens
        self.finished += 1

    def area(self) -> float:
        """Integral of requests in flight over time so far, in request-seconds."""
        self._tick()
        return self._area
