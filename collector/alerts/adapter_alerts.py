"""LoRA adapter thrash: more distinct adapters in flight than the engine's slots, while TTFT rises.

Adapters share one engine's `max_loras` slots; past them, requests of the adapters left out wait
for a slot and every swap reloads weights, so capacity falls off a cliff, not a slope (SGLang, 16
adapters over 8 slots: median TTFT 39.65 ms -> 6,278 ms). HeadroomAdapterThrash warns when, on a
sidecar, the 5-minute mean of the distinct adapters in flight (headroom_adapters_inflight, from
the live set: queued and running) exceeds headroom_adapter_slots and the model's mean TTFT there
is more than `adapter_ttft_rise_ratio` times what it was `adapter_ttft_baseline` ago. Many
adapters with TTFT flat (the swaps are cheap) or TTFT rising within the slots (another cause)
stay quiet; probe load is left out.
"""

from __future__ import annotations

from collector.alerts.alert import Alert, number
from collector.rules.config import RulesConfig
from collector.rules.naming import sample

__all__ = ["adapter_alerts"]


def _mean_ttft(offset: str = "") -> str:
    total, count = (sample("headroom_time_to_first_token_seconds", part) for part in ("sum", "count"))
    window = f'{{source!="probe"}}[5m]{" offset " + offset if offset else ""}'
    return (
        f"sum by (instance, model) (rate({total}{window}))\n"
        f"  / sum by (instance, model) (rate({count}{window}))"
    )


def adapter_alerts(c: RulesConfig) -> list[Alert]:
    """HeadroomAdapterThrash (warning)."""
    distinct, slots = sample("headroom_adapters_inflight"), sample("headroom_adapter_slots")
    ratio = number(c.adapter_ttft_rise_ratio)
    return [
        Alert(
            "HeadroomAdapterThrash",
            "headroom-adapters",
            f"avg_over_time({distinct}[5m])\n> on (instance, model) max by (instance, model) ({slots})\n"
            f"and on (instance, model)\n(\n  {_mean_ttft()}\n"
            f"> {ratio} * {_mean_ttft(c.adapter_ttft_baseline)}\n)",
            "warning",
            "LoRA adapters of <model> are thrashing on <instance>",
            f"<value:humanize> distinct adapters of <model> are in flight on <instance> on average, more "
            f"than the engine's adapter slots, and mean TTFT is over {c.adapter_ttft_rise_ratio:g}x what "
            f"it was {c.adapter_ttft_baseline} ago: adapters wait for a slot and are swapped in and out. "
            f"Route adapters to fewer replicas each, or raise --max-loras.",
            {"component": "adapters"},
        )
    ]
