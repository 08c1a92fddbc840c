"""The overview's LoRA adapter panel: distinct adapters in flight against the adapter slots.

An engine runs at most its adapter slots' adapters in one batch (vLLM --max-loras, SGLang
--max-loras-per-batch); past them, requests of the other adapters wait for a slot and every swap
loads weights (docs/engines.md, "LoRA adapters"). The panel sets each selected sidecar's distinct
adapters in flight (from its live set: queued and running) beside its engine's slots, and below,
the requests in flight per adapter, summed over the sidecars:

    A  max by (instance, model) (headroom_adapters_inflight{...})
    B  max by (instance, model) (headroom_adapter_slots{...})
    C  sum by (model, adapter) (headroom_adapter_inflight_requests{...})

HeadroomAdapterThrash warns when A's 5-minute mean stays over B while TTFT rises. The series
exist only for base models that have had adapter traffic: an empty panel is a fleet without LoRA.
"""

from __future__ import annotations

from typing import Any

from collector.dashboards.panels import dashed, target, timeseries
from collector.dashboards.queries import sel
from collector.rules.naming import sample

__all__ = ["ADAPTER_PANEL_TITLE", "adapters_panel"]

ADAPTER_PANEL_TITLE = "LoRA adapters in flight vs adapter slots"


def adapters_panel() -> dict[str, Any]:
    """Distinct adapters in flight per sidecar against its slots (dashed); in flight per adapter."""
    selector = sel("model")
    return timeseries(
        ADAPTER_PANEL_TITLE,
        "Distinct LoRA adapters among each selected sidecar's in-flight requests (queued or "
        "running), against its engine's adapter slots (dashed: --adapter-slots, else vLLM's max_lora "
        "or SGLang's lora_pool_slots_total). Above the slots, requests of the adapters left out wait "
        "for a slot and each swap loads weights: HeadroomAdapterThrash warns when that lasts while "
        "TTFT rises. The other lines are the requests in flight per adapter, summed over the "
        "sidecars: which adapters the load is. Empty: no adapter traffic.",
        [
            target(
                f"max by (instance, model) ({sample('headroom_adapters_inflight')}{selector})",
                "{{instance}} {{model}} distinct adapters in flight",
                "A",
            ),
            target(
                f"max by (instance, model) ({sample('headroom_adapter_slots')}{selector})",
                "{{instance}} {{model}} adapter slots",
                "B",
            ),
            target(
                f"sum by (model, adapter) ({sample('headroom_adapter_inflight_requests')}{selector})",
                "{{model}} {{adapter}} requests in flight",
                "C",
            ),
        ],
        "short",
        axis_label="adapters / requests",
        overrides=dashed("B"),
    )
