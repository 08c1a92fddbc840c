"""A scenario run on the simulator's pure scheduler in simulated time: no clock, no sockets.

Each replica gets a seeded open-loop Poisson stream (thinning over the scenario's load shape) and
its own `collector.sim.scheduler.Scheduler`. The loop plans one engine step, advances simulated
time by the step's cost-model duration and stamps first tokens and completions at the step's end,
exactly as `headroom sim` does, but as fast as Python runs. Faults change what the engine does
(outage, load shedding, a slow replica); those that only change what is exported are applied by
collector.backtest.exposition.

    result = simulate(SCENARIOS["ramp"])
    result.records[0]        -> Lifecycle(admitted=..., first_token=..., outcome="ok", ...)
    result.engine["replica-0"][0] -> EngineSample(t=..., running=5, waiting=0, ...)

Replicas are keyed by Replica.key: the instance, or "cluster/instance" for a replica in a cluster
(whose records carry the cluster and request ids that start with it).
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from collector.analysis.token_knee import Held, token_capacity, token_mix_of
from collector.backtest.lifecycle import Lifecycle
from collector.backtest.scenario import Fault, Replica, Scenario
from collector.sim.scheduler import QueueFull, Scheduler, SimRequest
from collector.tasks import classify

__all__ = ["EPOCH", "EngineSample", "SimulationResult", "simulate", "arrival_rate"]

# Scenario time 0 (a Monday, midnight UTC): fixed, so a scenario gives the same bytes every run.
EPOCH = datetime(2026, 1, 5, tzinfo=UTC).timestamp()
_REJECT_S = 0.005  # how long a refused request takes, admission to answer
_SLOT_S = 10  # the arrival rate is held constant over slots of this many seconds


@dataclass(frozen=True, slots=True)
class EngineSample:
    """The engine at one scrape: batch, queue, KV usage 0-1, the share of the interval it computed,
    and the LoRA adapters it loaded into a GPU slot since the last scrape."""

    t: float
    running: int
    waiting: int
    kv_usage_ratio: float
    busy_ratio: float
    adapter_loads: int = 0


@dataclass(frozen=True)
class SimulationResult:
    """Every request of the scenario and each replica's engine samples (by Replica.key), at POSIX times."""

    scenario: Scenario
    records: list[Lifecycle]
    engine: dict[str, list[EngineSample]]
    epoch: float = EPOCH

    @property
    def end(self) -> float:
        return self.epoch + self.scenario.duration_s


