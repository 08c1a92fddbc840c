"""GPU source: per-GPU utilisation, memory, memory-bandwidth utilisation and power from NVML.

NVML is initialised once and device handles, names and UUIDs are cached, so a scrape costs a few
cheap NVML reads per GPU. Having no GPU is normal: no `pynvml`, no driver, no permission or zero
devices all export `headroom_gpu_up 0` (unlabelled) and the sidecar keeps running; a failed init
is retried at most every `retry_init_s`. A field a GPU does not support is left out, not zeroed;
a GPU that fell off the bus (`GpuIsLost`) exports `headroom_gpu_up{gpu=...} 0` and the other GPUs
are unaffected.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from collector.catalog import spec
from collector.sources.health import ScrapeHealth

try:  # nvidia-ml-py; absent or broken installs must not stop the sidecar
    import pynvml
except Exception:  # pragma: no cover - depends on the machine
    pynvml = None

__all__ = ["GpuCollector", "GpuReading"]

log = logging.getLogger(__name__)

_FIELDS = (
    "headroom_gpu_utilization_ratio",
    "headroom_gpu_memory_bandwidth_utilization_ratio",
    "headroom_gpu_memory_used_bytes",
    "headroom_gpu_memory_total_bytes",
    "headroom_gpu_power_watts",
)


@dataclass(frozen=True)
class _Device:
    index: int
    handle: object
    uuid: str
    name: str

    @property
    def labels(self) -> list[str]:
        return [str(self.index), self.uuid, self.name]


@dataclass(frozen=True)
class GpuReading:
    """One GPU's values for one scrape; fields the GPU does not support are absent."""

    device: _Device
    up: bool
    values: dict[str, float]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


class GpuCollector:
    """prometheus-client custom collector for NVML GPUs (see the module docstring)."""

    def __init__(self, *, retry_init_s: float = 60.0, source: str = "gpu") -> None:
        self.retry_init_s = retry_init_s
        self.source = source
        self.unavailable_reason: str | None = None
        self._logged_reason: str | None = None  # the NVML failure already logged at INFO
        self._devices: list[_Device] | None = None
        self._next_init_at = 0.0
        self._lock = threading.Lock()
        self.last_scrape = ScrapeHealth(False, None)  # how the latest collect() went

    def _init(self) -> list[_Device] | None:
        """Initialise NVML once and cache the devices; None (with a reason) when unavailable."""
        if self._devices is not None or time.monotonic() < self._next_init_at:
            return self._devices
        self._next_init_at = time.monotonic() + self.retry_init_s
        if pynvml is None:
            self.unavailable_reason = "nvidia-ml-py (pynvml) is not installed"
            return None
        try:
            pynvml.nvmlInit()
            devices = [self._describe(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            reason = f"NVML unavailable: {exc}"
            # once at INFO (a CPU box says so on every retry, each retry_init_s); a new reason is news
            level = logging.DEBUG if reason == self._logged_reason else logging.INFO
            log.log(level, "no GPU metrics: %s (retrying every %.0f s)", reason, self.retry_init_s)
            self.unavailable_reason = self._logged_reason = reason
            return None
        if not devices:
            self.unavailable_reason = "NVML reports no GPU"
            return None
        self.unavailable_reason = None
        self._devices = devices
        return devices

    @staticmethod
    def _describe(index: int) -> _Device:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return _Device(
            index, handle, _text(pynvml.nvmlDeviceGetUUID(handle)), _text(pynvml.nvmlDeviceGetName(handle))
        )

    def names(self) -> list[str]:
        """The NVML names of the GPUs ("NVIDIA H100 80GB HBM3", ...); [] without a GPU.

        The sidecar's replica class is derived from them (collector.sidecar.replica).
        """
        with self._lock:
            devices = self._init()
        return [device.name for device in devices or ()]

    def read(self) -> list[GpuReading] | None:
        """Read every cached GPU now; None when NVML or GPUs are unavailable."""
        with self._lock:
            devices = self._init()
        if devices is None:
            return None
        return [_read_device(device) for device in devices]

    def collect(self) -> list[Metric]:
        """Fresh headroom_gpu_* families; `last_scrape` says whether every GPU read, and how long."""
        started = time.perf_counter()
        readings = self.read()
        success = readings is not None and all(reading.up for reading in readings)
        self.last_scrape = ScrapeHealth(success, time.perf_counter() - started)
        return gpu_families(readings)


def _utilization(handle: object) -> dict[str, float]:
    rates = pynvml.nvmlDeviceGetUtilizationRates(handle)  # percent over the last sample period
    return {
        "headroom_gpu_utilization_ratio": rates.gpu / 100.0,
        "headroom_gpu_memory_bandwidth_utilization_ratio": rates.memory / 100.0,
    }


def _memory(handle: object) -> dict[str, float]:
    info = pynvml.nvmlDeviceGetMemoryInfo(handle)  # bytes
    return {
        "headroom_gpu_memory_used_bytes": float(info.used),
        "headroom_gpu_memory_total_bytes": float(info.total),
    }


def _power(handle: object) -> dict[str, float]:
    return {"headroom_gpu_power_watts": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}  # mW


_READERS = (_utilization, _memory, _power)


def _read_device(device: _Device) -> GpuReading:
    """One GPU's fields; NotSupported (or another per-field error) omits that field only."""
    values: dict[str, float] = {}
    for reader in _READERS:
        try:
            values.update(reader(device.handle))
        except pynvml.NVMLError as exc:
            if _error_code(exc) == pynvml.NVML_ERROR_GPU_IS_LOST:
                log.warning("GPU %s (%s) is lost: %s", device.index, device.uuid, exc)
                return GpuReading(device, False, {})
            if _error_code(exc) != pynvml.NVML_ERROR_NOT_SUPPORTED:
                log.debug("GPU %s: %s failed: %s", device.index, reader.__name__, exc)
    return GpuReading(device, True, values)


def gpu_families(readings: list[GpuReading] | None) -> list[Metric]:
    """headroom_gpu_* families: an unlabelled `headroom_gpu_up 0` when there is no GPU."""
    up_spec = spec("headroom_gpu_up")
    up = Metric(up_spec.name, up_spec.help, "gauge")
    if not readings:
        up.add_sample(up_spec.name, {}, 0.0)
        return [up]
    families = {
        name: GaugeMetricFamily(name, spec(name).help, labels=list(spec(name).labels)) for name in _FIELDS
    }
    for reading in readings:
        up.add_sample(
            up_spec.name, dict(zip(up_spec.labels, reading.device.labels)), 1.0 if reading.up else 0.0
        )
        for name, value in reading.values.items():
            families[name].add_metric(reading.device.labels, value)
    return [up] + [family for family in families.values() if family.samples]
