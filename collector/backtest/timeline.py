"""From alert episodes and SLO truth to what on-call asks: did it warn in time, did it cry wolf?

- **Problems** are the SLO breaches the rows show plus the scenario's declared incidents (every
  fault is one). An alert is *earned* when all of its firing lies inside problems that concern
  it, each widened by the lead window (LEAD_WINDOW_S) before and the alert's documented tail
  (`tail_s`: GRACE_S, longer for the alerts whose windows outlast a breach by design) after.
  Any other fired alert is a **false alert**: one that fires outside every problem, and one that
  starts inside a problem but keeps firing longer than its tail after it (`AlertSpan.why`).
- **Lead time** is measured against the first breach: the first warning and the first page that
  fired in the lead window or during the breach, as breach start minus firing time (positive:
  it fired before users were hurt; negative: late by that much).
- **Clusters**: a breach in a cluster (Breach.cluster) earns, and leads, only the alerts labelled
  with that cluster or with none (a fleet-wide alert); another cluster's alert is not its warning.

    timeline = build_timeline("ramp", evaluation, breaches, incidents, start, end)
    timeline.lead_page_s  ->  420.0     timeline.false_pages  ->  []
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collector.backtest.alertstate import Episode
from collector.backtest.evaluate import Evaluation
from collector.backtest.scenario import Incident
from collector.backtest.truth import Breach

__all__ = [
    "Problem",
    "AlertSpan",
    "Timeline",
    "build_timeline",
    "tail_s",
    "LEAD_WINDOW_S",
    "GRACE_S",
    "TAILS_S",
]

LEAD_WINDOW_S = 1800.0  # an alert this long before a problem counts as a warning of it
GRACE_S = 900.0  # and this long after one as its tail (rates and `keep_firing_for` lag)
# Alerts whose windows keep them firing after the problem by design, and how long: the slow
# burns' short window is 6 h (1x the budget over 6 h stays above it for up to 6 h after a burst
# of misses), the fast burns' 30 m (their 6x pair), both plus GRACE_S.
TAILS_S = {
    "HeadroomAvailabilityBudgetBurnSlow": 6 * 3600 + GRACE_S,
    "HeadroomTTFTBudgetBurnSlow": 6 * 3600 + GRACE_S,
    "HeadroomE2EBudgetBurnSlow": 6 * 3600 + GRACE_S,
    "HeadroomGoodputBudgetBurnSlow": 6 * 3600 + GRACE_S,
    "HeadroomAvailabilityBudgetBurnFast": 1800 + GRACE_S,
    "HeadroomTTFTBudgetBurnFast": 1800 + GRACE_S,
    "HeadroomE2EBudgetBurnFast": 1800 + GRACE_S,
    "HeadroomGoodputBudgetBurnFast": 1800 + GRACE_S,
}


def tail_s(alert: str) -> float:
    """How long `alert` may keep firing after the problem it answers: TAILS_S, else GRACE_S."""
    return TAILS_S.get(alert, GRACE_S)


@dataclass(frozen=True)
class Problem:
    """A window in which alerts are earned: an SLO breach or a declared incident."""

    name: str
    start: float
    end: float
    kind: str  # "breach" | "incident"
    cluster: str = ""  # a breach's cluster ("" : every cluster, as incidents are)

    def concerns(self, labels: dict[str, str]) -> bool:
        """Whether an alert with `labels` answers this problem: same cluster, or either has none."""
        return _same_cluster(self.cluster, labels)


def _same_cluster(cluster: str, labels: dict[str, str]) -> bool:
    """True without a cluster, for an alert without one, and for the cluster's own alerts."""
    return not cluster or labels.get("cluster", cluster) == cluster


@dataclass(frozen=True)
class AlertSpan:
    """One alert episode as the timeline shows it."""

    name: str
    severity: str
    labels: dict[str, str]
    pending_at: float
    firing_at: float | None
    ended_at: float | None
    earned: bool
    why: str = ""  # a false alert's reason: "outside every problem", "outlasts ... by 42.0m"

    @property
    def is_page(self) -> bool:
        return self.severity == "critical"

    @property
    def fired_at(self) -> float:
        """When it fired; only for episodes that did (Timeline.fired), else ValueError."""
        if self.firing_at is None:
            raise ValueError(f"{self.name} went pending at {self.pending_at} and never fired")
        return self.firing_at


