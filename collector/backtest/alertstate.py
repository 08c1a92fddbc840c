"""Prometheus' alert state machine, evaluation by evaluation: `for:`, `keep_firing_for`, ALERTS.

The rules of Prometheus 2.42 (rules/alerting.go), which `promtool test rules` also runs; a test
replays the same inputs through both and compares:

- a label set the expression returns for the first time becomes *pending* at that evaluation;
- a pending alert fires at the first evaluation at least `for` after it became pending (`for: 0`
  fires at once);
- a pending alert the expression stops returning is dropped (it never fired);
- a firing alert the expression stops returning resolves at that evaluation, unless
  `keep_firing_for` is set: it keeps firing until an evaluation `keep_firing_for` after the first
  one that missed it (a return in between resets that clock);
- after each evaluation, ALERTS{alertname, alertstate, <labels>} = 1 for each pending or firing alert.

    machine = AlertMachine("Down", hold_s=120)
    machine.step(0, {labels: 1.0}); machine.step(60, {labels: 1.0}); machine.step(120, {labels: 1.0})
    machine.episodes[0]  ->  Episode(labels, pending_at=0, firing_at=120, resolved_at=None)
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Episode", "AlertMachine", "Labels"]

Labels = tuple[tuple[str, str], ...]  # an alert's identifying labels, sorted (alertname included)


@dataclass
class Episode:
    """One alert instance from pending to its end: resolved (it fired) or dropped (it never did)."""

    labels: Labels
    pending_at: float
    firing_at: float | None = None
    ended_at: float | None = None  # resolved (after firing) or dropped (while pending); None: still on
    value: float = 0.0  # the expression's value when it fired (or last seen pending)

    @property
    def fired(self) -> bool:
        return self.firing_at is not None

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")

    def state_at(self, t: float) -> str | None:
        """'pending', 'firing' or None: the state after the evaluation at `t`."""
        if t < self.pending_at or (self.ended_at is not None and t >= self.ended_at):
            return None
        return "firing" if self.firing_at is not None and t >= self.firing_at else "pending"


@dataclass
class _Active:
    episode: Episode
    state: str  # "pending" | "firing"
    keep_firing_since: float | None = None


@dataclass
class AlertMachine:
    """The state of one alerting rule across evaluations; `step` once per evaluation time, in order."""

    name: str
    hold_s: float = 0.0
    keep_firing_s: float = 0.0
    episodes: list[Episode] = field(default_factory=list)
    _active: dict[Labels, _Active] = field(default_factory=dict)

    def step(self, t: float, results: dict[Labels, float]) -> None:
        """Evaluate at `t` given the expression's result: {alert labels: value}."""
        for labels, value in results.items():
            active = self._active.get(labels)
            if active is not None:
                active.episode.value = value if active.state == "pending" else active.episode.value
                active.keep_firing_since = None
                continue
            episode = Episode(labels, pending_at=t, value=value)
            self.episodes.append(episode)
            self._active[labels] = _Active(episode, "pending")
        for labels, active in list(self._active.items()):
            if labels not in results and not self._keeps_firing(active, t):
                active.episode.ended_at = t
                del self._active[labels]
                continue
            if active.state == "pending" and t - active.episode.pending_at >= self.hold_s:
                active.state = "firing"
                active.episode.firing_at = t

    def _keeps_firing(self, active: _Active, t: float) -> bool:
        if active.state != "firing" or self.keep_firing_s <= 0:
            return False
        if active.keep_firing_since is None:
            active.keep_firing_since = t
        return t - active.keep_firing_since < self.keep_firing_s

    def alerts(self) -> list[dict[str, str]]:
        """The ALERTS series after the last step: one label dict (with alertstate) per active alert."""
        return [
            dict(labels) | {"alertstate": active.state} for labels, active in sorted(self._active.items())
        ]
