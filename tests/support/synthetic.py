"""Deterministic synthetic request-log rows: ground truth for tests, the docs' examples and trials.

Every row is a collector.record.RequestRecord (as its {column: value} row), so a field the record
does not have cannot appear here. Three generators:

- `synthetic_rows`: plausible traffic; TTFT grows with the in-flight count, a few requests are
  rate-limited or fail, tenants are skewed.
- `synthetic_probe_run`: a closed-loop probe whose throughput stops rising at a known knee.
- `closed_loop_rows`: a queue with a known knee and no server and no clock. `slots` identical
  slots serve first come, first served in `service_s` seconds each (a small seeded jitter keeps
  percentiles honest); clients run a closed loop and their number steps through `levels`. Up to
  `slots` clients nothing waits, so throughput doubles with each level; past it requests queue,
  TTFT grows by the wait and throughput stays flat: the knee is `slots`.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from collector.record import RequestRecord, time_per_output_token

__all__ = ["synthetic_rows", "synthetic_probe_run", "closed_loop_rows"]

_EPOCH = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
_OUTCOMES = (
    ("ok", 200),
    ("ok", 200),
    ("ok", 200),
    ("ok", 200),
    ("ok", 200),
    ("ok", 200),
    ("ok", 200),
    ("ok", 200),
    ("rate_limited", 429),
    ("upstream_error", 502),
)


def _row(
    rng: random.Random, index: int, admitted: datetime, model: str, prefix: str, ttft_scale: float
) -> dict[str, Any]:
    inflight = rng.choice((1, 2, 3, 4, 6, 8, 12, 16))
    prompt, completion = rng.randint(20, 2000), rng.randint(2, 400)
    ttft = ttft_scale * (0.05 + 0.02 * inflight) * (0.5 + rng.random())
    tpot = 0.01 + 0.002 * inflight * rng.random()
    e2e = ttft + tpot * (completion - 1)
    outcome, status = _OUTCOMES[rng.randrange(len(_OUTCOMES))]
    ok = outcome == "ok"
    return RequestRecord(
        request_id=f"{prefix}-{index:08d}",
        source="traffic",
        run_id=None,
        instance=f"sidecar-{index % 3}",
        model=model,
        tenant=rng.choice(("team-a", "team-a", "team-a", "team-b", "team-b", "team-c")),
        endpoint="/v1/chat/completions",
        stream=True,
        admitted_at=admitted,
        first_byte_at=admitted + timedelta(seconds=ttft * 0.9),
        first_token_at=admitted + timedelta(seconds=ttft) if ok else None,
        completed_at=admitted + timedelta(seconds=e2e if ok else ttft),
        status_code=status,
        outcome=outcome,
        error=None if ok else outcome,
        prompt_tokens=prompt,
        cached_prompt_tokens=prompt // 4,
        completion_tokens=completion if ok else 0,
        max_tokens=512,
        usage_source="upstream",
        ttft_s=ttft if ok else None,
        tpot_s=tpot if ok else None,
        e2e_s=e2e if ok else ttft,
        inflight_at_admit=inflight,
        active_tokens_at_admit=inflight * (prompt + completion // 2),
        engine_waiting_at_admit=max(0, inflight - 8),
        kv_usage_at_admit=min(1.0, inflight / 16),
    ).as_row()


def synthetic_rows(
    n: int,
    start: datetime,
    *,
    span: timedelta = timedelta(hours=1),
    models: tuple[str, ...] = ("model-a",),
    seed: int = 7,
    prefix: str = "req",
    ttft_scale: float = 1.0,
) -> list[dict[str, Any]]:
    """`n` rows admitted evenly over [start, start + span), models in turn; same seed, same rows.

    Example: synthetic_rows(2, t0, models=("a", "b")) -> rows req-00000000 (model a) and req-00000001 (b).
    """
    rng = random.Random(seed)
    step = span / max(n, 1)
    return [_row(rng, i, start + step * i, models[i % len(models)], prefix, ttft_scale) for i in range(n)]


def synthetic_probe_run(
    start: datetime,
    *,
    model: str = "model-a",
    run_id: str = "run-1",
    knee: int = 8,
    levels: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    rounds: int = 8,
) -> list[dict[str, Any]]:
    """A closed-loop probe whose throughput stops rising at concurrency `knee` (source='probe').

    Each level runs `rounds` rounds of c requests of 200 + 100 tokens; a request takes 1 s up to
    the knee and c/knee s above it, so tokens/s plateaus there and TTFT stretches.
    """
    rows, level_start = [], start
    for c in levels:
        duration = 1.0 if c <= knee else c / knee
        ttft = 0.1 * max(1.0, c / knee)
        for r in range(rounds):
            for i in range(c):
                admitted = level_start + timedelta(seconds=r * duration + i * 1e-3)
                rows.append(
                    RequestRecord(
                        request_id=f"probe-{run_id}-{c}-{r * c + i}",
                        probe_level=c,
                        probe_warmup=False,
                        source="probe",
                        run_id=run_id,
                        model=model,
                        tenant="probe",
                        admitted_at=admitted,
                        first_token_at=admitted + timedelta(seconds=ttft),
                        completed_at=admitted + timedelta(seconds=duration),
                        status_code=200,
                        outcome="ok",
                        prompt_tokens=200,
                        completion_tokens=100,
                        ttft_s=ttft,
                        tpot_s=time_per_output_token(duration, ttft, 100),
                        e2e_s=duration,
                        inflight_at_admit=c,
                        active_tokens_at_admit=c * 250,
                    ).as_row()
                )
        level_start += timedelta(seconds=rounds * duration + 1)
    return rows


def _serve(
    slots: int, levels: Sequence[int], seconds_per_level: float, service_s: float, rng: random.Random
) -> list[tuple[float, float, float, int]]:
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


def _concurrency_at_admit(
    requests: list[tuple[float, float, float, int]], prompt: int, completion: int, ttft_s: float
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


def closed_loop_rows(
    *,
    slots: int = 8,
    levels: Sequence[int] = (1, 2, 4, 8, 16, 32),
    seconds_per_level: float = 20.0,
    service_s: float = 1.0,
    ttft_s: float = 0.05,
    prompt_tokens: int = 100,
    completion_tokens: int = 50,
    seed: int = 0,
    source: str = "traffic",
    model: str = "synthetic",
    run_id: str | None = None,
    start: datetime = _EPOCH,
) -> list[dict[str, Any]]:
    """Rows of a closed-loop run whose knee is `slots`; probe rows when `run_id` is given.

    Example: closed_loop_rows(slots=8) -> ~1 900 rows; levels 1..8 never wait, 16 and 32 queue.
    """
    requests = _serve(slots, levels, seconds_per_level, service_s, random.Random(seed))
    seen = _concurrency_at_admit(requests, prompt_tokens, completion_tokens, ttft_s)
    rows, per_level = [], dict[int, int]()
    for n, ((admitted, started, completed, level), (inflight, active)) in enumerate(zip(requests, seen)):
        per_level[level] = per_level.get(level, 0) + 1
        request_id = f"{run_id}-{n:06d}" if run_id else f"syn-{seed}-{n:06d}"
        ttft = started - admitted + ttft_s
        e2e = completed - admitted
        rows.append(
            RequestRecord(
                request_id=request_id,
                source=source,
                run_id=run_id,
                instance="synthetic",
                model=model,
                tenant="synthetic",
                endpoint="/v1/chat/completions",
                stream=True,
                admitted_at=start + timedelta(seconds=admitted),
                first_byte_at=start + timedelta(seconds=admitted + ttft),
                first_token_at=start + timedelta(seconds=admitted + ttft),
                completed_at=start + timedelta(seconds=completed),
                status_code=200,
                outcome="ok",
                error=None,
                prompt_tokens=prompt_tokens,
                cached_prompt_tokens=None,
                completion_tokens=completion_tokens,
                max_tokens=completion_tokens,
                usage_source="upstream",
                ttft_s=ttft,
                tpot_s=time_per_output_token(e2e, ttft, completion_tokens),
                e2e_s=e2e,
                inflight_at_admit=inflight,
                active_tokens_at_admit=active,
                engine_waiting_at_admit=max(0, inflight - slots),
                kv_usage_at_admit=None,
                probe_level=level if run_id else None,
                probe_warmup=per_level[level] <= level if run_id else None,
            ).as_row()
        )
    return rows
