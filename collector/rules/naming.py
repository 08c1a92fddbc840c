"""Naming conventions for generated rules: `level:metric:operations` records and catalog sample names.

Every metric name in a rule or a panel comes through here, from `collector.catalog`, so a renamed
metric breaks generation instead of silently producing an empty query.

    record("model", "headroom_requests_total", "rate5m")  ->  "model:headroom_requests:rate5m"
    sample("headroom_time_to_first_token_seconds", "bucket")
        ->  "headroom_time_to_first_token_seconds_bucket"
"""

from __future__ import annotations

import re

from prometheus_client.utils import floatToGoString

from collector.catalog import spec

__all__ = ["record", "sample", "le_label", "DERIVED_METRICS", "RECORD_NAME", "is_record_name", "metric_names"]

# Record-name middles that are not one catalog metric but a documented combination of several.
DERIVED_METRICS = {
    "headroom_concurrency": "in-flight requests and active tokens as one series per caliber",
    "headroom_tokens": "prompt plus generated tokens",
    "headroom_requests_rate_limited": "requests answered 429",
    "headroom_requests_shed": "requests shed by the engine: answered 429 or 503",
    "headroom_ttft_slo_misses": "requests slower than the TTFT SLO",
    "headroom_e2e_slo_misses": "ok requests slower end to end than the e2e SLO",
    "headroom_availability_slo_misses": "answered requests that failed (429, 503, other 5xx, timeouts)",
    "headroom_replica_pool": "one replica's published pool in a caliber (tokens: knee_tokens x pool / knee)",
    "headroom_fleet_pool": "the sum of the replicas' pools serving a model (in one cluster)",
    "headroom_fleet_knee": "the sum of the replicas' published knees serving a model (in one cluster)",
    "headroom_replicas": "replicas of a model with a published pool",
    "headroom_replicas_needed": "replicas a load needs: ceil(load / pool per replica)",
    "headroom_goodput": "clients' requests that met every SLO bound (verdict met): goodput",
    "headroom_prefill_tokens_per_second": "prompt tokens the engine computed per second of its own "
    "prefill time: the passive prefill rate V_P",
    "headroom_prompt_cache_hits": "prompt tokens the engine read from its prefix cache (cache=cached)",
}

RECORD_NAME = re.compile(r"^(?P<level>[a-z_]+):(?P<metric>[a-z_][a-z0-9_]*):(?P<operations>[a-z0-9_]+)$")


def _base(name: str) -> str:
    """A catalog name without `_total`: rates of counters drop it (`headroom_requests`)."""
    return name[: -len("_total")] if name.endswith("_total") else name


def record(level: str, metric: str, operations: str) -> str:
    """The record name `level:metric:operations`; `metric` must be a catalog name or DERIVED."""
    if metric not in DERIVED_METRICS:
        metric = _base(spec(metric).name)
    name = f"{level}:{metric}:{operations}"
    if not RECORD_NAME.match(name):
        raise ValueError(f"record name {name!r} does not follow level:metric:operations (lowercase, _)")
    return name


def sample(name: str, suffix: str = "") -> str:
    """The exposed sample name of catalog metric `name`, with `bucket`/`sum`/`count` for histograms."""
    metric = spec(name)
    if metric.type == "histogram":
        if suffix not in ("bucket", "sum", "count"):
            raise ValueError(f"histogram {name} needs suffix bucket, sum or count, not {suffix!r}")
        return f"{metric.name}_{suffix}"
    if suffix:
        raise ValueError(f"{metric.type} {name} has no {suffix!r} series")
    return metric.name


def le_label(bound_seconds: float) -> str:
    """The `le` label value prometheus_client writes for a bucket bound (2.0 -> "2.0")."""
    # prometheus_client.utils leaves floatToGoString unannotated; it returns a str
    return str(floatToGoString(bound_seconds))  # type: ignore[no-untyped-call]


def is_record_name(name: str) -> bool:
    """True for names that look like recording rules (contain a colon)."""
    return ":" in name


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS_AND_RANGES = re.compile(r"\{[^}]*\}|\[[^\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(?![\w:])(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan", "Inf", "NaN"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (functions, keywords, label lists excluded).

    'sum by (model) (rate(headroom_requests_total{outcome="ok"}[5m])) / up' -> {"headroom_requests_total", "up"}
    """
    text = _LABEL_LISTS.sub(" ", _MATCHERS_AND_RANGES.sub(" ", _STRINGS.sub('""', expr)))
    return {name for name, call in _IDENTIFIER.findall(text) if not call and name not in _KEYWORDS}
