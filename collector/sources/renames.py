"""Known renames of engine metrics, as data: the parsers read every name, the integrity check says which.

An engine that renames a metric blinds whatever reads the old name (AIBrix's autoscaler after
vLLM's KV-usage rename, aibrix PR #2057). Each rename the sidecar knows is one entry here; the
engine's rule reads the current name first, then the older ones (`names`), and
headroom_signal_valid{reason="renamed"} says when a signal was read under an older name.

    >>> names("vllm:kv_cache_usage_perc")
    ('vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc')
    >>> renamed("vllm:gpu_cache_usage_perc").new
    'vllm:kv_cache_usage_perc'
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Rename", "KNOWN_RENAMES", "names", "renamed"]


@dataclass(frozen=True)
class Rename:
    """One metric an engine renamed: the signal it feeds, the old and new sample names, and when."""

    engine: str
    signal: str  # headroom_signal_valid's `signal`: running, waiting, kv_usage, kv_capacity
    old: str
    new: str
    when: str  # the engine versions, for docs/engines.md


KNOWN_RENAMES: tuple[Rename, ...] = (
    Rename(
        "vllm",
        "kv_usage",
        "vllm:gpu_cache_usage_perc",
        "vllm:kv_cache_usage_perc",
        "V1 engine: 0.6 exports the old name, 0.11 the new (both 0-1)",
    ),
)


def names(current: str) -> tuple[str, ...]:
    """`current` and every older name known for it, newest first: a FieldRule's `names`."""
    older = [rename.old for rename in KNOWN_RENAMES if rename.new == current]
    return (current, *older)


def renamed(name: str) -> Rename | None:
    """The rename whose old name is `name`, None when `name` is current (or unknown)."""
    return next((rename for rename in KNOWN_RENAMES if rename.old == name), None)
