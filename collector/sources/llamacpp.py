"""llama.cpp server: normalise `llamacpp:*` metrics, and estimate KV use from `/slots`.

`llamacpp:requests_processing` is running, `llamacpp:requests_deferred` waiting, and the number
of slots in `/slots` (`--parallel`) is the engine's ceiling on concurrent requests. Recent servers no
longer export KV-cache usage, so it is estimated from `/slots`: tokens held by slots that are
processing (prompt + decoded so far) over the sum of the slots' `n_ctx`. Idle slots keep their last
prompt only as a reusable cache, so they count as free. Older servers that still export
`llamacpp:kv_cache_usage_ratio` are read directly. Start llama-server with `--metrics`; when
`/slots` is disabled the KV fields stay None.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from collector.sources.base import EngineSnapshot, FieldRule, names_of, parse_exposition, snapshot_from_rules

__all__ = ["ENGINE", "RULES", "parse_llamacpp", "kv_from_slots", "slots_url"]

ENGINE = "llamacpp"
RULES = {
    "running": FieldRule(("llamacpp:requests_processing",)),
    "waiting": FieldRule(("llamacpp:requests_deferred",)),
    "kv_usage": FieldRule(("llamacpp:kv_cache_usage_ratio",)),
}
NAMES = names_of(RULES)


def _slot_tokens(slot: dict[str, Any]) -> int:
    """Tokens a busy slot holds in the KV cache: n_past where given, else prompt + decoded."""
    n_past = slot.get("n_past")
    if isinstance(n_past, int):  # older servers
        return n_past
    decoded = 0
    next_token = slot.get("next_token")
    if isinstance(next_token, list) and next_token:
        decoded = int(next_token[0].get("n_decoded", 0))
    elif isinstance(next_token, dict):
        decoded = int(next_token.get("n_decoded", 0))
    return int(slot.get("n_prompt_tokens", 0)) + decoded


def _is_busy(slot: dict[str, Any]) -> bool:
    if "is_processing" in slot:
        return bool(slot["is_processing"])
    return bool(slot.get("state", 0) != 0)  # older servers: 0 = idle


def kv_from_slots(slots: object) -> tuple[float | None, int | None]:
    """(usage ratio, capacity tokens) from a `/slots` JSON list; (None, None) if it is not one.

    4 slots of n_ctx 2048, three busy with 71+36 tokens, one with 73+38 -> (432/8192, 8192)
    """
    if not isinstance(slots, list) or not slots:
        return None, None
    try:
        capacity = sum(int(slot["n_ctx"]) for slot in slots)
        in_use = sum(_slot_tokens(slot) for slot in slots if _is_busy(slot))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None, None
    if capacity <= 0:
        return None, None
    return min(in_use / capacity, 1.0), capacity


def parse_llamacpp(text: str, slots: object = None) -> EngineSnapshot:
    """Parse llama-server /metrics (and, if given, the /slots JSON) into an EngineSnapshot."""
    snapshot = snapshot_from_rules(ENGINE, parse_exposition(text, NAMES), model_label=None, **RULES)
    usage, capacity = kv_from_slots(slots)
    if capacity is None or not isinstance(slots, list):  # kv_from_slots found no list of slots
        return snapshot
    snapshot = replace(snapshot, max_concurrency=len(slots))  # one request per slot
    if snapshot.kv_usage_ratio is not None:  # the engine's own figure beats our estimate
        usage = snapshot.kv_usage_ratio
    return replace(snapshot, kv_usage_ratio=usage, kv_capacity_tokens=capacity)


def slots_url(metrics_url: str) -> str:
    """The `/slots` URL beside a `/metrics` URL: http://h:8080/metrics -> http://h:8080/slots."""
    base, _, last = metrics_url.rstrip("/").rpartition("/")
    return f"{base}/slots" if last == "metrics" else f"{metrics_url.rstrip('/')}/slots"
