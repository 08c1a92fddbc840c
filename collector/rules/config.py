"""Thresholds, SLOs and durations for the generated alerts and dashboards: the one place to tune them.

Each field carries a sentence on when to change it. The committed files under `alerts/` and
`dashboards/` are rendered from `DEFAULT`; a test fails when they drift. Tests that need alerts to
fire within seconds render a copy with short durations (`dataclasses.replace`), never the committed
files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collector.catalog import TTFT_BUCKETS_SECONDS

__all__ = ["RulesConfig", "DEFAULT", "ConfigError"]


class ConfigError(ValueError):
    """A threshold or SLO that cannot produce valid rules; the message names the field and the fix."""


@dataclass(frozen=True)
class RulesConfig:
    """Every tunable number behind the rules and dashboards, with a reason to change it."""

    # --- latency SLOs -------------------------------------------------------------------------
    # The p95 TTFT your front end tolerates. Change it when product changes the interactive
    # target; it must equal a TTFT histogram bucket bound so the SLI is exact.
    ttft_slo_seconds: float = 2.0
    # Fraction of requests that must meet `ttft_slo_seconds` over 30 days. Raise it only when the
    # fleet has headroom to spare: 0.99 leaves a 1 % error budget for the burn-rate alerts.
    ttft_slo_objective: float = 0.99
    # "TTFT rising" only counts above this p95: a climb from 50 ms to 80 ms is noise. Set it a
    # little above the p95 TTFT you see at low load.
    ttft_soft_bound_seconds: float = 0.5
    # p99 TTFT beyond which a few long requests are hurting everyone (tail-latency signal). Set
    # it to the worst wait an interactive user accepts before retrying.
    ttft_p99_tolerance_seconds: float = 5.0
    # TPOT line drawn on dashboards; change it with the streaming speed users accept (0.1 s per
    # token is ~10 tokens/s, about reading speed).
    tpot_slo_seconds: float = 0.1

    # --- capacity -----------------------------------------------------------------------------
    # Live concurrency / measured knee above which "near knee" warns. The production pool is
    # 70-80 % of the knee, so 0.85 means you are already past the recommended pool.
    knee_warning_ratio: float = 0.85
    # KV-cache usage that raises the warning, and the lower value it must fall below to clear
    # (hysteresis). Lower both on engines that preempt early (vLLM recompute at ~95 %).
    kv_warning_ratio: float = 0.90
    kv_warning_clear_ratio: float = 0.85
    # KV-cache usage that pages, and its clear point. Keep it below 1.0: at 100 % the engine is
    # already preempting or rejecting.
    kv_critical_ratio: float = 0.97
    kv_critical_clear_ratio: float = 0.95
    # GPU utilisation treated as saturated. 0.9 suits NVML's kernel-busy ratio; DCGM's SM activity
    # reads lower, so use ~0.8 there.
    gpu_saturated_ratio: float = 0.90
    # Tokens/s now vs `flat_lookback` ago below which throughput counts as flat. Raise it (1.1) on
    # noisy fleets where 5 % is inside normal variation.
    throughput_flat_ratio: float = 1.05
    flat_lookback: str = "30m"
    # Token-caliber divergence: active tokens grew by this factor over `divergence_window` while
    # in-flight requests moved less than `inflight_flat_tolerance`. Lower the growth factor for
    # long-context fleets where KV fills quickly.
    tokens_growth_ratio: float = 1.5
    inflight_flat_tolerance: float = 0.10
    divergence_window: str = "15m"
    # Share of requests answered 429 that warns. Zero is the goal; raise it where clients retry
    # 429s by design (batch fleets).
    rate_limited_ratio: float = 0.02

    # --- windows and `for:` durations -----------------------------------------------------------
    # Window over which the engine queue must never reach zero. Shorter windows page on bursts.
    queue_window: str = "15m"
    # Window of deriv/predict_linear for "TTFT rising"; the prediction horizon is 1 h.
    ttft_trend_window: str = "30m"
    # `for:` per alert name; a longer `for:` trades detection time for fewer false pages.
    for_durations: dict[str, str] = field(
        default_factory=lambda: {
            "HeadroomTTFTRising": "15m",
            "HeadroomQueueNotDraining": "5m",
            "HeadroomGPUSaturatedThroughputFlat": "10m",
            "HeadroomTailLatencyOverSLO": "10m",
            "HeadroomNearCapacityLimit": "2m",
            "HeadroomKVCacheNearFull": "5m",
            "HeadroomKVCacheFull": "2m",
            "HeadroomTokenCaliberDivergence": "10m",
            "HeadroomConcurrencyNearKnee": "10m",
            "HeadroomRateLimitedRatioHigh": "5m",
            "HeadroomTTFTBudgetBurnFast": "2m",
            "HeadroomTTFTBudgetBurnSlow": "15m",
            "HeadroomSidecarDown": "2m",
            "HeadroomEngineScrapeFailing": "3m",
            "HeadroomLogRowsDropped": "5m",
        }
    )

    # --- wiring -------------------------------------------------------------------------------
    # Prometheus job that scrapes the sidecars (deploy/prometheus/prometheus.yml). Change both
    # together.
    sidecar_job: str = "headroom-sidecar"
    # Where `runbook_url` points. Set it to the browsable URL of docs/runbooks.md in your fork.
    runbook_base_url: str = "docs/runbooks.md"
    # How many tenants the top-N panels show.
    top_tenants: int = 10

    def for_duration(self, alert: str) -> str:
        """The `for:` of `alert`; KeyError names the alert missing from `for_durations`."""
        try:
            return self.for_durations[alert]
        except KeyError:
            raise KeyError(
                f"no for: duration for alert {alert!r}; add it to RulesConfig.for_durations"
            ) from None

    def validate(self) -> RulesConfig:
        """Raise ConfigError when a value cannot give correct rules; return self otherwise."""
        if self.ttft_slo_seconds not in TTFT_BUCKETS_SECONDS:
            raise ConfigError(
                f"ttft_slo_seconds={self.ttft_slo_seconds} is not a TTFT histogram bucket; pick one of "
                f"{TTFT_BUCKETS_SECONDS} so the SLI reads an exact bucket"
            )
        if not 0 < self.ttft_slo_objective < 1:
            raise ConfigError(
                f"ttft_slo_objective={self.ttft_slo_objective} must be between 0 and 1 (e.g. 0.99)"
            )
        for high, low in (
            (self.kv_warning_ratio, self.kv_warning_clear_ratio),
            (self.kv_critical_ratio, self.kv_critical_clear_ratio),
        ):
            if not 0 < low < high <= 1:
                raise ConfigError(
                    f"KV-cache clear ratio {low} must be below its raise ratio {high}, both in (0, 1]"
                )
        return self

    @property
    def error_budget(self) -> float:
        """Allowed fraction of slow requests: 1 - objective, rounded to stay readable in YAML."""
        return round(1 - self.ttft_slo_objective, 9)


DEFAULT = RulesConfig()
