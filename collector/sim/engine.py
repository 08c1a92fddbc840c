"""The engine loop: runs the pure Scheduler in simulated time scaled by --speed.

Each iteration plans one step, sleeps until that step's simulated end (deadline-based, so rounding
in asyncio's timers does not accumulate), then hands the sampled tokens to each request's Stream.
Simulated time is tied to the wall clock like a GPU that keeps computing while the API process is
descheduled: a loop that falls behind (a busy CPU) runs its late steps back to back to catch up,
for up to MAX_DEBT_S of real time; beyond that it re-anchors, so a long pause is not replayed.

It also stamps each request's instants on the simulated clock (arrival, first scheduled step,
first token, last token; SimRequest.arrived_s ...), from which collector.sim.timings builds the
engine's own per-request timings once the request has finished.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TypedDict

from collector.sim.config import SimConfig
from collector.sim.cost import CostModel
from collector.sim.scheduler import Scheduler, SimRequest, StepPlan

__all__ = ["Engine", "EngineState", "Stream"]

MAX_DEBT_S = 1.0


class EngineState(TypedDict):
    """Engine.state(): the ground truth the simulated /metrics and /sim/state report."""

    running: int
    waiting: int
    kv_used_blocks: int
    kv_total_blocks: int
    kv_used_tokens: int
    kv_capacity_tokens: int
    kv_usage_ratio: float
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    sim_time_s: float
    steps: int
    max_num_seqs: int
    speed: float
    max_loras: int  # the adapter slots; the lora_* fields are empty without --lora-adapters
    lora_adapters: list[str]
    running_adapters: list[str]  # distinct adapters of the running batch, sorted
    waiting_adapters: list[str]  # distinct adapters of the waiting queue, sorted
    loaded_adapters: list[str]  # adapters in a GPU slot, least recently used first
    adapter_loads_total: int


@dataclass(eq=False)
class Stream:
    """A request's delivery side: tokens sampled so far become visible once their step ends."""

    request: SimRequest
    delivered: int = 0
    finished: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class Engine:
    """Owns the Scheduler and the asyncio task that steps it; start()/stop() in the app lifespan."""

    def __init__(self, config: SimConfig, cost: CostModel | None = None) -> None:
        self.config = config
        self.scheduler = Scheduler(config, cost)
        self.sim_time_s = 0.0
        self.steps = 0
        self._streams: dict[SimRequest, Stream] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._step_start_s = 0.0  # simulated start of the step in flight (or the last one)
        self._step_deadline = 0.0  # the loop time at which that step ends

    async def start(self) -> None:
        """Start the step loop on the running event loop."""
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        """Cancel the step loop and wake every open stream so handlers can finish."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for stream in self._streams.values():
            stream.finished = True
            stream.changed.set()

    def submit(self, request: SimRequest) -> Stream:
        """Queue a request (raises scheduler.QueueFull) and return its Stream."""
        request.arrived_s = self.now_s()
        self.scheduler.add(request)
        stream = Stream(request)
        self._streams[request] = stream
        if self._wake is not None:
            self._wake.set()
        return stream

    def now_s(self) -> float:
        """The simulated clock now: inside a step still running on the wall clock, the part of it
        that has passed (a request that arrives mid-step waits for the rest of it)."""
        if self._loop is None:
            return self.sim_time_s
        ahead_s = (self._step_deadline - self._loop.time()) * self.config.speed
        return max(self._step_start_s, self.sim_time_s - max(0.0, ahead_s))

    def abort(self, stream: Stream) -> None:
        """Forget a request whose client went away; frees its KV blocks at once."""
        if self._streams.pop(stream.request, None) is not None:
            self.scheduler.abort(stream.request)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self.scheduler.has_work:
                await self._idle()
                deadline = loop.time()
                continue
            plan = self.scheduler.plan_step()
            if plan.scheduled_tokens == 0:  # nothing fits now; wait for an arrival or abort
                await self._idle()
                deadline = loop.time()
                continue
            self._begin_step(plan)
            deadline += plan.duration_s / self.config.speed
            self._step_deadline = deadline
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -MAX_DEBT_S:
                deadline = loop.time()
            self._deliver(plan.sampled, plan.finished)

    def _begin_step(self, plan: StepPlan) -> None:
        """Advance the simulated clock over the step and stamp the requests it admitted first."""
        self.steps += 1
        self._step_start_s = self.sim_time_s
        self.sim_time_s += plan.duration_s
        for request in plan.admitted:
            if request.scheduled_s is None:  # a preempted request keeps its first scheduling
                request.scheduled_s = self._step_start_s

    async def _idle(self) -> None:
        assert self._wake is not None
        self._wake.clear()
        await self._wake.wait()

    def _deliver(self, sampled: list[SimRequest], finished: list[SimRequest]) -> None:
        for request in sampled:
            if request.first_token_s is None:
                request.first_token_s = self.sim_time_s
            stream = self._streams.get(request)
            if stream is not None:
                stream.delivered = request.generated
                stream.changed.set()
        for request in finished:
            request.finished_s = self.sim_time_s
            stream = self._streams.pop(request, None)
            if stream is not None:
                stream.finished = True
                stream.changed.set()

    def state(self) -> EngineState:
        """Ground truth for tests: running, waiting, KV use, token totals, simulated clock."""
        sched, cfg = self.scheduler, self.config
        return {
            "running": len(sched.running),
            "waiting": len(sched.waiting),
            "kv_used_blocks": sched.kv_used_blocks,
            "kv_total_blocks": cfg.num_blocks,
            "kv_used_tokens": sum(r.computed for r in sched.running),
            "kv_capacity_tokens": cfg.num_blocks * cfg.block_size,
            "kv_usage_ratio": sched.kv_used_blocks / cfg.num_blocks,
            "prompt_tokens_total": sched.prompt_tokens_total,
            "generation_tokens_total": sched.generation_tokens_total,
            "preemptions_total": sched.preemptions_total,
            "sim_time_s": self.sim_time_s,
            "steps": self.steps,
            "max_num_seqs": cfg.max_num_seqs,
            "speed": cfg.speed,
            "max_loras": cfg.max_loras,
            "lora_adapters": list(cfg.lora_adapters),
            "running_adapters": sorted(sched.running_adapters()),
            "waiting_adapters": sorted({r.adapter for r in sched.waiting if r.adapter is not None}),
            "loaded_adapters": list(sched.loaded_adapters),
            "adapter_loads_total": sched.adapter_loads_total,
        }
