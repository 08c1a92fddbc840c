"""Thresholds, SLOs and durations for the generated alerts and dashboards: the one place to tune them.

Each field carries a sentence on when to change it. The committed files under `alerts/` and
`dashboards/` are rendered from `DEFAULT`; a test fails when they drift. A YAML file overrides any
of them without editing code (`headroom alerts generate --config FILE`, collector.rules.config_file).
The numbers were tuned against the backtest scenarios (`headroom alerts backtest`, docs/rules.md
"How good are these alerts"); a change that breaks a scenario's lead time or adds a false page
fails tests/test_backtest_scenarios.py. This file is longer than most: it is the documented list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from collector.catalog import DURATION_BUCKETS_SECONDS, TTFT_BUCKETS_SECONDS

__all__ = [
    "RulesConfig",
    "Slo",
    "DEFAULT",
    "ConfigError",
    "FOR_DURATIONS",
    "KEEP_FIRING_FOR",
    "RULERS",
    "seconds",
]

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
# Labels the rules themselves use; a cluster label of that name would be overwritten or merged.
_RESERVED_LABELS = frozenset(
    {"severity", "alertname", "model", "instance", "job", "caliber", "task_class", "quantile", "le"}
)
# Rulers the files are rendered for (RulesConfig.ruler).
RULERS = ("prometheus", "vmalert")


class ConfigError(ValueError):
    """A threshold or SLO that cannot produce valid rules; the message names the field and the fix."""


@dataclass(frozen=True)
class Slo:
    """One model's service-level objectives; None switches an SLO (and its alerts) off for the model.

    A batch model sets `ttft_seconds: null`: nobody waits for its first token, so its overnight
    queue gets no TTFT alerts and cannot page through the capacity composite.
    """

    # p95 TTFT the front end tolerates; must equal a TTFT histogram bucket bound (the SLI reads it).
    ttft_seconds: float | None = 2.0
    # Share of streamed requests that must meet it over 30 days (0.99 leaves a 1 % error budget).
    ttft_objective: float = 0.99
    # End-to-end time of an `ok` request, streamed or not: the SLO of non-streamed (API, batch)
    # traffic, which has no TTFT. Must be a duration bucket bound. 60 s tolerates long generations.
    e2e_seconds: float | None = 60.0
    e2e_objective: float = 0.99
    # Share of answered requests (all but client cancellations) that must not fail: 429 and 503
    # (load shedding), other 5xx, resets, timeouts and the sidecar's own 502s all count as failures.
    availability_objective: float = 0.999
    # Goodput attainment: the share of clients' requests that met every bound of the SLO the
    # sidecar judged them by (`headroom run --goodput-slo`) among all but the client's own 4xx. A
    # shed (429, 503), aborted or failed request misses it too, so shedding cannot make it look better.
    goodput_objective: float = 0.99

    def budget(self, kind: str) -> float:
        """Allowed failure share of `kind` (ttft, e2e, availability, goodput), rounded to stay
        readable in YAML."""
        objective = {
            "ttft": self.ttft_objective,
            "e2e": self.e2e_objective,
            "availability": self.availability_objective,
            "goodput": self.goodput_objective,
        }[kind]
        return round(1 - objective, 9)


# `for:` per alert name; a longer `for:` trades detection time for fewer false pages. Each value
# was checked against the backtest scenarios (docs/rules.md, "How good are these alerts").
FOR_DURATIONS: dict[str, str] = {
    "HeadroomTTFTRising": "5m",
    "HeadroomQueueNotDraining": "5m",
    "HeadroomGPUSaturatedThroughputFlat": "10m",
    "HeadroomTailLatencyOverSLO": "10m",
    "HeadroomNearCapacityLimit": "5m",
    "HeadroomConcurrencyRising": "5m",
    "HeadroomCapacityForecast": "5m",
    "HeadroomConcurrencyNearKnee": "5m",
    "HeadroomKVCacheNearFull": "5m",
    "HeadroomKVCacheExhausted": "5m",
    "HeadroomEnginePreempting": "5m",
    "HeadroomTokenCaliberDivergence": "5m",
    "HeadroomLoadShedding": "3m",
    "HeadroomSlowReplica": "10m",
    "HeadroomAvailabilityBudgetBurnFast": "2m",
    "HeadroomAvailabilityBudgetBurnSlow": "15m",
    "HeadroomTTFTBudgetBurnFast": "2m",
    "HeadroomTTFTBudgetBurnSlow": "15m",
    "HeadroomE2EBudgetBurnFast": "2m",
    "HeadroomE2EBudgetBurnSlow": "15m",
    "HeadroomGoodputBudgetBurnFast": "2m",
    "HeadroomGoodputBudgetBurnSlow": "15m",
    "HeadroomSidecarDown": "2m",
    "HeadroomSidecarJobAbsent": "5m",
    "HeadroomFleetHeadroomLow": "15m",
    "HeadroomCapacityEstimateStale": "15m",
    "HeadroomEngineScrapeFailing": "3m",
    "HeadroomLogRowsDropped": "5m",
    "HeadroomLogSinkDown": "5m",
    "HeadroomLogSinkLagging": "5m",
    "HeadroomLakeCommitStalled": "5m",
    "HeadroomLakeFilesQuarantined": "5m",
    "HeadroomRequestStuck": "2m",
    "HeadroomAdapterThrash": "5m",
    "HeadroomSignalInvalid": "3m",
}
# `keep_firing_for` (Prometheus 2.42+) on alerts whose condition flickers at its edge: once firing,
# a short dip does not resolve them (and re-page when it comes back).
KEEP_FIRING_FOR: dict[str, str] = {
    "HeadroomNearCapacityLimit": "10m",
    "HeadroomCapacityForecast": "10m",
    "HeadroomConcurrencyNearKnee": "5m",
    "HeadroomKVCacheExhausted": "5m",
    "HeadroomLoadShedding": "5m",
    "HeadroomSlowReplica": "10m",
}


@dataclass(frozen=True)
class RulesConfig:
    """Every tunable number behind the rules and dashboards, with a reason to change it."""

    # --- SLOs: the default for every model; `model_slos` overrides per model ----------------------
    ttft_slo_seconds: float = 2.0  # a number: dashboards draw it (switch TTFT off per model instead)
    ttft_slo_objective: float = 0.99
    e2e_slo_seconds: float | None = 60.0
    e2e_slo_objective: float = 0.99
    availability_objective: float = 0.999
    # Share of clients' requests that must meet their whole SLO (goodput attainment: met / every
    # verdict but the client's own 4xx) over 30 days; a shed, aborted or failed request counts
    # against it. 0.99 matches the TTFT objective; lower it where clients retry 429s by design
    # (batch fleets), raise it only with the sidecar's --goodput-slo bounds set to what users need.
    goodput_objective: float = 0.99
    # model name -> its own Slo (e.g. a batch model without a TTFT SLO, a small model with 1 s).
    model_slos: dict[str, Slo] = field(default_factory=dict)
    # Latency and burn-rate alerts need at least this many requests per 5 minutes (the slow burn:
    # on average over its 6 h window): at night one slow request in six is a 16.7 % miss ratio,
    # above the 14.4x line, yet no evidence of anything. Lower it for low-traffic models.
    slo_min_requests: int = 20
    # "TTFT rising" only counts above this p95: a climb from 50 ms to 80 ms is noise. Set it a
    # little above the p95 TTFT you see at low load.
    ttft_soft_bound_seconds: float = 0.5
    # p99 TTFT beyond which a few long requests are hurting everyone (tail-latency signal). Set
    # it to the worst wait an interactive user accepts before retrying.
    ttft_p99_tolerance_seconds: float = 5.0
    # TPOT line drawn on dashboards; change it with the streaming speed users accept (0.1 s per
    # token is ~10 tokens/s, about reading speed).
    tpot_slo_seconds: float = 0.1

    # --- capacity -------------------------------------------------------------------------------
    # Live concurrency (5-minute mean) / measured knee above which "near knee" warns. The
    # production pool is 70-80 % of the knee: at 0.85 you are past it, with bursts queueing.
    knee_warning_ratio: float = 0.85
    # "Rising" warns when, on the trend of `knee_forecast_window`, concurrency reaches the knee
    # within `knee_forecast_horizon` and is already above `knee_forecast_min_ratio` of it. The
    # forecast pages on the same trend only when the climb is sustained: the low of each of the
    # last three `knee_forecast_step` windows is at least `knee_forecast_min_rise` (of the knee)
    # above the one before, which a burst, however tall, never is. Lengthen the window on noisy fleets.
    knee_forecast_window: str = "30m"
    knee_forecast_horizon: str = "1h"
    knee_forecast_min_ratio: float = 0.5
    knee_forecast_step: str = "10m"
    knee_forecast_min_rise: float = 0.03
    # A published estimate older than this (or of confidence "low") warns: the capacity alerts
    # divide by it. The probe's own age limit (collector.store.decision's probe_max_age): a knee
    # moves when the model, version or hardware does; an older one means the refresh stopped.
    estimate_max_age: str = "7d"
    # KV-cache usage (5-minute mean) that warns, and the lower value it must fall below to clear
    # (hysteresis). The same level with the engine's queue never empty for 5 minutes pages: the
    # cache is the bottleneck and users queue behind it (a full cache alone is healthy under batch
    # load). A mean, because the usage of an engine admitting multi-thousand-token prompts swings
    # by a prompt's worth of blocks from one scrape to the next. Lower both on engines that preempt
    # early (vLLM recompute at ~95 % instantaneous).
    kv_warning_ratio: float = 0.85
    kv_warning_clear_ratio: float = 0.80
    # The dashboards' red line on KV usage: above it vLLM preempts (recomputes) running requests.
    kv_critical_ratio: float = 0.95
    # GPU utilisation treated as saturated. 0.9 suits NVML's kernel-busy ratio; DCGM's SM activity
    # reads lower, so use ~0.8 there.
    gpu_saturated_ratio: float = 0.90
    # Tokens/s now vs `flat_lookback` ago below which throughput counts as flat. Raise it (1.1) on
    # noisy fleets where 5 % is inside normal variation.
    throughput_flat_ratio: float = 1.05
    flat_lookback: str = "30m"
    # Token-caliber divergence: active tokens (5-minute mean) grew by this factor over
    # `divergence_window` while in-flight requests moved less than `inflight_flat_tolerance`.
    # Lower the growth factor for long-context fleets where KV fills quickly.
    tokens_growth_ratio: float = 1.3
    inflight_flat_tolerance: float = 0.15
    divergence_window: str = "30m"
    # ... and only with at least this many requests in flight: below it, one long request more
    # is already a 1.3x jump in tokens.
    divergence_min_inflight: int = 8
    # Share of requests answered 429 drawn on the dashboards' 429 panel.
    rate_limited_ratio: float = 0.02
    # Share of requests shed (429 + 503) that warns. Zero is the goal; raise it where clients retry
    # 429s by design (batch fleets).
    load_shedding_ratio: float = 0.02
    # A replica whose p95 TTFT is this many times the median of its model's replicas (and over the
    # soft bound) is a slow replica: thermal throttling, a noisy neighbour, a bad node.
    slow_replica_ratio: float = 2.0

    # --- in-flight age and signal integrity (docs/runbooks.md) -----------------------------------
    # A request still in flight after max(floor, multiple x its model's p99 end-to-end time) is
    # stuck. The floor keeps a model whose p99 is a few seconds from warning on one slow answer;
    # raise the multiple for models whose answers vary widely in length.
    stuck_request_floor_seconds: float = 120.0
    stuck_request_p99_multiple: float = 4.0

    # --- request-log shipping -------------------------------------------------------------------
    # Age of the oldest row the store has not accepted that warns: rows are safe in the spool, but
    # the weekly review and capacity curves are that far behind.
    sink_lag_warning_seconds: float = 900.0
    # HeadroomLakeCommitStalled: no lake commit pass succeeded for this long while staged files
    # wait, or a writer's oldest staged file waited this long. Well above `--every` (30 s) plus
    # a pass; raise it for a committer run from cron every few minutes.
    lake_commit_stall_seconds: float = 600.0

    # --- windows and durations ------------------------------------------------------------------
    # Window over which the engine queue must never reach zero. Shorter windows page on bursts.
    queue_window: str = "15m"
    # Window of deriv/predict_linear for "TTFT rising"; the prediction horizon is 1 h.
    ttft_trend_window: str = "15m"
    # HeadroomAdapterThrash: adapters in flight past the slots while mean TTFT is this many times
    # what it was adapter_ttft_baseline ago
    adapter_ttft_rise_ratio: float = 2.0
    adapter_ttft_baseline: str = "1h"
    for_durations: dict[str, str] = field(default_factory=lambda: dict(FOR_DURATIONS))
    keep_firing_for: dict[str, str] = field(default_factory=lambda: dict(KEEP_FIRING_FOR))

    # --- fleets: where the rules are evaluated ---------------------------------------------------
    # The label that tells clusters apart (kubernetes-mixin's `clusterLabel`): it is put in every
    # `by()` and `on()` of the rules, in Alertmanager's grouping and inhibition, and the fleet
    # records sum per cluster, so a central ruler (Thanos, Mimir, VictoriaMetrics, a Prometheus
    # receiving remote write) never merges two clusters. Harmless at the edge, where series carry no
    # such label. Empty: one cluster, the rules of a single Prometheus without it.
    cluster_label: str = "cluster"
    # The ruler that loads the files: "prometheus" (Prometheus 2.42+, Thanos, Mimir) or "vmalert"
    # (VictoriaMetrics; before 1.91 it refuses `keep_firing_for`, so those rules go without it).
    ruler: str = "prometheus"
    # A cluster whose sidecar job had `up` series within this window and has none now raises
    # HeadroomSidecarJobAbsent: `absent()` evaluated centrally fires only when every cluster is
    # gone. Longer than the longest outage you want paged on; after it the cluster is forgotten.
    absence_lookback: str = "6h"
    # The fleet's headroom warning ("less than one replica spare at the forecast") only for models
    # served by at least this many replicas in a cluster: one replica never has a spare one.
    fleet_min_replicas: int = 2

    # --- wiring ---------------------------------------------------------------------------------
    # Prometheus job that scrapes the sidecars (deploy/prometheus/prometheus.yml, the PodMonitor).
    # `job_selector` replaces the whole matcher when one job name is not enough
    # (e.g. 'job=~"headroom-sidecar|llm-sidecar"'); it defaults to job="<sidecar_job>".
    sidecar_job: str = "headroom-sidecar"
    job_selector_override: str | None = None
    # Where `runbook_url` points: the browsable URL of docs/runbooks.md in your fork, absolute so
    # links work in Alertmanager, Slack and PagerDuty.
    runbook_base_url: str = "https://github.com/llm-headroom/llm-headroom/blob/main/docs/runbooks.md"
    # Labels added to every alert (e.g. {"cluster": "prod-eu"}) so one Alertmanager tells fleets apart.
    extra_labels: dict[str, str] = field(default_factory=dict)
    # Alertmanager receivers by route ("page", "ticket"): Alertmanager's own receiver bodies
    # (webhook_configs, slack_configs, pagerduty_configs, ...). Empty: webhook placeholders.
    receivers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # How many tenants the top-N panels show.
    top_tenants: int = 10

    # --- derived --------------------------------------------------------------------------------
    @property
    def job_selector(self) -> str:
        """The label matcher that selects the sidecars' scrape job: job="headroom-sidecar"."""
        return self.job_selector_override or f'job="{self.sidecar_job}"'

    @property
    def cluster_by(self) -> str:
        """The label every aggregation keeps: `cluster_label`, or none when `extra_labels` pins it.

        extra_labels {"cluster": "prod-eu"} says these rules run at the edge of one cluster, where
        its series carry no such label; keeping it there would only split ALERTS from its rules.
        """
        return "" if self.cluster_label in self.extra_labels else self.cluster_label

    @property
    def keeps_firing(self) -> dict[str, str]:
        """`keep_firing_for` per alert as the ruler takes it: none for vmalert, which refuses the field."""
        return {} if self.ruler == "vmalert" else self.keep_firing_for

    @property
    def default_slo(self) -> Slo:
        """The SLO of every model without an entry in `model_slos`."""
        return Slo(
            self.ttft_slo_seconds,
            self.ttft_slo_objective,
            self.e2e_slo_seconds,
            self.e2e_slo_objective,
            self.availability_objective,
            self.goodput_objective,
        )

    def slo_for(self, model: str) -> Slo:
        """The SLO of `model`: its own entry, else the default."""
        return self.model_slos.get(model, self.default_slo)

    @property
    def error_budget(self) -> float:
        """The default model's TTFT error budget: 1 - objective (dashboards draw its lines)."""
        return self.default_slo.budget("ttft")

    def for_duration(self, alert: str) -> str:
        """The `for:` of `alert`; KeyError names the alert missing from `for_durations`."""
        try:
            return self.for_durations[alert]
        except KeyError:
            raise KeyError(
                f"no for: duration for alert {alert!r}; add it to RulesConfig.for_durations"
            ) from None

    # --- validation -----------------------------------------------------------------------------
    def validate(self) -> RulesConfig:
        """Raise ConfigError when a value cannot give correct rules; return self otherwise."""
        for name, slo in [("default", self.default_slo), *sorted(self.model_slos.items())]:
            _check_slo(name, slo)
        if not 0 < self.kv_warning_clear_ratio < self.kv_warning_ratio <= self.kv_critical_ratio <= 1:
            raise ConfigError(
                f"KV-cache ratios must rise: kv_warning_clear_ratio ({self.kv_warning_clear_ratio}) < "
                f"kv_warning_ratio ({self.kv_warning_ratio}) <= kv_critical_ratio "
                f"({self.kv_critical_ratio}) <= 1"
            )
        for table in (
            self.for_durations,
            self.keep_firing_for,
            {
                "knee_forecast_window": self.knee_forecast_window,
                "knee_forecast_horizon": self.knee_forecast_horizon,
                "knee_forecast_step": self.knee_forecast_step,
                "estimate_max_age": self.estimate_max_age,
                "queue_window": self.queue_window,
                "absence_lookback": self.absence_lookback,
            },
        ):
            for key, value in table.items():
                if not _DURATION.match(str(value)):
                    raise ConfigError(f"{key}: {value!r} is not a Prometheus duration (e.g. 30s, 5m, 1h)")
        for name in self.extra_labels:
            if not _LABEL_NAME.match(name) or name in ("severity", "alertname"):
                raise ConfigError(
                    f"extra_labels: {name!r} is not a usable label name (letters, digits, _; "
                    "not severity or alertname)"
                )
        if self.cluster_label and (
            not _LABEL_NAME.match(self.cluster_label) or self.cluster_label in _RESERVED_LABELS
        ):
            raise ConfigError(
                f"cluster_label: {self.cluster_label!r} is not a usable label name (letters, digits, _; "
                f"not one of {', '.join(sorted(_RESERVED_LABELS))}); empty means one cluster"
            )
        if self.ruler not in RULERS:
            raise ConfigError(f"ruler: {self.ruler!r} is not one of {', '.join(RULERS)}")
        if self.fleet_min_replicas < 1:
            raise ConfigError(f"fleet_min_replicas={self.fleet_min_replicas} must be 1 or more")
        if self.slo_min_requests < 0:
            raise ConfigError(f"slo_min_requests={self.slo_min_requests} must be 0 or more")
        if self.stuck_request_floor_seconds <= 0 or self.stuck_request_p99_multiple < 1:
            raise ConfigError(
                f"stuck_request_floor_seconds={self.stuck_request_floor_seconds} must be positive and "
                f"stuck_request_p99_multiple={self.stuck_request_p99_multiple} at least 1 (e.g. 120 and 4)"
            )
        return self


def seconds(duration: str) -> int:
    """Whole seconds of a simple Prometheus duration: seconds("1h") -> 3600."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return int(duration[:-1]) * units[duration[-1]]


def _check_slo(name: str, slo: Slo) -> None:
    if slo.ttft_seconds is not None and slo.ttft_seconds not in TTFT_BUCKETS_SECONDS:
        raise ConfigError(
            f"SLO of {name}: ttft_seconds={slo.ttft_seconds} is not a TTFT histogram bucket; pick "
            f"one of {TTFT_BUCKETS_SECONDS} so the SLI reads an exact bucket"
        )
    if slo.e2e_seconds is not None and slo.e2e_seconds not in DURATION_BUCKETS_SECONDS:
        raise ConfigError(
            f"SLO of {name}: e2e_seconds={slo.e2e_seconds} is not a duration histogram bucket; "
            f"pick one of {DURATION_BUCKETS_SECONDS}"
        )
    for field_name in ("ttft_objective", "e2e_objective", "availability_objective", "goodput_objective"):
        value = getattr(slo, field_name)
        if not 0 < value < 1:
            raise ConfigError(f"SLO of {name}: {field_name}={value} must be between 0 and 1 (e.g. 0.99)")


DEFAULT = RulesConfig()
