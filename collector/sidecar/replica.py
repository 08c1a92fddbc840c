"""The replica class of this sidecar's engine, exported as `headroom_replica_info{replica_class} 1`.

A knee belongs to a replica class (model x hardware x engine configuration, docs/domain.md §14), not to a
model: the rules join each sidecar's concurrency to its own class's published knee through this
series (`* on (instance) group_left (replica_class) headroom_replica_info`), the probe through a
sidecar labels its estimate with it, and the refresh job labels its traffic estimates with it.

The class is `--replica-class` when given. Otherwise it is derived once, from what is known when
the engine first answers (at once with `--engine none`):

    the GPUs NVML names        "NVIDIA H100 80GB HBM3" x 1  -> "nvidia-h100-80gb-hbm3"
                                             the same x 2  -> "2x-nvidia-h100-80gb-hbm3"
    the engine's slots         llama.cpp /slots (--parallel), the simulator's slots
                                             16 slots on it -> "nvidia-h100-80gb-hbm3-slots16"
    neither                                                 -> "default"

Engines whose ceiling is not a slot count (vLLM's `kv_cache_max_concurrency` is the KV cache at
the longest context) add no slots part. Until the class is decided nothing is exported, and the
rules judge the sidecar against its model's `default` knee, as they do a sidecar of an older
release.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric

from collector.capacity import DEFAULT_REPLICA_CLASS
from collector.catalog import spec
from collector.store.capacity_gauges import check_replica_class

if TYPE_CHECKING:  # the config imports check_replica_class: no engine machinery for `--help`
    from collector.sources import EngineSource

__all__ = ["ReplicaClass", "derive_replica_class", "SLOT_ENGINES"]

# Engines whose `max_concurrency` is a fixed number of slots (a configuration, hence the class).
SLOT_ENGINES = frozenset({"llamacpp"})
_NOT_SLUG = re.compile(r"[^a-z0-9]+")


def _slug(text: str) -> str:
    return _NOT_SLUG.sub("-", text.lower()).strip("-")


def derive_replica_class(gpu_names: Sequence[str], slots: int | None) -> str:
    """The class from the GPU names and the engine's slot count; "default" when neither is known.

    derive_replica_class(["NVIDIA L40S"], 8) -> "nvidia-l40s-slots8"
    derive_replica_class([], 4) -> "slots4";  derive_replica_class([], None) -> "default"
    """
    parts = []
    names = sorted({_slug(name) for name in gpu_names if _slug(name)})
    if names:
        gpus = "+".join(names)
        parts.append(f"{len(gpu_names)}x-{gpus}" if len(gpu_names) > 1 else gpus)
    if slots is not None and slots > 0:
        parts.append(f"slots{slots}")
    derived = "-".join(parts)[:63].rstrip("-._") or DEFAULT_REPLICA_CLASS
    return derived


class ReplicaClass:
    """This sidecar's class: given, or derived when the engine first answers; a prometheus collector.

    `gpu_names` returns the NVML device names ([] without a GPU); `engine` is the polled engine
    source (None with --engine none).
    """

    def __init__(
        self,
        given: str | None,
        *,
        gpu_names: Callable[[], Sequence[str]] = list,
        engine: EngineSource | None = None,
    ) -> None:
        self._value = check_replica_class(given) if given else None
        self._gpu_names = gpu_names
        self._engine = engine
        self._lock = threading.Lock()

    @property
    def value(self) -> str | None:
        """The class, deciding it now if the engine has answered; None while still undecided."""
        with self._lock:
            if self._value is None:
                self._value = self._derive()
            return self._value

    def _derive(self) -> str | None:
        slots = None
        if self._engine is not None:
            latest = self._engine.latest
            if not latest.up:
                return None  # the engine has not answered yet: its slots may still come
            if latest.engine in SLOT_ENGINES:
                slots = latest.max_concurrency
        return derive_replica_class(list(self._gpu_names()), slots)

    def collect(self) -> Iterable[Metric]:
        entry = spec("headroom_replica_info")
        family = GaugeMetricFamily(entry.name, entry.help, labels=entry.labels)
        value = self.value
        if value is not None:
            family.add_metric((value,), 1.0)
        yield family
