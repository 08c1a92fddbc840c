"""The published capacity: one decision, per model and task class, of what the gauges export.

Every reader of "the capacity" asks this module: the sidecar's and the store's jobs (which set the
headroom_capacity_* gauges), `headroom demo`, `headroom capacity curve` and `headroom report`. So
they cannot disagree. The rule, over the saved estimates (collector.store.estimates):

  1. A probe run (a measured concurrency gradient) wins while it is younger than
     `probe_max_age` (default 7 days): the knee moves when the model, version or hardware does,
     so a probe is evidence for a while, not forever.
  2. Otherwise the newest traffic estimate (the passive curve) is published when its knee was
     reached (traffic crossed it) and its confidence clears `traffic_confidence` (default
     medium: the knee's bucket, the one above and one below each held >= 50 requests and >= 3
     windows; collector.analysis.passive.confidence_bar).
  3. Otherwise nothing is published, and the alerts that divide by capacity stay silent; the
     decision says why (e.g. "traffic never crossed the knee").

A knee that was not reached is a lower bound and is never published, whatever its source.

    decide(saved_estimates_of_one_model, now)  -> Decision(estimate or None, reason)
    published(store, now)                      -> [Decision per model and task class]
    publish(store, gauges, now)                -> the same, with the gauges replaced
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from collector.store import estimates as saved
from collector.store.capacity_gauges import ALL_TASKS, CapacityGauges
from collector.store.db import RequestStore

__all__ = ["PublishPolicy", "Decision", "decide", "published", "publish", "CONFIDENCE_RANK"]

CONFIDENCE_RANK = {"none": 0, "low": 1, "medium": 2, "high": 3, "measured": 3}


@dataclass(frozen=True)
class PublishPolicy:
    """How old a probe may be, and how confident traffic must be, to be published."""

    probe_max_age: timedelta = timedelta(days=7)
    traffic_confidence: str = "medium"

    def __post_init__(self) -> None:
        if self.traffic_confidence not in ("low", "medium", "high"):
            raise ValueError(f"traffic confidence {self.traffic_confidence!r} is not one of "
                             "low, medium, high")


@dataclass(frozen=True)
class Decision:
    """What is published for one model and task class, and why."""

    model: str
    task_class: str
    estimate: Mapping[str, Any] | None
    reason: str

    @property
    def knee_requests(self) -> int | None:
        return None if self.estimate is None else self.estimate.get("knee_requests")


def _age(estimate: Mapping[str, Any], now: datetime) -> timedelta:
    return now - datetime.fromisoformat(estimate["created_at"])


def _hours(age: timedelta) -> str:
    return f"{age.total_seconds() / 3600:.1f} h"


def decide(estimates: Sequence[Mapping[str, Any]], now: datetime,
           policy: PublishPolicy = PublishPolicy()) -> Decision:
    """The decision for the saved estimates of ONE model and task class (any order)."""
    if not estimates:
        raise ValueError("decide() needs the estimates of one model; none were given")
    model = estimates[0].get("model") or "unknown"
    task_class = estimates[0].get("task_class") or ALL_TASKS
    newest = sorted(estimates, key=lambda e: e["created_at"], reverse=True)
    probe = next((e for e in newest if e["source"] == "probe"), None)
    traffic = next((e for e in newest if e["source"] == "traffic"), None)
    if probe is not None and probe.get("knee_requests") is not None \
            and _age(probe, now) <= policy.probe_max_age:
        return Decision(model, task_class, probe,
                        f"probe run {probe.get('run_id') or '-'} ({_hours(_age(probe, now))} old)")
    why = []
    if probe is not None:
        why.append(f"the newest probe is {_hours(_age(probe, now))} old"
                   if probe.get("knee_requests") is not None
                   else "the newest probe did not reach the knee")
    if traffic is None:
        why.append("no traffic estimate")
    elif traffic.get("knee_requests") is None:
        why.append("traffic never crossed the knee")
    elif CONFIDENCE_RANK.get(traffic.get("confidence"), 0) < CONFIDENCE_RANK[policy.traffic_confidence]:
        why.append(f"traffic confidence {traffic.get('confidence')} is below "
                   f"{policy.traffic_confidence} ({traffic.get('confidence_reason') or 'thin data'})")
    else:
        return Decision(model, task_class, traffic,
                        f"traffic ({traffic.get('confidence')} confidence, "
                        f"{_hours(_age(traffic, now))} old)")
    return Decision(model, task_class, None, "nothing published: " + "; ".join(why))


def published(store: RequestStore, now: datetime, policy: PublishPolicy = PublishPolicy()
              ) -> list[Decision]:
    """The decision for every model and task class with a saved estimate, in order."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for estimate in saved.candidate_estimates(store):
        key = (estimate.get("model") or "unknown", estimate.get("task_class") or ALL_TASKS)
        grouped[key].append(estimate)
    return [decide(grouped[key], now, policy) for key in sorted(grouped)]


def publish(store: RequestStore, gauges: CapacityGauges | None, now: datetime,
            policy: PublishPolicy = PublishPolicy()) -> list[Decision]:
    """Decide, then replace the gauges with what is published (nothing where nothing is)."""
    decisions = published(store, now, policy)
    if gauges is not None:
        gauges.replace([saved.published(d.estimate) for d in decisions if d.estimate is not None])
    return decisions
