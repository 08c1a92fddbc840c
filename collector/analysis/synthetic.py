"""Synthetic request logs from a closed-loop queue with a known knee: ground truth for tests,
docs and demos, with no server and no clock.

A server with `slots` identical slots serves requests first come, first served in `service_s`
seconds each (a small seeded jitter keeps percentiles honest). Clients run a closed loop and
their number steps through `levels`, `seconds_per_level` each. Up to `slots` clients nothing
waits, so throughput doubles with each level; past it requests queue, TTFT grows by the wait and
throughput stays flat: the knee is `slots`. Rows follow collector.store.schema, with
inflight_at_admit and active_tokens_at_admit computed by a sweep over admissions.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["closed_loop_rows"]

_EPOCH = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _serve(slots: int, levels: Sequence[int], seconds_per_level: float, service_s: float,
           rng: random.Random) -> list[tuple[float, float, float, int]]:
    """(admitted, started, completed, level) per request, FCFS over `slots` servers."""
    free = [0.0] * slots
    arrivals: list[tuple[float, int]] = []
    requests, client = [], 0
    for index, level in enumerate(levels):
        stage_start, stage_end = index * seconds_per_level, (index + 1) * seconds_per_level
        while client < level:
            heapq.heappush(arrivals, (stage_start, client))
            client += 1
        while arrivals and arrivals[0][0] < stage_end:
            admitted, who = heapq.heappop(arrivals)
            started = max(admitted, heapq.heappop(free))
            completed = started + service_s * rng.uniform(0.95, 1.05)
            heapq.heappush(free, completed)
            requests.append((admitted, started, completed, level))
            heapq.heappush(arrivals, (completed, who))
    return requests


def _concurrency_at_admit(requests, prompt: int, completion: int, ttft_s: float
                          ) -> list[tuple[int, int]]:
    """(in-flight incl. itself, active tokens) at each admission, by a sweep in time order."""
    order = sorted(range(len(requests)), key=lambda i: requests[i][0])
    ends: list[tuple[float, int]] = []
    result: dict[int, tuple[int, int]] = {}
    for i in order:
        admitted = requests[i][0]
        while ends and ends[0][0] <= admitted:
            heapq.heappop(ends)
        tokens = prompt
        for _, j in ends:
            first = requests[j][1] + ttft_s
            done = max(0.0, min(1.0, (admitted - first) / max(requests[j][2] - first, 1e-9)))
            tokens += prompt + int(completion * done)
        heapq.heappush(ends, (requests[i][2], i))
        result[i] = (len(ends), tokens)
    return [result[i] for i in range(len(requests))]


def closed_loop_rows(*, slots: int = 8, levels: Sequence[int] = (1, 2, 4, 8, 16, 32),
                     seconds_per_level: float = 20.0, service_s: float = 1.0, ttft_s: float = 0.05,
                     prompt_tokens: int = 100, completion_tokens: int = 50, seed: int = 0,
                     source: str = "traffic", model: str = "synthetic", run_id: str | None = None,
                     start: datetime = _EPOCH) -> list[dict[str, Any]]:
    """Rows of a closed-loop run whose knee is `slots`; probe rows when `run_id` is given.

    Example: closed_loop_rows(slots=8) -> ~1 900 rows; levels 1..8 never wait, 16 and 32 queue.
    """
    requests = _serve(slots, levels, seconds_per_level, service_s, random.Random(seed))
    seen = _concurrency_at_admit(requests, prompt_tokens, completion_tokens, ttft_s)
    rows, per_level = [], {}
    for n, ((admitted, started, completed, level), (inflight, active)) in enumerate(zip(requests, seen)):
        per_level[level] = per_level.get(level, 0) + 1
        warm = "-w" if per_level[level] <= level else ""
        request_id = f"{run_id}-c{level:04d}-{n:06d}{warm}" if run_id else f"syn-{seed}-{n:06d}"
        ttft = started - admitted + ttft_s
        e2e = completed - admitted
        rows.append({
            "request_id": request_id, "source": source, "run_id": run_id, "instance": "synthetic",
            "model": model, "tenant": "synthetic", "endpoint": "/v1/chat/completions",
            "stream": True, "admitted_at": start + timedelta(seconds=admitted),
            "first_byte_at": start + timedelta(seconds=admitted + ttft),
            "first_token_at": start + timedelta(seconds=admitted + ttft),
            "completed_at": start + timedelta(seconds=completed), "status_code": 200,
            "outcome": "ok", "error": None, "prompt_tokens": prompt_tokens,
            "cached_prompt_tokens": None, "completion_tokens": completion_tokens,
            "max_tokens": completion_tokens, "usage_source": "upstream", "ttft_s": ttft,
            "tpot_s": (e2e - ttft) / (completion_tokens - 1) if completion_tokens > 1 else None,
            "e2e_s": e2e, "inflight_at_admit": inflight, "active_tokens_at_admit": active,
            "engine_waiting_at_admit": max(0, inflight - slots), "kv_usage_at_admit": None,
        })
    return rows
