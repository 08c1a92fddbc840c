"""The continuous-batching scheduler, as a pure state machine with no clock and no I/O.

It follows vLLM V1's iteration-level scheduler: every step, running requests are served first
(one decode token each, or the next chunk of an unfinished prefill), then waiting requests are
admitted first-come-first-served while the batch has a free slot (max_num_seqs), the step has token
budget left (max_num_batched_tokens, so long prompts are chunked) and the KV cache has free blocks
for the request's whole prompt (reserved at admission, like vLLM's can_allocate check, so a chunk
never sneaks in a request whose prompt cannot fit). When a running request needs a block and none is free, the most
recently admitted running request is preempted (its blocks freed, recomputed later from the front
of the queue). `plan_step()` returns what the step computed and how long it took per the cost
model; the engine sleeps that long (scaled) and then delivers the tokens.

LoRA adapters (docs/simulator.md, "LoRA adapters"): a request may name one of the configured
adapters. Like vLLM V1, the running batch holds requests of at most `max_loras` distinct adapters:
a waiting request whose adapter would be one too many is skipped (it keeps its place; later
requests may be admitted past it). The GPU holds `max_loras` adapters (LRU); a step whose batch
needs one that is not loaded loads it first, evicting the least recently used one the step does
not need, and each load adds `lora_load_s` to the step's time.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from collector.sim.config import SimConfig
from collector.sim.cost import COST_PROFILES, CostModel, blocks_for

__all__ = ["SimRequest", "StepPlan", "Scheduler", "QueueFull"]


class QueueFull(Exception):
    """The waiting queue holds max_waiting requests: answer 429 with Retry-After."""


@dataclass(eq=False)
class SimRequest:
    """One request's token accounting inside the engine."""

    request_id: str
    prompt_tokens: int
    output_tokens: int  # target length: max_tokens, the seeded EOS or the stop sequence
    generated: int = 0  # tokens sampled so far (survive preemption: already streamed)
    computed: int = 0  # tokens whose KV is in the cache
    blocks: int = 0
    preemptions: int = 0
    prompt_counted: bool = False
    adapter: str | None = None  # the LoRA adapter it names; None for the base model
    # its instants on the engine's simulated clock (Engine.sim_time_s), set by the Engine and read
    # once it has finished (collector.sim.timings): arrival, the start of the first step that
    # scheduled it, the end of the step that sampled its first token, the end of its last step
    arrived_s: float = 0.0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None

    @property
    def num_tokens(self) -> int:
        """Prompt plus sampled tokens: what the KV cache must hold before the next sample."""
        return self.prompt_tokens + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.output_tokens


Scheduled = tuple[SimRequest, int, int]  # (request, new tokens, computed before)


@dataclass
class StepPlan:
    """What one step did: its simulated duration and the requests that sampled a token."""

    duration_s: float
    sampled: list[SimRequest] = field(default_factory=list)
    finished: list[SimRequest] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)
    admitted: list[SimRequest] = field(default_factory=list)  # moved from waiting to running
    scheduled_tokens: int = 0
    adapter_loads: int = 0  # adapters loaded into a GPU slot before this step ran


