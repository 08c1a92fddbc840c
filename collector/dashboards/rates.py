"""The overview's rate panel: the load arriving now against μ_slo, per replica and summed.

μ_slo (headroom_capacity_rate_requests_per_second) is the requests/s one replica of a class
serves within the SLO, measured open-loop by `headroom probe --rates` (docs/capacity.md, "Capacity
in rates"). The panel sets each selected sidecar's request rate beside its replica class's μ_slo,
and the fleet's summed rate per model beside the summed μ_slo of the replicas serving it (μ x
replicas, each replica at its own class's μ):

    A  sum by (instance, model) (rate(headroom_requests_total{...}[$__rate_interval]))
    B  max by (model, replica_class) (headroom_capacity_rate_requests_per_second{task_class="all"})
    C  sum by (model) (rate(headroom_requests_total{...}[$__rate_interval]))
    D  sum by (model) (each serving replica's own class μ_slo, queries.per_class's join)

The rate counts every outcome (a 429 is load that arrived too): the offered load, the quantity
μ_slo caps. Empty μ lines mean no estimate with a rate was published (the probe ran without
--rates, or none passed the gate).
"""

from __future__ import annotations

from typing import Any

from collector.dashboards.panels import dashed, target, timeseries
from collector.dashboards.queries import per_class, published, rate, sel
from collector.rules.naming import sample

__all__ = ["RATE_PANEL_TITLE", "load_vs_mu_panel"]

RATE_PANEL_TITLE = "Load now vs μ_slo, per replica and summed"
_MU = "headroom_capacity_rate_requests_per_second"


def load_vs_mu_panel() -> dict[str, Any]:
    """Requests/s per sidecar against its class's μ_slo; the fleet's sum against μ x replicas."""
    per_sidecar = f"sum by (instance, model) ({rate('headroom_requests_total', sel('model'))})"
    serving = f"group by (instance, model) ({sample('headroom_inflight_requests')}{sel('model')})"
    return timeseries(
        RATE_PANEL_TITLE,
        "Requests arriving per second (every outcome: the offered load) at each selected sidecar, "
        "against μ_slo, the requests/s one replica of its class serves within the SLO, measured "
        "open-loop by `headroom probe --rates` (dashed). Below, the same summed per model against "
        "μ_slo × the replicas serving it (each at its own class's μ_slo; dashed). A sidecar's line "
        "at its μ_slo is a replica at capacity in rates: its queue grows from there. KEDA's rate "
        "trigger scales at 80 % of μ_slo by default. No dashed lines: no published estimate carries "
        "a rate (run the probe with --rates).",
        [
            target(per_sidecar, "{{instance}} {{model}} requests/s", "A"),
            target(published(_MU), "{{model}} {{replica_class}} μ_slo per replica", "B"),
            target(
                f"sum by (model) ({rate('headroom_requests_total', sel('model'))})",
                "{{model}} requests/s, summed",
                "C",
            ),
            target(f"sum by (model) ({per_class(serving, '*', _MU)})", "{{model}} μ_slo × replicas", "D"),
        ],
        "reqps",
        axis_label="requests/s",
        full=True,
        overrides=dashed("B", "D"),
    )
