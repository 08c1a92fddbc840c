"""A headroom sidecar's own /metrics as an engine source: the engine's figures, as it relayed them.

The probe can run through a sidecar; the sidecar already normalises its engine's running,
waiting and KV numbers into `headroom_engine_*`, so reading them back gives the probe the engine's
queue without knowing which engine sits behind. Counts are summed over label sets (one per model).
"""

from __future__ import annotations

from dataclasses import replace

from collector.sources.base import EngineSnapshot, FieldRule, names_of, parse_exposition, snapshot_from_rules

__all__ = ["ENGINE", "RULES", "parse_headroom"]

ENGINE = "headroom"
RULES = {
    "running": FieldRule(("headroom_engine_requests_running",)),
    "waiting": FieldRule(("headroom_engine_requests_waiting",)),
    "kv_usage": FieldRule(("headroom_engine_kv_cache_usage_ratio",), aggregate="max"),
    "kv_capacity": FieldRule(("headroom_engine_kv_cache_capacity_tokens",)),
}
_CEILING = FieldRule(("headroom_engine_max_concurrency_requests",))
NAMES = names_of(RULES, *_CEILING.names)


def parse_headroom(text: str) -> EngineSnapshot:
    """Parse a sidecar's /metrics page into the snapshot of the engine behind it."""
    samples = parse_exposition(text, NAMES)
    snapshot = snapshot_from_rules(ENGINE, samples, model_label="model", **RULES)
    ceiling = _CEILING.apply(samples)
    return snapshot if ceiling is None else replace(snapshot, max_concurrency=int(ceiling))
