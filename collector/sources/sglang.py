"""SGLang: normalise `sglang:*` metrics.

`sglang:token_usage` is the KV pool usage 0-1 and `sglang:max_total_num_tokens` the pool's size in
tokens. Data-parallel ranks export one label set each: counts and capacity are summed, usage takes
the fullest rank.
"""

from __future__ import annotations

from collector.sources.base import EngineSnapshot, FieldRule, names_of, parse_exposition, snapshot_from_rules

__all__ = ["ENGINE", "RULES", "parse_sglang"]

ENGINE = "sglang"
RULES = {
    "running": FieldRule(("sglang:num_running_reqs",)),
    "waiting": FieldRule(("sglang:num_queue_reqs",)),
    "kv_usage": FieldRule(("sglang:token_usage",), aggregate="max"),
    "kv_capacity": FieldRule(("sglang:max_total_num_tokens",)),
}
NAMES = names_of(RULES)


def parse_sglang(text: str) -> EngineSnapshot:
    """Parse an SGLang /metrics page into an EngineSnapshot."""
    return snapshot_from_rules(ENGINE, parse_exposition(text, NAMES), model_label="model_name", **RULES)
