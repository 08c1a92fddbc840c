"""The simulator in simulated time: request-log rows without a clock, a socket or a sidecar.

The pure Scheduler (scheduler.py) is stepped as fast as the CPU allows while a simulated clock
advances by each step's cost-model time, so hours of traffic take seconds. Each request becomes
the row the sidecar would have logged: admission, first token and completion stamps, token
counts, and the concurrency it saw at admission in both calibers plus the engine's queue (the
sidecar's `engine_waiting_at_admit`). Two drivers:

    poisson_rows(config, rate_at, duration_s, mix)   open-loop traffic (Poisson arrivals whose
                                                     rate may change over time), source 'traffic'
    closed_loop_rows(config, levels, level_s, mix)   the probe's gradient: `level` clients, each
                                                     sending its next request when one ends

A `Mix` says what requests look like: prompt and output lengths (a share of long prompts) and
tenants, seeded. Capacity math that needs ground truth (collector.sim.cost.predicted_knee) applies
unchanged, so tests can hold the passive curve and the probe to the simulator's own model.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from collector.sim.config import SimConfig
from collector.sim.scheduler import QueueFull, Scheduler, SimRequest
from collector.tasks import classify

__all__ = ["Mix", "poisson_rows", "closed_loop_rows", "START"]

START = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Mix:
    """What requests look like: lengths in tokens, a share of long prompts, tenants, and the LoRA
    adapters they name (each request one of `adapters`, uniformly; none: the base model)."""

    prompt_tokens: int = 40
    long_prompt_tokens: int = 1000
    long_share: float = 0.0
    output_tokens: int = 64
    tenants: int = 3
    model: str = "headroom-sim"
    adapters: tuple[str, ...] = ()

    def draw(self, rng: random.Random) -> tuple[int, int, str]:
        """(prompt tokens, output tokens, tenant) of one request."""
        long = rng.random() < self.long_share
        prompt = self.long_prompt_tokens if long else self.prompt_tokens
        return prompt, self.output_tokens, f"tenant-{rng.randrange(self.tenants)}"

    def adapter(self, rng: random.Random) -> str | None:
        """The adapter one request names (drawn only when there are adapters: seeds stay stable)."""
        return rng.choice(self.adapters) if self.adapters else None


@dataclass
class _Live:
    request: SimRequest
    row: dict[str, Any]
    admitted_s: float
    first_s: float | None = None
    client: int | None = None  # the closed-loop client that sent it


class _Run:
    """One simulated engine with the sidecar's bookkeeping around it."""

    def __init__(self, config: SimConfig, mix: Mix, seed: int, source: str, run_id: str | None) -> None:
        self.scheduler = Scheduler(config)
        self.mix, self.rng, self.source, self.run_id = mix, random.Random(seed), source, run_id
        self.now = 0.0
        self.live: dict[SimRequest, _Live] = {}
        self.rows: list[dict[str, Any]] = []
        self.ids = itertools.count()
        self.level: int | None = None

    def admit(self, client: int | None = None) -> None:
        """A request arrives now: snapshot both calibers and the queue, hand it to the engine."""
        prompt, output, tenant = self.mix.draw(self.rng)
        adapter = self.mix.adapter(self.rng)
        n = next(self.ids)
        request = SimRequest(f"r{n}", prompt, output, adapter=adapter)
        active = sum(live.request.num_tokens for live in self.live.values()) + prompt
        probing = bool(self.run_id and self.level)
        request_id = f"{self.run_id}-{n:06d}" if probing else f"sim-{n:07d}"
        row = {
            "request_id": request_id,
            "source": self.source,
            "run_id": self.run_id,
            "instance": "offline",
            "model": self.mix.model,
            "tenant": tenant,
            "endpoint": "/v1/chat/completions",
            "stream": True,
            "prompt_tokens": prompt,
            "completion_tokens": 0,
            "max_tokens": output,
            "usage_source": "upstream",
            "inflight_at_admit": len(self.live) + 1,
            "active_tokens_at_admit": active,
            "engine_waiting_at_admit": len(self.scheduler.waiting),
            "upstream_retries": 0,
            "task_class": classify(output),
            "adapter": adapter,
            "probe_level": self.level if probing else None,
            "probe_warmup": False if probing else None,
        }
        live = _Live(request, row, self.now, client=client)
        try:
            self.scheduler.add(request)
        except QueueFull:
            self._finish(live, outcome="rate_limited", status=429)
            return
        self.live[request] = live

    def step(self) -> list[_Live]:
        """One engine step; returns the requests it finished."""
        plan = self.scheduler.plan_step()
        self.now += plan.duration_s
        for request in plan.sampled:
            live = self.live[request]
            if live.first_s is None:
                live.first_s = self.now
        done = [self.live.pop(request) for request in plan.finished]
        for live in done:
            self._finish(live)
        return done

    def _finish(self, live: _Live, outcome: str = "ok", status: int = 200) -> None:
        row, admitted = live.row, live.admitted_s
        e2e = self.now - admitted
        ttft = None if live.first_s is None else live.first_s - admitted
        completion = live.request.generated
        row.update(
            admitted_at=START + timedelta(seconds=admitted),
            first_byte_at=START + timedelta(seconds=live.first_s if live.first_s else self.now),
            first_token_at=None if live.first_s is None else START + timedelta(seconds=live.first_s),
            completed_at=START + timedelta(seconds=self.now),
            status_code=status,
            outcome=outcome,
            error=None if outcome == "ok" else f"HTTP {status}",
            completion_tokens=completion,
            ttft_s=ttft,
            e2e_s=e2e,
            tpot_s=(e2e - ttft) / (completion - 1) if ttft is not None and completion > 1 else None,
        )
        self.rows.append(row)


