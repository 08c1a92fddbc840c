"""The YAML file behind `headroom alerts generate --config FILE`: tuning without editing code.

Every key is optional; what a file leaves out keeps its default from collector.rules.config
(docs/rules.md, "Configuration file", shows a whole file). Sections:

    sidecar_job, job_selector, runbook_base_url, cluster_label, ruler, extra_labels   wiring
    slo             the default SLO (ttft_seconds, ttft_objective, e2e_seconds, e2e_objective,
                    availability_objective, goodput_objective) and min_requests
    models          per-model SLOs, each key of `slo` optional (null switches one off)
    thresholds      any other tunable of RulesConfig by its field name
    for, keep_firing_for   per alert name
    receivers       Alertmanager receiver bodies for the `page` and `ticket` routes

    load_config(Path("alerts.yaml"))  ->  RulesConfig(sidecar_job="llm-sidecar", model_slos={...}, ...)

Errors name the file, the key and what would be accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from collector.rules.config import DEFAULT, FOR_DURATIONS, ConfigError, RulesConfig, Slo

__all__ = ["load_config", "config_from_dict", "THRESHOLD_KEYS", "TOP_LEVEL_KEYS"]

_SLO_KEYS = {
    "ttft_seconds": "ttft_slo_seconds",
    "ttft_objective": "ttft_slo_objective",
    "e2e_seconds": "e2e_slo_seconds",
    "e2e_objective": "e2e_slo_objective",
    "availability_objective": "availability_objective",
    "goodput_objective": "goodput_objective",
    "min_requests": "slo_min_requests",
}
_WIRING = {
    "sidecar_job": "sidecar_job",
    "job_selector": "job_selector_override",
    "runbook_base_url": "runbook_base_url",
    "cluster_label": "cluster_label",
    "ruler": "ruler",
}
_NOT_THRESHOLDS = (
    set(_SLO_KEYS.values())
    | set(_WIRING.values())
    | {"model_slos", "for_durations", "keep_firing_for", "extra_labels", "receivers"}
)
THRESHOLD_KEYS = tuple(f.name for f in dataclasses.fields(RulesConfig) if f.name not in _NOT_THRESHOLDS)
TOP_LEVEL_KEYS = tuple(_WIRING) + (
    "extra_labels",
    "slo",
    "models",
    "thresholds",
    "for",
    "keep_firing_for",
    "receivers",
)
_ROUTES = ("page", "ticket")


def _mapping(value: Any, where: str) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping of keys to values, not {type(value).__name__}")
    return value


def _unknown(keys: Iterable[Any], allowed: Iterable[str], where: str) -> None:
    wrong = sorted(set(keys) - set(allowed))
    if wrong:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(str, wrong))}; expected one of {', '.join(allowed)}"
        )


def _typed(name: str, value: Any, where: str) -> Any:
    """`value` as the type of RulesConfig field `name` (an int is a fine float; None only where allowed)."""
    default = getattr(DEFAULT, name) if hasattr(DEFAULT, name) else None
    if value is None:
        if name in ("e2e_slo_seconds", "job_selector_override"):
            return None
        hint = " (switch the TTFT SLO off per model under `models:`)" if name == "ttft_slo_seconds" else ""
        raise ConfigError(f"{where}: {name} cannot be null{hint}")
    if isinstance(default, bool) or isinstance(value, bool):
        raise ConfigError(f"{where}: {name}={value!r} must be a number or a string, not a boolean")
    if isinstance(default, float) or name in ("ttft_slo_seconds", "e2e_slo_seconds"):
        if not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {name}={value!r} must be a number")
        return float(value)
    if isinstance(default, int):
        if not isinstance(value, int):
            raise ConfigError(f"{where}: {name}={value!r} must be a whole number")
        return value
    return str(value)


def _slo(data: dict[str, Any], base: Slo, where: str) -> Slo:
    fields = {
        "ttft_seconds",
        "ttft_objective",
        "e2e_seconds",
        "e2e_objective",
        "availability_objective",
        "goodput_objective",
    }
    _unknown(data, sorted(fields), where)
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if value is None and key.endswith("_objective"):
            raise ConfigError(f"{where}: {key} cannot be null (switch the SLO off with its *_seconds: null)")
        if value is not None and not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {key}={value!r} must be a number or null")
        changes[key] = None if value is None else float(value)
    return dataclasses.replace(base, **changes)


def _durations(data: dict[str, Any], where: str) -> dict[str, str]:
    _unknown(data, sorted(FOR_DURATIONS), where)
    return {name: str(value) for name, value in data.items()}


def _receivers(data: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    _unknown(data, _ROUTES, where)
    for route, body in data.items():
        if not isinstance(body, dict) or not any(key.endswith("_configs") for key in body):
            raise ConfigError(
                f"{where}.{route} must be an Alertmanager receiver body such as "
                "{slack_configs: [...]} or {pagerduty_configs: [...]}"
            )
    return {route: dict(body) for route, body in data.items()}


def config_from_dict(data: dict[str, Any], base: RulesConfig = DEFAULT, where: str = "config") -> RulesConfig:
    """A RulesConfig from the parsed YAML `data` over `base`; ConfigError names the bad key."""
    data = _mapping(data, where)
    _unknown(data, TOP_LEVEL_KEYS, where)
    changes: dict[str, Any] = {}
    for key, name in _WIRING.items():
        if key in data:
            changes[name] = _typed(name, data[key], where)
    slo = _mapping(data.get("slo"), f"{where}: slo")
    _unknown(slo, sorted(_SLO_KEYS), f"{where}: slo")
    changes |= {_SLO_KEYS[key]: _typed(_SLO_KEYS[key], value, f"{where}: slo") for key, value in slo.items()}
    thresholds = _mapping(data.get("thresholds"), f"{where}: thresholds")
    _unknown(thresholds, THRESHOLD_KEYS, f"{where}: thresholds")
    changes |= {key: _typed(key, value, f"{where}: thresholds") for key, value in thresholds.items()}
    config = dataclasses.replace(base, **changes)
    models = _mapping(data.get("models"), f"{where}: models")
    model_slos = {
        str(model): _slo(
            _mapping(body, f"{where}: models.{model}"), config.default_slo, f"{where}: models.{model}"
        )
        for model, body in models.items()
    }
    labels = _mapping(data.get("extra_labels"), f"{where}: extra_labels")
    config = dataclasses.replace(
        config,
        model_slos=base.model_slos | model_slos,
        extra_labels=base.extra_labels | {str(k): str(v) for k, v in labels.items()},
        for_durations=base.for_durations
        | _durations(_mapping(data.get("for"), f"{where}: for"), f"{where}: for"),
        keep_firing_for=base.keep_firing_for
        | _durations(
            _mapping(data.get("keep_firing_for"), f"{where}: keep_firing_for"), f"{where}: keep_firing_for"
        ),
        receivers=base.receivers
        | _receivers(_mapping(data.get("receivers"), f"{where}: receivers"), f"{where}: receivers"),
    )
    try:
        return config.validate()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_config(path: Path, base: RulesConfig = DEFAULT) -> RulesConfig:
    """Read the YAML file at `path` over `base`; ConfigError names the file and what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read --config {path} ({exc.strerror}); pass a readable YAML file"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    return config_from_dict(data if data is not None else {}, base, where=str(path))
