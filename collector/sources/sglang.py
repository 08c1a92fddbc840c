"""SGLang: normalise `sglang:*` metrics.

`sglang:token_usage` is the KV pool usage 0-1 and `sglang:max_total_num_tokens` the pool's size in
tokens. Data-parallel ranks export one label set each: counts and capacity are summed, usage takes
the fullest rank. With LoRA enabled, `sglang:lora_pool_slots_total` is the adapter slots
(`--max-loras-per-batch`, the same on every rank) and `sglang:lora_pool_slots_used` the distinct
adapters of the running batch.
"""

from __future__ import annotations

from dataclasses import replace

from collector.sources.base import (
    EngineSnapshot,
    FieldRule,
    Samples,
    names_of,
    parse_exposition,
    snapshot_from_rules,
)

__all__ = ["ENGINE", "RULES", "parse_sglang", "adapter_slots"]

ENGINE = "sglang"
RULES = {
    "running": FieldRule(("sglang:num_running_reqs",)),
    "waiting": FieldRule(("sglang:num_queue_reqs",)),
    "kv_usage": FieldRule(("sglang:token_usage",), aggregate="max"),
    "kv_capacity": FieldRule(("sglang:max_total_num_tokens",)),
}
ADAPTER_SLOTS = FieldRule(("sglang:lora_pool_slots_total",), aggregate="max")
NAMES = names_of(RULES, *ADAPTER_SLOTS.names)


def adapter_slots(samples: Samples) -> int | None:
    """`sglang:lora_pool_slots_total` (the largest over ranks); None without LoRA."""
    value = ADAPTER_SLOTS.apply(samples)
    return None if value is None else int(round(value))


def parse_sglang(text: str) -> EngineSnapshot:
    """Parse an SGLang /metrics page into an EngineSnapshot."""
    samples = parse_exposition(text, NAMES)
    snapshot = snapshot_from_rules(ENGINE, samples, model_label="model_name", **RULES)
    return replace(snapshot, adapter_slots=adapter_slots(samples))
