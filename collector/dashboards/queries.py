"""PromQL for the dashboards: every selector filtered by the dashboard's variables, read from raw series.

Why raw series and not the recording rules: the records aggregate to `model` (or to one sidecar)
and drop `cluster`, `namespace` and `job`, so a panel built on them could not honour the
variables. Alerts keep using the records; Prometheus evaluates both from the same samples.

    sel("model")  -> '{cluster=~"$cluster", namespace=~"$namespace", job=~"$job", instance=~"$instance",
                       model=~"$model"}'
    quantile(0.95, "headroom_time_to_first_token_seconds", by="model")
        -> 'histogram_quantile(0.95, sum by (le, model) (rate(headroom_..._bucket{...}[$__rate_interval])))'
    served("max by (model) (headroom_capacity_knee_requests{...})")
        -> the same, only for models the selected sidecars serve (`and on (model) ...`)
    per_class("sum by (instance, model) (headroom_inflight_requests{...})", "/", "headroom_capacity_knee_requests")
        -> each sidecar over the knee of its own replica class (else its model's default class)
"""

from __future__ import annotations

from collector.rules.naming import le_label, sample

__all__ = [
    "SCOPE",
    "sel",
    "scoped",
    "rate",
    "quantile",
    "served",
    "published",
    "per_class",
    "slo_miss_ratio",
    "VARIABLES",
]

# The variables every panel honours, in the order the dashboard shows them.
VARIABLES = ("cluster", "namespace", "job", "instance")
SCOPE = ", ".join(f'{name}=~"${name}"' for name in VARIABLES)
_FILTERS = {"model": 'model=~"$model"', "tenant": 'tenant=~"$tenant"'}


def sel(*filters: str, extra: str = "") -> str:
    """The selector of a sidecar series: the four scope variables, then `filters`, then `extra`."""
    matchers = [SCOPE] + [_FILTERS[name] for name in filters] + ([extra] if extra else [])
    return "{" + ", ".join(matchers) + "}"


def scoped(extra: str = "") -> str:
    """The selector of a series not scraped from a sidecar (capacity from the store, DCGM): place only."""
    matchers = ['cluster=~"$cluster"', 'namespace=~"$namespace"'] + ([extra] if extra else [])
    return "{" + ", ".join(matchers) + "}"


def rate(name: str, selector: str, suffix: str = "") -> str:
    """rate(<sample>{selector}[$__rate_interval])."""
    return f"rate({sample(name, suffix)}{selector}[$__rate_interval])"


def quantile(q: float, histogram: str, *, by: str = "model", selector: str | None = None) -> str:
    """The q-quantile of a catalog histogram over the selected sidecars, per `by` labels."""
    return (
        f"histogram_quantile({q:g}, sum by (le, {by}) "
        f"({rate(histogram, selector or sel('model'), 'bucket')}))"
    )


def served(expr: str) -> str:
    """Keep `expr` (one series per model) to the models the selected sidecars serve."""
    return f"{expr}\nand on (model) group by (model) ({sample('headroom_inflight_requests')}{sel('model')})"


_EVERY_TASK = 'model=~"$model", task_class="all"'
_DEFAULT_CLASS = _EVERY_TASK + ', replica_class=~"|default"'  # unlabelled gauges read as "default"


def published(name: str, aggregate: str = "max") -> str:
    """A published capacity gauge per model and replica class (task class `all`), for the models
    the selection serves.

    Each sidecar publishes it (in a fleet, from the fleet's estimates table), so it is filtered by
    place, model and the selected sidecars' models, not by `job`.
    """
    return served(f"{aggregate} by (model, replica_class) ({sample(name)}{scoped(_EVERY_TASK)})")


def per_class(left: str, op: str, name: str) -> str:
    """`left` (one series per sidecar and model) `op` the capacity gauge `name` (task class `all`)
    of that sidecar's own replica class (headroom_replica_info), else of its model's default class
    (estimates saved before classes, a sidecar that exports no class): the join the rules make."""
    info = f"max by (instance, replica_class) ({sample('headroom_replica_info')}{sel()})"
    gauge = sample(name)
    own = (
        f"{left}\n* on (instance) group_left (replica_class) {info}\n"
        f"{op} on (model, replica_class) group_left ()\n"
        f"max by (model, replica_class) ({gauge}{scoped(_EVERY_TASK)})"
    )
    default = f"{left}\n{op} on (model) group_left ()\nmax by (model) ({gauge}{scoped(_DEFAULT_CLASS)})"
    return f"(\n(\n{own}\n)\nor on (instance, model)\n(\n{default}\n)\n)"


def slo_miss_ratio(slo_seconds: float, window: str) -> str:
    """Share of requests slower than the TTFT SLO over `window`, per model (1 - bucket/count)."""
    at_slo = f'le="{le_label(slo_seconds)}"'
    bucket = f"{sample('headroom_time_to_first_token_seconds', 'bucket')}{sel('model', extra=at_slo)}"
    count = f"{sample('headroom_time_to_first_token_seconds', 'count')}{sel('model')}"
    return f"1 - sum by (model) (rate({bucket}[{window}]))\n/ sum by (model) (rate({count}[{window}]))"
