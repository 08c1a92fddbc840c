"""Generic source: any engine with a Prometheus `/metrics`, mapped by a small YAML file.

    engine: acme                 # value of the `engine` label
    model_label: model           # optional: the label that holds the model name
    running: acme_batch_size     # a sample name ...
    waiting: [acme_queue_depth, acme_pending]   # ... or a list: the first one present wins
    kv_usage_ratio:              # ... or a rule
      metric: acme_kv_used_percent
      scale: 0.01                # percent -> 0-1
      aggregate: max             # across label sets: sum (default), max, min, mean
    kv_capacity_tokens:
      metric: acme_kv_tokens
      labels: {kind: capacity}   # keep only label sets with these values

Every field is optional, but at least one must be given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from collector.sources.base import EngineSnapshot, FieldRule, names_of, parse_exposition, snapshot_from_rules

__all__ = ["GenericMapping", "MappingError", "load_mapping", "mapping_from_dict", "parse_generic"]

_FIELDS = {
    "running": "running",
    "waiting": "waiting",
    "kv_usage_ratio": "kv_usage",
    "kv_capacity_tokens": "kv_capacity",
}
_RULE_KEYS = {"metric", "labels", "scale", "aggregate"}


class MappingError(ValueError):
    """A generic-engine mapping file is not usable; the message says which key and why."""


@dataclass(frozen=True)
class GenericMapping:
    """A parsed mapping: the engine label, optional model label, and one rule per field."""

    engine: str
    rules: dict[str, FieldRule]
    model_label: str | None = None


def _names(value: object, where: str) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else value
    if (
        not isinstance(names, (list, tuple))
        or not names
        or not all(isinstance(name, str) and name for name in names)
    ):
        raise MappingError(f"{where}: give a metric name or a list of names, got {value!r}")
    return tuple(names)


def _rule(value: object, where: str) -> FieldRule:
    if not isinstance(value, dict):
        return FieldRule(_names(value, where))
    unknown = set(value) - _RULE_KEYS
    if unknown:
        raise MappingError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_RULE_KEYS)}")
    labels = value.get("labels") or {}
    if not isinstance(labels, dict):
        raise MappingError(f"{where}.labels: give a mapping of label: value, got {labels!r}")
    try:
        return FieldRule(
            _names(value.get("metric"), f"{where}.metric"),
            labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
            aggregate=value.get("aggregate", "sum"),
            scale=float(value.get("scale", 1.0)),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, MappingError):
            raise
        raise MappingError(f"{where}: {exc}") from None


def mapping_from_dict(data: object, origin: str = "mapping") -> GenericMapping:
    """Validate a mapping already loaded from YAML; raises MappingError naming the bad key."""
    if not isinstance(data, dict):
        raise MappingError(f"{origin}: expected a YAML mapping with keys engine, running, ...")
    unknown = set(data) - set(_FIELDS) - {"engine", "model_label"}
    if unknown:
        raise MappingError(
            f"{origin}: unknown keys {sorted(unknown)}; allowed: engine, model_label, {', '.join(_FIELDS)}"
        )
    engine = data.get("engine")
    if not isinstance(engine, str) or not engine:
        raise MappingError(f"{origin}: 'engine' must name the engine (used as the engine label)")
    rules = {
        target: _rule(data[key], f"{origin}: {key}")
        for key, target in _FIELDS.items()
        if data.get(key) is not None
    }
    if not rules:
        raise MappingError(f"{origin}: map at least one of {', '.join(_FIELDS)}")
    return GenericMapping(engine, rules, data.get("model_label"))


def load_mapping(path: str | Path) -> GenericMapping:
    """Read and validate a YAML mapping file."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise MappingError(f"cannot read engine mapping {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise MappingError(f"engine mapping {path} is not valid YAML: {exc}") from None
    return mapping_from_dict(data, origin=str(path))


def parse_generic(text: str, mapping: GenericMapping) -> EngineSnapshot:
    """Parse any /metrics page with a mapping into an EngineSnapshot."""
    return snapshot_from_rules(
        mapping.engine,
        parse_exposition(text, names_of(mapping.rules)),
        model_label=mapping.model_label,
        **mapping.rules,
    )