class Scheduler:
    """Waiting queue, running batch and KV blocks; call plan_step() once per engine iteration."""

    def __init__(self, config: SimConfig, cost: CostModel | None = None) -> None:
        self.config = config
        self.cost = cost or COST_PROFILES[config.cost_profile]
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.free_blocks = config.num_blocks
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.preemptions_total = 0
        self.loaded_adapters: OrderedDict[str, None] = OrderedDict()  # the GPU's slots, LRU first
        self.adapter_loads_total = 0

    # --- queue -------------------------------------------------------------------------------
    def add(self, request: SimRequest) -> None:
        """Queue a request; raises QueueFull when max_waiting requests already wait for a slot.

        Requests that free slots will take at the next step do not count as waiting, so
        max_waiting=0 means "no queue": accept only what the batch has room for.
        """
        free_slots = max(0, self.config.max_num_seqs - len(self.running))
        if len(self.waiting) - free_slots >= self.config.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests waiting (max_waiting={self.config.max_waiting})")
        self.waiting.append(request)

    def abort(self, request: SimRequest) -> None:
        """Drop a request wherever it is (client went away) and free its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._free(request)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def kv_used_blocks(self) -> int:
        return self.config.num_blocks - self.free_blocks

    # --- one iteration -----------------------------------------------------------------------
    def plan_step(self) -> StepPlan:
        """Schedule one iteration, advance token state, and return its cost-model duration."""
        plan = StepPlan(duration_s=0.0)
        budget = self.config.max_num_batched_tokens
        scheduled: list[Scheduled] = []
        budget = self._schedule_running(plan, scheduled, budget)
        if not plan.preempted:
            self._admit_waiting(plan, scheduled, budget)
        self._advance(plan, scheduled)
        return plan

    def _schedule_running(self, plan: StepPlan, scheduled: list[Scheduled], budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            tokens = min(request.num_tokens - request.computed, budget)
            if not self._grow(request, request.computed + tokens):
                victim = self.running.pop()  # lowest priority: admitted last
                self._preempt(victim, plan)
                if victim is request:
                    break
                continue
            scheduled.append((request, tokens, request.computed))
            budget -= tokens
            index += 1
        return budget

    def running_adapters(self) -> set[str]:
        """The distinct adapters of the running batch (never more than max_loras)."""
        return {request.adapter for request in self.running if request.adapter is not None}

    def _admit_waiting(self, plan: StepPlan, scheduled: list[Scheduled], budget: int) -> None:
        adapters, skipped = self.running_adapters(), list[SimRequest]()
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            adapter = request.adapter
            if adapter is not None and adapter not in adapters and len(adapters) >= self.config.max_loras:
                skipped.append(self.waiting.popleft())  # one adapter too many: vLLM skips it
                continue
            tokens = min(request.num_tokens - request.computed, budget)
            if not self._grow(request, request.num_tokens):
                break  # head-of-line waits for blocks (FCFS)
            self.waiting.popleft()
            self.running.append(request)
            plan.admitted.append(request)
            scheduled.append((request, tokens, request.computed))
            budget -= tokens
            if adapter is not None:
                adapters.add(adapter)
        self.waiting.extendleft(reversed(skipped))  # the skipped keep their places

    def _advance(self, plan: StepPlan, scheduled: list[Scheduled]) -> None:
        decode_seqs, kv_read, chunks = 0, 0, []
        for request, tokens, before in scheduled:
            request.computed = before + tokens
            kv_read += request.computed
            if tokens == 1 and before >= request.prompt_tokens:
                decode_seqs += 1
            else:
                chunks.append((tokens, before))
            plan.scheduled_tokens += tokens
            if request.computed == request.num_tokens:  # caught up: sample the next token
                self._sample(request, plan)
        plan.adapter_loads = self._load_adapters({r.adapter for r, _, _ in scheduled if r.adapter})
        plan.duration_s = (
            self.cost.step_seconds(decode_seqs, kv_read, tuple(chunks))
            + plan.adapter_loads * self.config.lora_load_s
        )

    def _load_adapters(self, needed: set[str]) -> int:
        """Load the step's adapters that are not in a GPU slot (LRU eviction); returns how many."""
        loads = 0
        for adapter in sorted(needed):
            if adapter in self.loaded_adapters:
                self.loaded_adapters.move_to_end(adapter)
                continue
            if len(self.loaded_adapters) >= self.config.max_loras:  # the batch needs <= max_loras
                victim = next(a for a in self.loaded_adapters if a not in needed)
                del self.loaded_adapters[victim]
            self.loaded_adapters[adapter] = None
            loads += 1
        self.adapter_loads_total += loads
        return loads

    def _sample(self, request: SimRequest, plan: StepPlan) -> None:
        if not request.prompt_counted:
            request.prompt_counted = True
            self.prompt_tokens_total += request.prompt_tokens
        request.generated += 1
        self.generation_tokens_total += 1
        plan.sampled.append(request)
        if request.done:
            self.running.remove(request)
            self._free(request)
            plan.finished.append(request)

    # --- KV blocks ---------------------------------------------------------------------------
    def _grow(self, request: SimRequest, tokens: int) -> bool:
        needed = blocks_for(tokens, self.config.block_size) - request.blocks
        if needed > self.free_blocks:
            return False
        if needed > 0:
            request.blocks += needed
            self.free_blocks -= needed
        return True

    def _free(self, request: SimRequest) -> None:
        self.free_blocks += request.blocks
        request.blocks = 0

    def _preempt(self, request: SimRequest, plan: StepPlan) -> None:
        self._free(request)
        request.computed = 0
        request.preemptions += 1
        self.preemptions_total += 1
        self.waiting.appendleft(request)
        plan.preempted.append(request)
