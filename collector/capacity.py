"""The capacity estimate: the one shape a capacity number has, from the probe to the gauges.

`CapacityEstimate` is what an SRE decides with: the measured levels (`LevelStats`, each with its
`LittlesLaw` check), the knee in both calibers (`KneeResult`), the SLO it was judged against
(`Slo`), the SLO maximum and the recommended pool, capacity in rates when the open-loop ladder
ran, and where it all came from. It is built by collector.analysis.estimate (from a probe run or
from traffic), saved by collector.store.estimates, decided on by collector.store.decision and
exported by collector.store.capacity_gauges, always as this type. JSON (`to_dict`/`from_dict`,
schema_version 1, documented in docs/capacity.md) exists only at the edges: the store's column,
the query API, `--json` files, a child process's answer.

A root module: the store and the analysis both import it, and it imports neither.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "ALL_TASKS",
    "CapacityEstimate",
    "DEFAULT_REPLICA_CLASS",
    "KneeResult",
    "LEGACY_TOKEN_KNEE",
    "LevelStats",
    "LittlesLaw",
    "SCHEMA_VERSION",
    "Slo",
]

SCHEMA_VERSION = 1
ALL_TASKS = "all"  # the task class of an estimate measured over every kind of request
# The replica class of an estimate that names none (estimates saved before replica classes, a
# sidecar started without --replica-class that could derive nothing): one class per model.
DEFAULT_REPLICA_CLASS = "default"


@dataclass(frozen=True)
class LittlesLaw:
    """Measured vs predicted mean in-flight over one window."""

    measured_inflight: float
    predicted_inflight: float
    ratio: float | None  # measured / predicted; None when nothing completed
    consistent: bool

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


@dataclass(frozen=True)
class LevelStats:
    """What one concurrency level measured. Rates per second; latencies in seconds."""

    concurrency: int
    samples: int
    window_s: float
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    tpot_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p95_s: float | None
    e2e_p99_s: float | None
    rate_limited_ratio: float
    timeout_ratio: float
    error_ratio: float  # every outcome other than ok, 429 and timeouts included
    mean_active_tokens: float | None  # token caliber: mean active_tokens_at_admit
    littles_law: LittlesLaw | None
    ttft_p95_persistent_s: float | None = None  # min of the two halves' p95 (module docstring)
    capacity_errors: int = 0  # 429 and 503 answers and timeouts: the only errors the knee reads
    engine_waiting_mean: float | None = None  # the engine's queue length, mean over admissions
    # the outcome mix ({"ok": 30, "http 400": 10}), the first failure's text and the share of
    # failures that are not capacity errors; None where the level came from elsewhere (traffic)
    outcomes: dict[str, int] | None = None
    first_error: str | None = None
    non_capacity_error_ratio: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON (floats rounded to microseconds / 0.001 tokens)."""
        data = asdict(self)
        data["littles_law"] = self.littles_law.to_dict() if self.littles_law else None
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in data.items()}


@dataclass(frozen=True)
class KneeResult:
    """The knee in both calibers, how each method placed it, and why they differ."""

    requests: int
    tokens: int
    reached: bool
    rule_reason: str
    kneedle_throughput: int | None
    kneedle_latency: int | None
    agree: bool
    note: str
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


@dataclass(frozen=True)
class Slo:
    """Latency targets in seconds (None = not part of the SLO) and the tolerated error ratio."""

    ttft_p95_s: float | None = None
    tpot_p95_s: float | None = None
    max_error_ratio: float = 0.01

    @property
    def defined(self) -> bool:
        """True when at least one latency target is set."""
        return self.ttft_p95_s is not None or self.tpot_p95_s is not None