@dataclass
class Timeline:
    """A scenario's backtest: alerts, problems, lead times and false alerts (times in POSIX s)."""

    scenario: str
    start: float
    end: float
    alerts: list[AlertSpan]
    problems: list[Problem]
    first_breach: Breach | None = None
    first_warning: AlertSpan | None = None
    first_page: AlertSpan | None = None
    timings_s: dict[str, float] = field(default_factory=dict)

    def _lead(self, span: AlertSpan | None) -> float | None:
        if span is None or self.first_breach is None:
            return None
        return self.first_breach.start - span.fired_at

    @property
    def lead_warning_s(self) -> float | None:
        return self._lead(self.first_warning)

    @property
    def lead_page_s(self) -> float | None:
        return self._lead(self.first_page)

    @property
    def fired(self) -> list[AlertSpan]:
        return [span for span in self.alerts if span.firing_at is not None]

    @property
    def pages(self) -> list[AlertSpan]:
        return [span for span in self.fired if span.is_page]

    @property
    def warnings(self) -> list[AlertSpan]:
        return [span for span in self.fired if not span.is_page]

    @property
    def false_pages(self) -> list[AlertSpan]:
        return [span for span in self.pages if not span.earned]

    @property
    def false_warnings(self) -> list[AlertSpan]:
        return [span for span in self.warnings if not span.earned]

    def firing(self, name: str) -> list[AlertSpan]:
        """The fired episodes of alert `name`."""
        return [span for span in self.fired if span.name == name]


def _judge(name: str, episode: Episode, labels: dict[str, str], problems: list[Problem], end: float) -> str:
    """ "" when every moment the episode fired lies in a window it may fire in, else why not."""
    if episode.firing_at is None:
        return ""
    start, stop = episode.firing_at, episode.ended_at if episode.ended_at is not None else end
    concerned = [p for p in problems if p.concerns(labels)]
    windows = sorted((p.start - LEAD_WINDOW_S, p.end + tail_s(name), p) for p in concerned)
    covered, last, resumes = start, None, stop
    for low, high, problem in windows:
        if low > covered:
            resumes = min(stop, low)  # the next window it may fire in
            break
        if high > covered:
            covered, last = high, problem
    if covered >= stop:
        return ""
    if last is None:
        return "outside every problem"
    return f"outlasts {last.name} by {(resumes - last.end) / 60:.1f}m (its tail: {tail_s(name) / 60:g}m)"


def _breach_name(breach: Breach) -> str:
    """'ttft SLO breach (llama-70b)', or '... (llama-70b in cluster a)'."""
    where = f"{breach.model} in cluster {breach.cluster}" if breach.cluster else breach.model
    return f"{breach.kind} SLO breach ({where})"


def _problems(breaches: list[Breach], incidents: list[Incident], epoch: float) -> list[Problem]:
    found = [Problem(_breach_name(b), b.start, b.end, "breach", b.cluster) for b in breaches]
    found += [Problem(i.name, epoch + i.start_s, epoch + i.end_s, "incident") for i in incidents]
    return sorted(found, key=lambda p: (p.start, p.name))


def _first(spans: list[AlertSpan], breach: Breach | None, page: bool) -> AlertSpan | None:
    if breach is None:
        return None
    chosen = [
        s
        for s in spans
        if s.firing_at is not None
        and s.is_page == page
        and breach.start - LEAD_WINDOW_S <= s.firing_at <= breach.end
        and _same_cluster(breach.cluster, s.labels)
    ]
    return min(chosen, key=lambda s: s.fired_at, default=None)


def build_timeline(
    scenario: str,
    evaluation: Evaluation,
    breaches: list[Breach],
    incidents: list[Incident],
    start: float,
    end: float,
) -> Timeline:
    """Judge every episode of `evaluation` against the breaches and incidents of the window."""
    problems = _problems(breaches, incidents, start)
    spans = []
    for episode in evaluation.episodes:
        name = episode.label("alertname")
        labels = {k: v for k, v in episode.labels if k != "alertname"}
        why = _judge(name, episode, labels, problems, end)
        spans.append(
            AlertSpan(
                name,
                evaluation.severities.get(name, labels.get("severity", "")),
                labels,
                episode.pending_at,
                episode.firing_at,
                episode.ended_at,
                not why,
                why,
            )
        )
    first_breach = breaches[0] if breaches else None
    return Timeline(
        scenario,
        start,
        end,
        spans,
        problems,
        first_breach,
        _first(spans, first_breach, page=False),
        _first(spans, first_breach, page=True),
        dict(evaluation.timings_s),
    )
