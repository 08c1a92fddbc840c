"""What a backtest scenario is: traffic, replicas, faults and the incidents an alert may earn.

Data only; `collector.backtest.simulate` runs it. Load is given as a share of the published knee
(offered concurrency = load x knee), so a scenario reads like the issue it reproduces:

    Scenario("ramp", "30 % to 150 % of the knee over 2 h", duration_s=7200,
             load=linear(0.3, 1.5, 7200))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from collector.sim.config import SimConfig
from collector.sim.cost import CostModel

__all__ = [
    "RequestClass",
    "Replica",
    "Fault",
    "Incident",
    "Expect",
    "Scenario",
    "FAULT_KINDS",
    "BACKTEST_COST",
    "BACKTEST_ENGINE",
    "SHORT",
    "LONG",
    "constant",
    "linear",
    "steps",
]

# The roofline of collector.sim.cost with a 70B fp16 shape at 1.5 TB/s and 600 TFLOP/s achieved
# (H100-class compute): ~0.1 s per decode step, ~0.23 ms of prefill per prompt token, so decode is
# memory-bound and TTFT stays flat until the batch is full. Big steps keep a day of traffic to
# seconds of Python; the queueing they produce is a faster engine's at the same knee.
BACKTEST_COST = CostModel(
    params=70e9, layers=80, hidden_size=8192, kv_bytes_per_token=327680, compute_flops=6.0e14
)
# 32 slots, a KV cache that holds them at short prompts, a long queue (16 batches) before 429s.
BACKTEST_ENGINE = SimConfig(
    max_num_seqs=32, max_num_batched_tokens=2048, kv_cache_tokens=65536, max_waiting=512
)

# Fault kinds and what each does (collector.backtest.simulate and exposition apply them):
FAULT_KINDS = {
    "engine_metrics_down": "the engine's /metrics fails: headroom_engine_up 0, engine gauges absent",
    "engine_outage": "the engine is gone: running requests fail, new ones get a 502 at once",
    "shedding": "a share of arrivals is refused by the engine (HTTP `status`, 503 or 429)",
    "log_sink_outage": "the lake the sidecar stages into takes no writes: rows spool on the sidecar",
    "sidecar_down": "Prometheus cannot scrape the sidecar: up 0, no other series",
    "sidecar_gone": "the scrape job vanished: no series at all, not even up",
    "slow_replica": "the replica's engine runs `factor` times slower (bandwidth and compute)",
}


@dataclass(frozen=True)
class RequestClass:
    """A kind of request: uniform prompt and output lengths in tokens (inclusive ranges)."""

    name: str
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]

    @property
    def mean_prompt(self) -> float:
        return sum(self.prompt_tokens) / 2

    @property
    def mean_output(self) -> float:
        return sum(self.output_tokens) / 2


SHORT = RequestClass("short", (100, 300), (32, 96))
LONG = RequestClass("long", (800, 1500), (64, 128))


@dataclass(frozen=True)
class Replica:
    """One sidecar and its engine: the `instance` label, the engine's settings and cost model.

    `cluster`, when set, labels every series of the replica `cluster=<value>` (two clusters may
    each run a "replica-0"); `load`, when set, replaces the scenario's load for this replica.
    """

    instance: str
    engine: SimConfig = BACKTEST_ENGINE
    cost: CostModel = BACKTEST_COST
    cluster: str = ""
    load: Callable[[float], float] | None = None  # t_s -> offered concurrency / knee (None: the scenario's)

    @property
    def key(self) -> str:
        """What tells replicas apart: 'replica-0', or 'a/replica-0' in cluster a."""
        return f"{self.cluster}/{self.instance}" if self.cluster else self.instance


@dataclass(frozen=True)
class Fault:
    """Something that goes wrong from `start_s` to `end_s` (scenario seconds), on one replica or all."""

    kind: str
    start_s: float
    end_s: float
    instance: str | None = None  # None: every replica (an instance name: in every cluster)
    share: float = 1.0  # shedding: share of arrivals refused
    status: int = 503  # shedding: the engine's answer
    factor: float = 3.0  # slow_replica: how many times slower

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {', '.join(FAULT_KINDS)}")
        if not 0 <= self.start_s < self.end_s:
            raise ValueError(
                f"fault {self.kind}: start_s={self.start_s} must be >= 0 and below end_s={self.end_s}"
            )

    def covers(self, t_s: float, instance: str) -> bool:
        """True while this fault affects `instance` at scenario time `t_s`."""
        return self.start_s <= t_s < self.end_s and self.instance in (None, instance)


@dataclass(frozen=True)
class Incident:
    """A window in which users are, or are about to be, affected: alerts there are earned."""

    name: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Expect:
    """What the rules must show on a scenario (collector.backtest.verdict checks it).

    `fires`: (alert selector, seconds) pairs: the alert fires within that long of the first fault
    or incident. `fired`: selectors that must fire at least once, at any time. `silent`: selectors
    that must never fire. A selector is an alert name, labels, or both:
    'HeadroomSlowReplica{instance="replica-3"}', '{caliber="requests"}', '{cluster="a"}'.
    """

    pages: int | None = None  # fired pages, exactly (None: not checked)
    warnings: int | None = None  # fired warnings, exactly
    false_pages: int | None = 0
    false_warnings: int | None = None
    lead_warning_s: float | None = None  # the first warning at least this long before the breach
    lead_page_s: float | None = None
    fires: tuple[tuple[str, float], ...] = ()
    fired: tuple[str, ...] = ()
    silent: tuple[str, ...] = ()
    silent_before_breach: tuple[str, ...] = ()  # must not fire before the first breach
    silent_before_problem: tuple[str, ...] = ()  # must not fire before the first fault or incident
    breach: bool | None = None  # the rows must (True) or must not (False) show a breach
    # page notifications after Alertmanager's grouping and inhibition, exactly (None: not checked)
    page_notifications: int | None = None


@dataclass(frozen=True)
class Scenario:
    """A scenario: traffic over time, the replicas serving it, faults, and the declared incidents."""

    name: str
    summary: str
    duration_s: float
    load: Callable[[float], float]  # t_s -> offered concurrency / knee, per replica (Replica.load overrides)
    long_share: Callable[[float], float] = lambda t_s: 0.05
    short: RequestClass = SHORT
    long: RequestClass = LONG
    replicas: tuple[Replica, ...] = (Replica("replica-0"),)
    # LoRA adapters in the mix at t_s: each request names one of the first n of its replica's
    # engine.lora_adapters, uniformly (0: every request is the base model's)
    adapters: Callable[[float], float] = lambda t_s: 0
    streamed_share: float = 1.0
    faults: tuple[Fault, ...] = ()
    incidents: tuple[Incident, ...] = ()
    model: str = "llama-70b"
    tenants: tuple[tuple[str, float], ...] = (("team-a", 0.6), ("team-b", 0.4))
    knee_requests: int = 32  # the published knee per replica (the probe's answer)
    # the published token capacity per replica; None: what the product publishes for this traffic,
    # knee_requests x the time-weighted tokens per in-flight request of the first `baseline_s`
    # (collector.backtest.simulate.published_token_capacity)
    knee_tokens: int | None = 40000
    baseline_s: float = 15 * 60.0
    recommended_pool: int = 24
    scrape_interval_s: float = 15.0
    evaluation_interval_s: float = 30.0
    seed: int = 1
    expect: Expect = field(default_factory=Expect)

    def __post_init__(self) -> None:
        keys = [replica.key for replica in self.replicas]
        twice = sorted({key for key in keys if keys.count(key) > 1})
        if twice:
            raise ValueError(
                f"scenario {self.name}: replicas {', '.join(twice)} appear twice "
                "(give them different instances or clusters)"
            )

    def faults_of(self, kind: str) -> list[Fault]:
        """This scenario's faults of one kind."""
        return [fault for fault in self.faults if fault.kind == kind]

    def problems(self) -> list[Incident]:
        """The declared incidents and one per fault: the windows where alerts are earned."""
        return list(self.incidents) + [
            Incident(f.kind + (f" ({f.instance})" if f.instance else ""), f.start_s, f.end_s)
            for f in self.faults
        ]


def constant(value: float) -> Callable[[float], float]:
    """A load or share that never changes: constant(0.5)(t) -> 0.5."""
    return lambda t_s: value


def linear(start: float, end: float, over_s: float, after_s: float = 0.0) -> Callable[[float], float]:
    """From `start` to `end` between after_s and after_s + over_s, flat outside: linear(0, 1, 10)(5) -> 0.5."""

    def value(t_s: float) -> float:
        progress = min(1.0, max(0.0, (t_s - after_s) / over_s))
        return start + (end - start) * progress

    return value


def steps(base: float, *windows: tuple[float, float, float]) -> Callable[[float], float]:
    """`base`, except `value` inside each (start_s, end_s, value): steps(0.5, (60, 120, 1.2))(90) -> 1.2."""

    def value(t_s: float) -> float:
        for start, end, level in windows:
            if start <= t_s < end:
                return level
        return base

    return value
