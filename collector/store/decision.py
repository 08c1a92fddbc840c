"""The published capacity: one decision per model, task class and replica class.

Every reader of "the capacity" asks this module, so none can disagree: the headroom_capacity_*
gauges of the sidecar and the store (at start-up and after each refresh), `headroom integrations`,
the backtest's replay, the query API's estimate route, `headroom capacity curve`, `headroom
report` and `headroom demo`. The rule, over the saved estimates (collector.store.estimates), for
each (model, task class, replica class):

  0. An estimate that can never be published (`unusable`): its knee was not reached (a lower
     bound), more than `max_error_ratio` (5 %) of its requests failed for reasons other than
     capacity, it recommends a pool of 0, or its own confidence is "none". It is stored (the
     review and `headroom capacity curve` show it, with the reason) but displaces nothing.
  1. The newest usable probe run (a measured concurrency gradient) wins while it is younger than
     `probe_max_age` (default 7 days): the knee moves when the model, version or hardware does,
     so a probe is evidence for a while, not forever. A newer unreached or failed probe does not
     unseat it.
  2. Otherwise the newest traffic estimate (the passive curve) is published when its knee was
     reached and its confidence clears `traffic_confidence` (default medium: the knee's bucket,
     the one above and one below each held >= 50 requests and >= 3 windows). The newest traffic
     estimate is today's traffic: an older one does not come back when it stops qualifying.
  3. Otherwise nothing is published, and the alerts that divide by capacity stay silent; the
     decision says why (e.g. "traffic never crossed the knee").

    decide(saved_estimates_of_one_key, now)   -> Decision(estimate or None, reason)
    decisions(store, now)                     -> [Decision per model, task class, replica class]
    decisions_from(candidates, now)           -> the same over candidates read elsewhere (the
                                                 fleet's table: collector.lake.estimates)
    published_estimates(store, now)           -> [the published estimates, each with its reason]
    publish(store, gauges, now)               -> decisions(), with the gauges replaced

Estimates are collector.capacity.CapacityEstimate throughout, from the store to the gauges.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from collector.capacity import CapacityEstimate
from collector.store import estimates as saved
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore

__all__ = [
    "CONFIDENCE_RANK",
    "MAX_ERROR_RATIO",
    "Decision",
    "PublishPolicy",
    "Published",
    "decide",
    "decisions",
    "decisions_from",
    "publish",
    "published_estimates",
    "unusable",
]

CONFIDENCE_RANK = {"none": 0, "low": 1, "medium": 2, "high": 3, "measured": 3}
# A probe whose requests fail for reasons other than capacity (HTTP 400 on a prompt too long for
# the slot, a wrong model name, ...) measured the failures, not the engine: above this share of
# its requests at any level it is never published and never says "high".
MAX_ERROR_RATIO = 0.05


@dataclass(frozen=True)
class PublishPolicy:
    """How old a probe may be, how confident traffic must be, how many errors are tolerated."""

    probe_max_age: timedelta = timedelta(days=7)
    traffic_confidence: str = "medium"
    max_error_ratio: float = MAX_ERROR_RATIO

    def __post_init__(self) -> None:
        if self.traffic_confidence not in ("low", "medium", "high"):
            raise ValueError(
                f"traffic confidence {self.traffic_confidence!r} is not one of low, medium, high"
            )
        if not 0.0 <= self.max_error_ratio < 1.0:
            raise ValueError(f"max error ratio {self.max_error_ratio} is not in [0, 1)")


@dataclass(frozen=True)
class Decision:
    """What is published for one model, task class and replica class, and why."""

    model: str
    task_class: str
    replica_class: str
    estimate: CapacityEstimate | None
    reason: str

    @property
    def knee_requests(self) -> int | None:
        return None if self.estimate is None else self.estimate.knee_requests


@dataclass(frozen=True)
class Published:
    """A published estimate and why it is the one (the decision's reason): what readers render."""

    estimate: CapacityEstimate
    because: str

    def to_dict(self) -> dict[str, object]:
        """The estimate's JSON with `published_because` (the query API, `--json` files)."""
        return self.estimate.to_dict() | {"published_because": self.because}


def unusable(estimate: CapacityEstimate, policy: PublishPolicy | None = None) -> str | None:
    """Why this estimate can never be published, or None when it can (its age aside)."""
    policy = policy or PublishPolicy()
    if estimate.error_ratio > policy.max_error_ratio:
        return (
            f"{estimate.error_ratio:.0%} of its requests failed for reasons other than capacity "
            f"(more than {policy.max_error_ratio:.0%})"
        )
    if estimate.knee_requests is None:
        return "its knee was not reached (a lower bound)"
    if estimate.recommended_pool <= 0:
        return "it recommends a pool of 0 (no level met the SLO)"
    if estimate.confidence == "none":
        return f"its confidence is none ({estimate.confidence_reason or 'no reason given'})"
    return None


def _age(estimate: CapacityEstimate, now: datetime) -> timedelta:
    return now - estimate.created_at


def _hours(age: timedelta) -> str:
    return f"{age.total_seconds() / 3600:.1f} h"


def _run(estimate: CapacityEstimate) -> str:
    return estimate.run_id or "-"


def decide(
    estimates: Sequence[CapacityEstimate], now: datetime, policy: PublishPolicy | None = None
) -> Decision:
    """The decision for the saved estimates of ONE model, task class and replica class."""
    if not estimates:
        raise ValueError("decide() needs the estimates of one model; none were given")
    policy = policy or PublishPolicy()
    model, task_class, replica_class = estimates[0].key
    newest = sorted(estimates, key=lambda e: e.created_at, reverse=True)
    probes = [e for e in newest if e.source == "probe"]
    probe = next((e for e in probes if unusable(e, policy) is None), None)
    passed_over = [
        f"probe run {_run(e)} was not used: {unusable(e, policy)}"
        for e in probes
        if probe is None or e.created_at > probe.created_at
    ][:1]  # the newest one says enough
    if probe is not None and _age(probe, now) <= policy.probe_max_age:
        reason = f"probe run {_run(probe)} ({_hours(_age(probe, now))} old)"
        return Decision(model, task_class, replica_class, probe, "; ".join([reason, *passed_over]))
    why = list(passed_over)
    if probe is not None:
        why.append(f"the newest usable probe is {_hours(_age(probe, now))} old")
    traffic = next((e for e in newest if e.source == "traffic"), None)
    if traffic is None:
        why.append("no traffic estimate")
    elif traffic.knee_requests is None:
        why.append("traffic never crossed the knee")
    elif (trouble := unusable(traffic, policy)) is not None:
        why.append(f"the traffic estimate is not usable: {trouble}")
    elif CONFIDENCE_RANK.get(traffic.confidence, 0) < CONFIDENCE_RANK[policy.traffic_confidence]:
        why.append(
            f"traffic confidence {traffic.confidence} is below "
            f"{policy.traffic_confidence} ({traffic.confidence_reason or 'thin data'})"
        )
    else:
        reason = f"traffic ({traffic.confidence} confidence, {_hours(_age(traffic, now))} old)"
        return Decision(model, task_class, replica_class, traffic, "; ".join([reason, *why]))
    return Decision(model, task_class, replica_class, None, "nothing published: " + "; ".join(why))


def decisions(
    store: RequestStore,
    now: datetime | None = None,
    policy: PublishPolicy | None = None,
    *,
    as_of: datetime | None = None,
) -> list[Decision]:
    """The decision for every model, task class and replica class with a saved estimate, ages
    counted at `now` (default: the present). `as_of` answers "what was published then": ages at
    that moment, over the estimates saved by then. Without it every estimate counts, whatever its
    timestamp (another machine's clock may run ahead of this one's)."""
    policy = policy or PublishPolicy()
    candidates = saved.candidate_estimates(store, policy.max_error_ratio, until=as_of)
    return decisions_from(candidates, as_of or now, policy)


def decisions_from(
    candidates: Sequence[CapacityEstimate], now: datetime | None = None, policy: PublishPolicy | None = None
) -> list[Decision]:
    """decide() for each model, task class and replica class among `candidates` (what
    candidate_estimates() or candidates_in() return), ages counted at `now` (default: the present)."""
    policy = policy or PublishPolicy()
    grouped: dict[tuple[str, str, str], list[CapacityEstimate]] = defaultdict(list)
    for estimate in candidates:
        grouped[estimate.key].append(estimate)
    at = now or datetime.now(UTC)
    return [decide(grouped[key], at, policy) for key in sorted(grouped)]


def published_estimates(
    store: RequestStore,
    now: datetime | None = None,
    policy: PublishPolicy | None = None,
    *,
    as_of: datetime | None = None,
) -> list[Published]:
    """The estimates the gauges publish (decisions()), each with its reason: what readers render."""
    return [
        Published(d.estimate, d.reason)
        for d in decisions(store, now, policy, as_of=as_of)
        if d.estimate is not None
    ]


def publish(
    store: RequestStore,
    gauges: CapacityGauges | None,
    now: datetime | None = None,
    policy: PublishPolicy | None = None,
) -> list[Decision]:
    """Decide, then replace the gauges with what is published (nothing where nothing is)."""
    made = decisions(store, now, policy)
    if gauges is not None:
        gauges.replace([d.estimate for d in made if d.estimate is not None])
    return made