@dataclass(frozen=True)
class CapacityEstimate:
    """Knee, SLO max and recommended pool of one model, with the levels they came from. Frozen:
    built in one call (collector.analysis.estimate.build_estimate, or from_dict), changed only
    into a new value (dataclasses.replace).

        Errors: `error_ratio` is the worst level's share of requests that failed for reasons other
        than capacity; above collector.store.decision.MAX_ERROR_RATIO the confidence is "none", with
        `confidence_reason`, and the estimate is never published. A token knee that must not be used
        is withheld (`knee_tokens` None, `token_knee_withheld` says why). The token figures come from
    `token_capacity` (collector.analysis.token_knee.TokenCapacity.to_dict(): time-weighted, in the
    gauge's units); an estimate saved before it has none and publishes no token figure. Keys of the JSON this type
        does not know (a newer writer's, the analysis's details such as `pool_reason`) stay in `extra`.
    """

    model: str | None
    source: str  # "probe" | "traffic"
    run_id: str | None
    profile: str
    levels: list[LevelStats]
    knee: KneeResult
    slo: Slo
    slo_max: int | None
    slo_max_tokens: int | None
    recommended_pool: int
    confidence: str = "high"  # one vocabulary everywhere: none, low, medium, high
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    stopped_early: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    task_class: str = ALL_TASKS  # the requests measured: a class of the workload, or all of them
    replica_class: str = (
        DEFAULT_REPLICA_CLASS  # the replicas measured: model x hardware x engine configuration
    )
    error_ratio: float = 0.0  # the worst level's share of non-capacity failures (module docstring)
    token_knee_withheld: str | None = None  # why the token knee must not be used; None: usable
    kv_capacity_tokens: int | None = None  # the engine's KV cache: the token knee's ceiling
    # capacity in rates from the open-loop ladder (collector.analysis.openloop): μ_slo, V_P (uncached
    # prompt tokens/s at μ_slo) and the ladder itself with its Little's-law check; None: not measured
    rate_requests_per_s: float | None = None
    prefill_tokens_per_s: float | None = None
    rates: dict[str, Any] | None = None
    confidence_reason: str | None = None  # why the confidence is what it is (thin data, errors)
    # the token caliber at the request knee (TokenCapacity.to_dict()); None: not computed (legacy)
    token_capacity: dict[str, Any] | None = None

    @property
    def knee_requests(self) -> int | None:
        """The request knee the gauges export: None when not reached (a lower bound)."""
        return self.knee.requests if self.knee.reached else None

    @property
    def key(self) -> tuple[str, str, str]:
        """What one published estimate is per: (model, task class, replica class)."""
        return (
            self.model or "unknown",
            self.task_class or ALL_TASKS,
            self.replica_class or DEFAULT_REPLICA_CLASS,
        )

    @property
    def labels(self) -> tuple[str, str, str, str, str]:
        """The headroom_capacity_* labels: model, task class, replica class, source, confidence."""
        return (*self.key, self.source, self.confidence)

    @property
    def estimated_at(self) -> float:
        """When it was made, POSIX seconds (headroom_capacity_estimate_timestamp_seconds)."""
        return self.created_at.timestamp()

    @property
    def slo_max_requests(self) -> int | None:
        """The SLO maximum in requests (headroom_capacity_slo_max_requests)."""
        return self.slo_max

    def _token_figure(self, name: str) -> int | None:
        if not self.knee.reached or self.token_knee_withheld is not None or not self.token_capacity:
            return None
        value = self.token_capacity.get(name)
        return int(value) if value is not None else None

    @property
    def knee_tokens(self) -> int | None:
        """The token capacity the gauges export (time-weighted active tokens at the request knee
        with the traffic's mix, capped at the KV): what 5-minute averages divide by. None when not
        reached, withheld, or from before the time-weighted definition."""
        return self._token_figure("mean")

    @property
    def knee_tokens_p95(self) -> int | None:
        """The p95 of the instantaneous active-token sum at the knee level: what anything acting
        on an instantaneous value (a KEDA poll, a gateway limit, a review's peak) compares with."""
        return self._token_figure("p95")

    @property
    def recommended_pool_tokens(self) -> int | None:
        """The recommended pool in tokens: the p99.9 of the instantaneous active-token sum with the
        recommended pool of requests in flight (the traffic's mix, capped at the KV): the budget
        KEDA's token trigger, a gateway's token limit and the review's peak compare with."""
        return self._token_figure("pool_tokens")

    @property
    def max_request_tokens(self) -> int | None:
        """The largest prompt + completion one answered traffic request held (no admission limit
        in tokens may be below it)."""
        value = (self.token_capacity or {}).get("max_request_tokens")
        return int(value) if value is not None else None

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON schema (docs/capacity.md); flat *_requests/*_tokens for gauges."""
        return {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "model": self.model,
            "task_class": self.task_class,
            "replica_class": self.replica_class,
            "source": self.source,
            "created_at": self.created_at.isoformat(),
            "profile": self.profile,
            "levels": [level.to_dict() for level in self.levels],
            "knee": self.knee.to_dict(),
            "slo": {
                "ttft_p95_s": self.slo.ttft_p95_s,
                "tpot_p95_s": self.slo.tpot_p95_s,
                "max_error_ratio": self.slo.max_error_ratio,
            },
            "slo_max": self.slo_max,
            "recommended_pool": self.recommended_pool,
            "confidence": self.confidence,
            "stopped_early": self.stopped_early,
            "confidence_reason": self.confidence_reason,
            # flat values the capacity gauges read; a knee not reached is a lower bound: not exported
            "knee_requests": self.knee_requests,
            "knee_tokens": self.knee_tokens,
            "knee_tokens_p95": self.knee_tokens_p95,
            "recommended_pool_tokens": self.recommended_pool_tokens,
            "max_request_tokens": self.max_request_tokens,
            "token_capacity": self.token_capacity,
            "token_knee_withheld": self.token_knee_withheld,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "error_ratio": round(self.error_ratio, 6),
            "slo_max_requests": self.slo_max,
            "slo_max_tokens": self.slo_max_tokens,
            "rate_requests_per_s": self.rate_requests_per_s,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "rates": self.rates,
        } | self.extra

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacityEstimate:
        """Rebuild from to_dict() output (as read back from the store)."""
        levels = [
            LevelStats(
                **{k: v for k, v in level.items() if k not in ("windows", "littles_law")},
                littles_law=LittlesLaw(**level["littles_law"]) if level.get("littles_law") else None,
            )
            for level in data["levels"]
        ]
        known = {
            "schema_version",
            "run_id",
            "model",
            "task_class",
            "replica_class",
            "source",
            "created_at",
            "profile",
            "levels",
            "knee",
            "slo",
            "slo_max",
            "recommended_pool",
            "confidence",
            "stopped_early",
            "knee_requests",
            "knee_tokens",
            "knee_tokens_p95",
            "recommended_pool_tokens",
            "max_request_tokens",
            "token_capacity",
            "slo_max_requests",
            "slo_max_tokens",
            "token_knee_withheld",
            "kv_capacity_tokens",
            "error_ratio",
            "rate_requests_per_s",
            "prefill_tokens_per_s",
            "rates",
            "confidence_reason",
        }
        return cls(
            data["model"],
            data["source"],
            data["run_id"],
            data["profile"],
            levels,
            KneeResult(**data["knee"]),
            Slo(**data["slo"]),
            data["slo_max"],
            data.get("slo_max_tokens"),
            data["recommended_pool"],
            _confidence(data["confidence"]),
            datetime.fromisoformat(data["created_at"]),
            data.get("stopped_early"),
            {k: v for k, v in data.items() if k not in known},
            data.get("task_class") or ALL_TASKS,
            data.get("replica_class") or DEFAULT_REPLICA_CLASS,
            float(data.get("error_ratio") or 0.0),
            data.get("token_knee_withheld") or (None if "token_capacity" in data else LEGACY_TOKEN_KNEE),
            data.get("kv_capacity_tokens"),
            data.get("rate_requests_per_s"),
            data.get("prefill_tokens_per_s"),
            data.get("rates"),
            data.get("confidence_reason"),
            data.get("token_capacity") if isinstance(data.get("token_capacity"), dict) else None,
        )


# why an estimate saved before the time-weighted token capacity publishes no token figure
LEGACY_TOKEN_KNEE = (
    "an estimate from before the time-weighted token capacity: its knee in tokens is an admission "
    "average; re-estimate (headroom capacity estimate, or the next probe)"
)


def _confidence(value: str) -> str:
    """One vocabulary (none, low, medium, high): a probe's legacy "measured" reads as "high"."""
    return "high" if value == "measured" else value