def poisson_rows(
    config: SimConfig,
    rate_at: Callable[[float], float],
    duration_s: float,
    mix: Mix = Mix(),
    *,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Traffic rows of Poisson arrivals at `rate_at(t)` requests/s over [0, duration_s).

    Arrivals follow a non-homogeneous Poisson process (thinning against the peak rate, sampled
    every second); the engine drains what is left after the last arrival.
    Example: poisson_rows(SimConfig(max_num_seqs=8), lambda t: 2 + t / 60, 600) ramps 2 -> 12 req/s.
    """
    run = _Run(config, mix, seed, "traffic", None)
    peak = max(rate_at(t) for t in range(int(duration_s) + 1)) or 1.0
    arrivals = _arrivals(run.rng, rate_at, peak, duration_s)
    index = 0
    while index < len(arrivals) or run.live:
        if run.scheduler.has_work and (index >= len(arrivals) or run.now < arrivals[index]):
            run.step()
            continue
        run.now = max(run.now, arrivals[index])
        run.admit()
        index += 1
    return run.rows


def _arrivals(
    rng: random.Random, rate_at: Callable[[float], float], peak: float, duration_s: float
) -> list[float]:
    times: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration_s:
            return times
        if rng.random() < rate_at(t) / peak:
            times.append(t)


def closed_loop_rows(
    config: SimConfig,
    levels: Sequence[int],
    level_s: float,
    mix: Mix = Mix(),
    *,
    seed: int = 0,
    run_id: str = "probe-offline",
) -> list[dict[str, Any]]:
    """The probe's gradient in simulated time: probe rows (source 'probe', their `probe_level`, the
    first `level` completions of each level marked `probe_warmup`).

    As the probe does, each level's clients start staggered over one request duration (the
    previous level's median e2e), each sends its next request as soon as one ends, and a level
    drains before the next begins.
    """
    run = _Run(config, mix, seed, "probe", run_id)
    stagger = 0.0
    for level in levels:
        run.level, first_row = level, len(run.rows)
        starts = [run.now + i * stagger / level for i in range(level)]
        end, warm, client = run.now + stagger + level_s, level, 0
        while starts or run.live:
            if starts and (not run.scheduler.has_work or starts[0] <= run.now):
                run.now = max(run.now, starts.pop(0))
                run.admit(client)
                client += 1
                continue
            for live in run.step():
                if warm > 0:
                    live.row["probe_warmup"] = True
                    warm -= 1
                if run.now < end:
                    run.admit(live.client)
        e2e = sorted(row["e2e_s"] for row in run.rows[first_row:])
        stagger = e2e[len(e2e) // 2] if e2e else 0.0
    return run.rows
