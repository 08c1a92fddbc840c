"""The demo's mixed workload and its live view of both calibers.

`mixed_payload(seed)` yields chat bodies: mostly short questions, every `long_every`-th a long
document (docs/domain.md §3: mixed loads expose token-caliber shortfalls that single-length tests
hide). `CaliberSampler` polls the sidecar's /metrics and keeps a time course of in-flight requests
(request caliber), active tokens (token caliber) and the engine's queue and KV usage.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from collector.catalog import spec
from collector.sim.load import Payload

__all__ = ["mixed_payload", "CaliberSample", "CaliberSampler", "SAMPLED"]

_TOPICS = ("capacity", "latency", "queues", "tokens", "batching", "memory", "scaling", "alerts")
SAMPLED = {
    "inflight": spec("headroom_inflight_requests").name,
    "active_tokens": spec("headroom_active_tokens").name,
    "engine_running": spec("headroom_engine_requests_running").name,
    "engine_waiting": spec("headroom_engine_requests_waiting").name,
    "kv_usage": spec("headroom_engine_kv_cache_usage_ratio").name,
}


def mixed_payload(seed: int, long_every: int = 10, long_words: int = 300, max_tokens: int = 64) -> Payload:
    """A payload(worker, index) for collector.sim.load.run_level: short and long prompts, seeded.

    Output length is locked (max_tokens + ignore_eos, docs/domain.md §7) so levels compare like for like.
    Example: a short body asks one question (~20 tokens); a long one carries ~600 tokens.
    """

    def make(worker: int, index: int) -> dict[str, Any]:
        rng = random.Random(seed * 1_000_003 + worker * 10_007 + index)
        topic = rng.choice(_TOPICS)
        content = f"[{worker}-{index}] Explain {topic} of an inference server in a few sentences."
        if rng.randrange(long_every) == 0:
            document = " ".join(rng.choice(_TOPICS) for _ in range(long_words))
            content = f"[{worker}-{index}] Summarise this report on {topic}:\n{document}"
        return {
            "model": "headroom-sim",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": content}],
        }

    return make


@dataclass(frozen=True)
class CaliberSample:
    """One scrape of the sidecar: seconds since the run started and the summed values."""

    t_s: float
    level: int
    values: dict[str, float]


def parse_calibers(text: str) -> dict[str, float]:
    """Sum each sampled metric over its label sets. Example: two tenants 3 + 2 in flight -> 5."""
    wanted = {name: key for key, name in SAMPLED.items()}
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


@dataclass
class CaliberSampler:
    """Polls `metrics_url` every interval_s until stop(); `level` tags samples with the current level."""

    metrics_url: str
    interval_s: float = 0.25
    level: int = 0
    samples: list[CaliberSample] = field(default_factory=list)
    _stop: asyncio.Event | None = None

    async def run(self) -> None:
        """Sample until stop() is called; scrape errors are skipped, not fatal."""
        self._stop = asyncio.Event()
        start = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self._stop.is_set():
                try:
                    async with session.get(self.metrics_url) as response:
                        values = parse_calibers(await response.text())
                    self.samples.append(CaliberSample(time.monotonic() - start, self.level, values))
                except (TimeoutError, aiohttp.ClientError, ValueError):
                    pass
                try:
                    await asyncio.wait_for(self._stop.wait(), self.interval_s)
                except TimeoutError:
                    pass

    def stop(self) -> None:
        """Ask run() to return after the current scrape."""
        if self._stop is not None:
            self._stop.set()

    def latest(self) -> dict[str, float]:
        """The most recent values (empty before the first scrape)."""
        return self.samples[-1].values if self.samples else {}
