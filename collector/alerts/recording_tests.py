"""promtool checks of the recording rules: worked inputs with the values a person computes by hand.

TTFT buckets per minute: 40 under 0.5 s, 40 more under 1 s, 16 more under 2 s, 4 slower.
  p50 = 0.5 + 0.5 * (50 - 40) / 40 = 0.625;  p95 = 1 + (95 - 80) / 16 = 1.9375;
  p99 falls in the +Inf bucket -> the highest finite bound, 2;  SLO misses (> 2 s) = 4 %.
Concurrency: tenants of 3 and 5 requests -> 8 in flight; a knee of 10 -> knee ratio 0.8.
"""

from __future__ import annotations

from collector.rules.records import R

__all__ = ["RECORDING_TEST_GROUPS"]

_BUCKET = 'headroom_time_to_first_token_seconds_bucket{instance="a",model="m",le="%s"}'
_PER_TENANT = '{instance="a",model="m",tenant="%s"}'
_KNEE = 'headroom_capacity_knee{instance="a",model="m",caliber="%s"}'


def _series(name: str, values: str) -> dict:
    return {"series": name, "values": values}


def _expect(expr: str, *samples: tuple[dict, float]) -> dict:
    """Check `expr` at 10m, rounded to 1e-4 so float noise in rate() does not hide the hand value."""
    return {
        "eval_time": "10m",
        "expr": f"round({expr}, 0.0001)",
        "exp_samples": [{"labels": _labels(labels), "value": value} for labels, value in samples],
    }


def _labels(labels: dict) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


_INPUTS = [
    _series(_BUCKET % "0.5", "0+40x10"),
    _series(_BUCKET % "1.0", "0+80x10"),
    _series(_BUCKET % "2.0", "0+96x10"),
    _series(_BUCKET % "+Inf", "0+100x10"),
    _series('headroom_time_to_first_token_seconds_count{instance="a",model="m"}', "0+100x10"),
    _series("headroom_inflight_requests" + _PER_TENANT % "t1", "3+0x10"),
    _series("headroom_inflight_requests" + _PER_TENANT % "t2", "5+0x10"),
    _series("headroom_active_tokens" + _PER_TENANT % "t1", "300+0x10"),
    _series("headroom_active_tokens" + _PER_TENANT % "t2", "700+0x10"),
    _series(_KNEE % "requests", "10+0x10"),
    _series('headroom_requests_total{instance="a",model="m",tenant="t1",outcome="ok"}', "0+60x10"),
]

_M, _I = {"model": "m"}, {"instance": "a", "model": "m"}

RECORDING_TEST_GROUPS = [
    {
        "name": "recording rules: quantiles, SLO misses, calibers, knee ratio, 429 ratio default",
        "interval": "1m",
        "input_series": _INPUTS,
        "promql_expr_test": [
            _expect(f'{R.TTFT_QUANTILE}{{quantile="0.5"}}', (_M | {"quantile": "0.5"}, 0.625)),
            _expect(f'{R.TTFT_QUANTILE}{{quantile="0.95"}}', (_M | {"quantile": "0.95"}, 1.9375)),
            _expect(f'{R.TTFT_QUANTILE}{{quantile="0.99"}}', (_M | {"quantile": "0.99"}, 2)),
            _expect(R.slo_misses("5m"), (_M, 0.04)),
            _expect(R.CONCURRENCY, (_I | {"caliber": "requests"}, 8), (_I | {"caliber": "tokens"}, 1000)),
            # No tokens-caliber knee: that caliber has no ratio (alerts on it stay silent).
            _expect(R.KNEE_RATIO, (_I | {"caliber": "requests"}, 0.8)),
            _expect(R.RATE_LIMITED_RATIO, (_M, 0)),
            _expect(R.REQUESTS_RATE, (_M, 1)),
        ],
    }
]