def _mean_duration_s(scenario: Scenario, replica: Replica, share: float, rate: float) -> float:
    """Mean request duration at `rate` requests/s: prefill, then decode steps slowed by others' prefills.

    Each arriving prompt lengthens one step by its prefill compute, so decode runs only in the
    time prefills leave: step = base / (1 - rate x extra prefill seconds per request).
    """
    cost, batch = replica.cost, max(1, scenario.knee_requests // 2)
    kinds = ((scenario.short, 1 - share), (scenario.long, share))
    context = int(sum(w * (k.mean_prompt + k.mean_output / 2) for k, w in kinds))
    base = cost.step_seconds(batch, batch * context)
    prefill = {
        k.name: cost.step_seconds(batch, batch * context, ((int(k.mean_prompt), 0),)) for k, _ in kinds
    }
    busy = min(0.9, rate * sum(w * (prefill[k.name] - base) for k, w in kinds))
    return sum(w * (prefill[k.name] + k.mean_output * base / (1 - busy)) for k, w in kinds)


def arrival_rate(scenario: Scenario, replica: Replica, t_s: float) -> float:
    """Requests per second to one replica so its offered concurrency is load(t) x knee (Little's law).

    The load is the replica's own when it has one, else the scenario's.
    """
    load = replica.load or scenario.load
    share, target = scenario.long_share(t_s), load(t_s) * scenario.knee_requests
    rate = 0.0
    for _ in range(12):  # fixed point of rate = target / duration(rate); converges in a few rounds
        rate = target / _mean_duration_s(scenario, replica, share, rate)
    return rate


def _arrivals(scenario: Scenario, replica: Replica, rng: random.Random) -> list[float]:
    """Arrival times (scenario seconds): a Poisson stream thinned to the rate of each 10 s slot."""
    slots = [
        arrival_rate(scenario, replica, t) for t in range(0, int(scenario.duration_s) + _SLOT_S, _SLOT_S)
    ]
    top = max(slots)
    if top <= 0:
        return []
    times: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= scenario.duration_s:
            return times
        if rng.random() * top < slots[int(t) // _SLOT_S]:
            times.append(t)


class _Replica:
    """The event loop of one replica: arrivals, engine steps, faults and scrape samples."""

    def __init__(self, scenario: Scenario, replica: Replica, index: int) -> None:
        self.scenario, self.replica = scenario, replica
        self.rng = random.Random(scenario.seed * 7919 + index)
        self.pending = deque(_arrivals(scenario, replica, self.rng))
        self.scheduler = Scheduler(replica.engine, replica.cost)
        self.live: dict[SimRequest, Lifecycle] = {}
        self.records: list[Lifecycle] = []
        self.samples: list[EngineSample] = []
        self.t = 0.0
        self.next_scrape = 0.0
        self.busy_s = 0.0
        self.loads_sampled = 0  # the scheduler's adapter loads at the last scrape
        self.sequence = 0
        self.slow = scenario.faults_of("slow_replica")
        self.outages = [
            f for f in scenario.faults_of("engine_outage") if f.instance in (None, replica.instance)
        ]

    # --- time -----------------------------------------------------------------------------
    def advance(self, to: float, busy: bool) -> None:
        """Move the clock to `to`, sampling the engine at every scrape time passed on the way."""
        interval = self.scenario.scrape_interval_s
        while self.next_scrape < to and self.next_scrape <= self.scenario.duration_s:
            if busy:
                self.busy_s += self.next_scrape - self.t
            self.t = self.next_scrape
            self._sample()
            self.next_scrape += interval
        if busy:
            self.busy_s += to - self.t
        self.t = to

    def _sample(self) -> None:
        sched, interval = self.scheduler, self.scenario.scrape_interval_s
        self.samples.append(
            EngineSample(
                EPOCH + self.t,
                len(sched.running),
                len(sched.waiting),
                sched.kv_used_blocks / sched.config.num_blocks,
                min(1.0, self.busy_s / interval),
                sched.adapter_loads_total - self.loads_sampled,
            )
        )
        self.busy_s = 0.0
        self.loads_sampled = sched.adapter_loads_total

    # --- requests -------------------------------------------------------------------------
    def admit(self, at: float) -> None:
        scenario, rng = self.scenario, self.rng
        kind = scenario.long if rng.random() < scenario.long_share(at) else scenario.short
        record = Lifecycle(
            request_id=f"{self.replica.key}-{self.sequence}",
            instance=self.replica.instance,
            cluster=self.replica.cluster,
            model=scenario.model,
            tenant=_pick(scenario.tenants, rng),
            stream=rng.random() < scenario.streamed_share,
            admitted=EPOCH + at,
            prompt_tokens=rng.randint(*kind.prompt_tokens),
            target_tokens=rng.randint(*kind.output_tokens),
        )
        record.task_class = classify(record.target_tokens)  # the sidecar reads the declared max_tokens
        record.adapter = self._adapter(at)
        self.sequence += 1
        sched = self.scheduler
        record.inflight_at_admit = len(self.live) + 1
        record.engine_waiting_at_admit = len(sched.waiting)
        record.kv_usage_at_admit = sched.kv_used_blocks / sched.config.num_blocks
        self.records.append(record)
        refusal = self._refusal(at)
        if refusal is not None:
            self._finish(record, EPOCH + at + _REJECT_S, *refusal)
            return
        request = SimRequest(
            record.request_id, record.prompt_tokens, record.target_tokens, adapter=record.adapter
        )
        try:
            sched.add(request)
        except QueueFull:
            self._finish(record, EPOCH + at + _REJECT_S, "rate_limited", 429)
            return
        self.live[request] = record

    def _adapter(self, at: float) -> str | None:
        """The adapter a request arriving at `at` names (drawn only with adapters: seeds stay stable)."""
        count, names = int(self.scenario.adapters(at)), self.replica.engine.lora_adapters
        if count > len(names):
            raise ValueError(
                f"scenario {self.scenario.name}: {count} adapters in the mix at {at:.0f} s, but "
                f"{self.replica.key}'s engine serves {len(names)} (SimConfig.lora_adapters)"
            )
        return self.rng.choice(names[:count]) if count > 0 else None

    def _refusal(self, at: float) -> tuple[str, int] | None:
        """(outcome, status) when a fault refuses a request arriving at `at`, else None."""
        if any(f.covers(at, self.replica.instance) for f in self.outages):
            return "upstream_error", 502
        for fault in self.scenario.faults_of("shedding"):
            if fault.covers(at, self.replica.instance) and self.rng.random() < fault.share:
                return ("rate_limited" if fault.status == 429 else "overloaded"), fault.status
        return None

    def _finish(self, record: Lifecycle, at: float, outcome: str, status: int) -> None:
        record.completed, record.outcome, record.status_code = at, outcome, status

    def deliver(self, sampled: list[SimRequest], finished: list[SimRequest]) -> None:
        at = EPOCH + self.t
        for request in sampled:
            record = self.live[request]
            if record.first_token is None and record.stream:
                record.first_token = at
        for request in finished:
            record = self.live.pop(request)
            record.completion_tokens = request.generated
            self._finish(record, at, "ok", 200)

    # --- the loop -------------------------------------------------------------------------
    def run(self) -> None:
        end = self.scenario.duration_s
        while self.t < end:
            self._apply_faults()
            while self.pending and self.pending[0] <= self.t:
                self.admit(self.pending.popleft())
            outage = self._outage_at(self.t)
            plan = self.scheduler.plan_step() if outage is None and self.scheduler.has_work else None
            if plan is None or plan.scheduled_tokens == 0:
                self.advance(self._next_event(end), busy=False)
                continue
            step_end = self.t + plan.duration_s
            crash = self._next_outage_start(step_end)
            if crash is not None:  # the engine dies inside this step: nothing it computed arrives
                self.advance(crash, busy=True)
                continue
            self.advance(min(step_end, end), busy=True)
            self.deliver(plan.sampled, plan.finished)
        self.advance(end + self.scenario.scrape_interval_s / 2, busy=False)

    def _next_event(self, end: float) -> float:
        candidates = [end] + ([self.pending[0]] if self.pending else [])
        candidates += [f.start_s for f in self.outages + self.slow if f.start_s > self.t]
        candidates += [f.end_s for f in self.outages + self.slow if f.end_s > self.t]
        return max(self.t + 1e-6, min(candidates))

    def _outage_at(self, t: float) -> Fault | None:
        return next((f for f in self.outages if f.start_s <= t < f.end_s), None)

    def _next_outage_start(self, before: float) -> float | None:
        starts = [f.start_s for f in self.outages if self.t < f.start_s < before]
        return min(starts) if starts else None

    def _apply_faults(self) -> None:
        outage = self._outage_at(self.t)
        if outage is not None and self.live:  # the engine died: every request it held fails now
            for record in self.live.values():
                self._finish(record, EPOCH + self.t, "upstream_error", 502)
            self.live.clear()
            self.scheduler = Scheduler(self.replica.engine, self.replica.cost)
            self.loads_sampled = 0
        slow = next((f for f in self.slow if f.covers(self.t, self.replica.instance)), None)
        cost = self.replica.cost
        if slow is not None:
            cost = dataclasses.replace(
                cost,
                memory_bandwidth=cost.memory_bandwidth / slow.factor,
                compute_flops=cost.compute_flops / slow.factor,
            )
        self.scheduler.cost = cost


def _pick(weighted: tuple[tuple[str, float], ...], rng: random.Random) -> str:
    point, total = rng.random() * sum(w for _, w in weighted), 0.0
    for name, weight in weighted:
        total += weight
        if point < total:
            return name
    return weighted[-1][0]


def simulate(scenario: Scenario) -> SimulationResult:
    """Run every replica of `scenario` to its end; deterministic for a given scenario and seed.
    A scenario without a token capacity (knee_tokens None) gets the one the product would publish."""
    records, engine = [], {}
    for index, replica in enumerate(scenario.replicas):
        loop = _Replica(scenario, replica, index)
        loop.run()
        records.extend(loop.records)
        engine[replica.key] = loop.samples
    records.sort(key=lambda r: r.admitted)
    if scenario.knee_tokens is None:
        scenario = dataclasses.replace(scenario, knee_tokens=published_token_capacity(scenario, records))
    return SimulationResult(scenario, records, engine)


def published_token_capacity(scenario: Scenario, records: Sequence[Lifecycle], epoch: float = EPOCH) -> int:
    """The token capacity `headroom` publishes for this traffic (collector.analysis.token_knee): the
    request knee x the time-weighted tokens per in-flight request of the answered requests admitted
    in the first `baseline_s` (the ordinary mix, before the scenario changes it)."""
    held = [
        Held(r.e2e_s, r.prompt_tokens, r.completion_tokens, r.ttft_s or 0.0)
        for r in records
        if r.admitted < epoch + scenario.baseline_s and r.outcome == "ok" and r.e2e_s
    ]
    mix = token_mix_of(held)
    if mix is None:
        raise ValueError(
            f"scenario {scenario.name}: no answered request in its first {scenario.baseline_s:g} s"
        )
    capacity = token_capacity(scenario.knee_requests, mix)
    if capacity.mean is None:
        raise ValueError(f"scenario {scenario.name}: no token capacity ({capacity.withheld})")
    return capacity.mean
