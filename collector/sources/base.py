"""What every engine source shares: the normalised snapshot and the rules that fill it.

An engine's `/metrics` page is parsed with prometheus_client's text parser into samples keyed by
sample name; a `FieldRule` then says which of those samples feed one normalised field (running,
waiting, KV usage, KV capacity) and how label sets are combined. Engine modules are mostly a table
of rules; the generic source builds the same table from YAML.

    >>> samples = parse_exposition('vllm:num_requests_running{model_name="m",engine="0"} 3\\n')
    >>> FieldRule(("vllm:num_requests_running",)).apply(samples)
    3.0
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "EngineSnapshot",
    "ExpositionError",
    "FieldRule",
    "Samples",
    "names_of",
    "parse_exposition",
    "snapshot_from_rules",
]

# sample name -> list of (labels, value), one entry per label set
Samples = dict[str, list[tuple[dict[str, str], float]]]


class ExpositionError(ValueError):
    """The engine's page could not be read as this engine's metrics."""


@dataclass(frozen=True)
class EngineSnapshot:
    """One poll of an engine, normalised; None means the engine did not say."""

    engine: str
    up: bool
    model: str | None = None
    running: int | None = None
    waiting: int | None = None
    kv_usage_ratio: float | None = None
    kv_capacity_tokens: int | None = None
    max_concurrency: int | None = None  # the engine's own ceiling: slots, or KV at max context
    adapter_slots: int | None = None  # LoRA adapters one batch can hold (vLLM max_lora, SGLang slots)
    # The engine's own saturation counters, cumulative as it counts them (vLLM only, so far)
    preemptions_total: float | None = None
    prefix_cache_queries_total: float | None = None  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_total: float | None = None  # of those, tokens found cached
    polled_at: float = field(default_factory=time.time)  # POSIX s; EngineSource: when the poll was sent
    error: str | None = None
    # (signal, sample name) each signal was read from: ("kv_usage", "vllm:gpu_cache_usage_perc")
    read_from: tuple[tuple[str, str], ...] = ()

    @classmethod
    def down(cls, engine: str, error: str) -> EngineSnapshot:
        """A snapshot for a failed poll: nothing is known, so every value is None."""
        return cls(engine=engine, up=False, error=error)

    def with_engine(self, engine: str) -> EngineSnapshot:
        """The same snapshot under another engine label (used by `auto`)."""
        return replace(self, engine=engine)


def _sample_name(line: str) -> str:
    """'vllm:x{a="b"} 1' -> 'vllm:x'; comments and blank lines -> ''."""
    if not line or line[0] == "#":
        return ""
    head = line.split("{", 1)[0].split(None, 1)
    return head[0] if head else ""


def parse_exposition(text: str, only: frozenset[str] | None = None) -> Samples:
    """Parse Prometheus text format into samples by name; raises ExpositionError on garbage.

    With `only`, lines of other samples (and all comments) are dropped before parsing: an
    engine's page is mostly histograms we do not read, and this makes a 130 kB vLLM page parse
    in ~1 ms instead of ~40 ms. The library still parses every line that is kept.
    """
    if only is not None:
        text = "".join(line + "\n" for line in text.splitlines() if _sample_name(line) in only)
    samples: Samples = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[sample.name].append((dict(sample.labels), float(sample.value)))
    except (ValueError, IndexError, TypeError) as exc:
        raise ExpositionError(f"not Prometheus text format: {exc}") from None
    return dict(samples)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


_AGGREGATES: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "max": max,
    "min": min,
    "mean": _mean,
}


@dataclass(frozen=True)
class FieldRule:
    """Which samples feed one field: the first name present wins, label sets are aggregated.

    `labels` keeps only label sets that match all given pairs; `scale` multiplies the result
    (e.g. 0.01 for an engine that reports percent).
    """

    names: tuple[str, ...]
    labels: tuple[tuple[str, str], ...] = ()
    aggregate: str = "sum"
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.aggregate not in _AGGREGATES:
            raise ValueError(f"aggregate {self.aggregate!r} is not one of {sorted(_AGGREGATES)}")

    def matching(self, samples: Samples) -> list[tuple[dict[str, str], float]]:
        """The label sets of the first listed name that has any matching sample."""
        for name in self.names:
            rows = [
                (labels, value)
                for labels, value in samples.get(name, ())
                if all(labels.get(key) == want for key, want in self.labels)
            ]
            if rows:
                return rows
        return []

    def source_name(self, samples: Samples) -> str | None:
        """The listed name `matching` reads (the first present), None when none is."""
        for name in self.names:
            if any(
                all(labels.get(key) == want for key, want in self.labels)
                for labels, _ in samples.get(name, ())
            ):
                return name
        return None

    def apply(self, samples: Samples) -> float | None:
        """The aggregated, scaled value, or None when no listed sample is present."""
        values = [value for _, value in self.matching(samples) if value == value]  # drop NaN
        if not values:
            return None
        return _AGGREGATES[self.aggregate](values) * self.scale


def names_of(rules: dict[str, FieldRule], *extra: str) -> frozenset[str]:
    """Every sample name the rules (and `extra`) read: the `only` set for parse_exposition."""
    return frozenset(name for rule in rules.values() for name in rule.names) | frozenset(extra)


def _as_int(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def model_from(samples: Samples, rules: list[FieldRule], label: str | None) -> str | None:
    """The model name from `label` on the first rule's samples (sorted, first), else None."""
    if not label:
        return None
    for rule in rules:
        models = sorted({labels[label] for labels, _ in rule.matching(samples) if labels.get(label)})
        if models:
            return models[0]
    return None


def snapshot_from_rules(
    engine: str,
    samples: Samples,
    *,
    running: FieldRule | None = None,
    waiting: FieldRule | None = None,
    kv_usage: FieldRule | None = None,
    kv_capacity: FieldRule | None = None,
    model_label: str | None = None,
) -> EngineSnapshot:
    """Apply the rules; raises ExpositionError when none of them matched anything.

    A page with none of the engine's metrics is most often the wrong URL (or another engine),
    and reporting it as "up with no data" would hide that.
    """
    rules = [rule for rule in (running, waiting, kv_usage, kv_capacity) if rule is not None]
    values = [rule.apply(samples) if rule else None for rule in (running, waiting, kv_usage, kv_capacity)]
    if all(value is None for value in values):
        wanted = ", ".join(name for rule in rules for name in rule.names)
        raise ExpositionError(
            f"none of the {engine} metrics ({wanted}) are on this page; "
            f"check --engine and --engine-metrics-url"
        )
    signals = (
        ("running", running),
        ("waiting", waiting),
        ("kv_usage", kv_usage),
        ("kv_capacity", kv_capacity),
    )
    read_from = tuple(
        (signal, name)
        for signal, rule in signals
        if rule is not None and (name := rule.source_name(samples)) is not None
    )
    return EngineSnapshot(
        engine=engine,
        up=True,
        model=model_from(samples, rules, model_label),
        running=_as_int(values[0]),
        waiting=_as_int(values[1]),
        kv_usage_ratio=values[2],
        kv_capacity_tokens=_as_int(values[3]),
        read_from=read_from,
    )
