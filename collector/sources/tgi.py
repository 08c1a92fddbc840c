"""Text Generation Inference (TGI): normalise `tgi_*` metrics.

TGI exports no KV-cache usage, so that field stays None (unknown, not zero). The router's token
budget `tgi_batch_max_total_tokens` (set at warm-up from the KV memory) is the capacity. TGI labels
carry no model name.
"""

from __future__ import annotations

from collector.sources.base import EngineSnapshot, FieldRule, names_of, parse_exposition, snapshot_from_rules

__all__ = ["ENGINE", "RULES", "parse_tgi"]

ENGINE = "tgi"
RULES = {
    "running": FieldRule(("tgi_batch_current_size",)),
    "waiting": FieldRule(("tgi_queue_size",)),
    "kv_capacity": FieldRule(("tgi_batch_max_total_tokens",)),
}
NAMES = names_of(RULES)


def parse_tgi(text: str) -> EngineSnapshot:
    """Parse a TGI /metrics page into an EngineSnapshot."""
    return snapshot_from_rules(ENGINE, parse_exposition(text, NAMES), model_label=None, **RULES)
