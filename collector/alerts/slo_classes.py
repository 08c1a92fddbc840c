"""Models grouped by SLO: one set of rules per distinct target, selected by a `model` matcher.

Prometheus rules cannot look a threshold up per model, so each model with its own SLO gets its own
rules (same record and alert names, disjoint `model` matchers), and the default SLO covers every
other model. Probe load is left out of every class (CLIENT_TRAFFIC). Without per-model SLOs there
is one class and no model matcher at all:

    slo_classes(RulesConfig(), "ttft")
        -> [SloClass(matcher="", slo=Slo(ttft_seconds=2.0, ...))]
    slo_classes(RulesConfig(model_slos={"small": Slo(ttft_seconds=1.0)}), "ttft")
        -> [SloClass('model!~"small"', default), SloClass('model="small"', Slo(1.0, ...))]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from collector.rules.config import RulesConfig, Slo

__all__ = ["CLIENT_TRAFFIC", "SloClass", "slo_classes", "selector", "target_seconds", "model_alternatives"]

# Every SLO and latency signal reads clients' requests only: `headroom probe` marks its load
# (x-headroom-source: probe) and the sidecar labels it source="probe", so a probe driven past the
# knee on purpose never burns the error budget or pages. `!=` also keeps series without the label.
CLIENT_TRAFFIC = 'source!="probe"'

_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


@dataclass(frozen=True)
class SloClass:
    """Models sharing one SLO: the PromQL matcher that selects them ('' = every model) and the SLO."""

    matcher: str
    slo: Slo
    name: str = "default"  # "default" or the model's name
    target: float = 0.0  # the latency target of the class's SLI (0 for availability, which has none)

    def labels(self, classes: list[SloClass]) -> dict[str, str]:
        """{"slo_class": name} when rules of one alert differ by class (promtool lints same-name twins)."""
        return {"slo_class": self.name} if len(classes) > 1 else {}


def target_seconds(slo: Slo, kind: str) -> float | None:
    """The latency target of `kind` (None: off); availability and goodput have none in the rules
    (the sidecar judges each request's bounds for goodput) but are always on (0.0)."""
    return {"ttft": slo.ttft_seconds, "e2e": slo.e2e_seconds, "availability": 0.0, "goodput": 0.0}[kind]


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def model_alternatives(models: list[str]) -> str:
    """A PromQL regex (quoted for a string) matching exactly these model names: a|b\\.c."""
    return "|".join(_quoted(_RE2_SPECIAL.sub(r"\\\1", model)) for model in models)


def slo_classes(config: RulesConfig, kind: str) -> list[SloClass]:
    """The classes of `kind` (ttft, e2e, availability, goodput): the default first, then each
    configured model."""
    explicit = sorted(config.model_slos)
    classes = []
    default = target_seconds(config.default_slo, kind)
    if default is not None:
        matcher = f'model!~"{model_alternatives(explicit)}"' if explicit else ""
        classes.append(SloClass(matcher, config.default_slo, "default", default))
    for model in explicit:
        slo = config.model_slos[model]
        target = target_seconds(slo, kind)
        if target is not None:
            classes.append(SloClass(f'model="{_quoted(model)}"', slo, model, target))
    return classes


def selector(*matchers: str) -> str:
    """A PromQL label selector from matchers, empty ones dropped: ('a="1"', '') -> '{a="1"}'; () -> ''."""
    kept = [m for m in matchers if m]
    return "{" + ", ".join(kept) + "}" if kept else ""
