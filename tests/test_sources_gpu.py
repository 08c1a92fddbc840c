"""GpuCollector: pynvml replaced at the module boundary by a fake set of GPUs, and the real path."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
from types import SimpleNamespace

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support.sidecar import sidecar_rig, wait_until
from support.waiting import patient

from collector.sources import gpu as gpu_module
from collector.sources.gpu import GpuCollector
from collector.sources.health import SourceHealth

H100 = ["0", "GPU-aaaa", "NVIDIA H100 80GB HBM3"]
A10G = ["1", "GPU-bbbb", "NVIDIA A10G"]
LOST = ["2", "GPU-cccc", "NVIDIA L4"]


class FakeNvml:
    """Three GPUs: a healthy H100, an A10G without power readings, an L4 that fell off the bus."""

    def __init__(self, init_error: int | None = None, count: int = 3) -> None:
        self.init_error = init_error
        self.count = count
        self.calls: dict[str, int] = {}
        self.devices = [
            {
                "uuid": "GPU-aaaa",
                "name": "NVIDIA H100 80GB HBM3",
                "util": (87, 45),
                "mem": (60 * 2**30, 80 * 2**30),
                "power_mw": 512_250,
            },
            {
                "uuid": b"GPU-bbbb",
                "name": b"NVIDIA A10G",
                "util": (10, 3),
                "mem": (2 * 2**30, 24 * 2**30),
                "power_mw": pynvml.NVML_ERROR_NOT_SUPPORTED,
            },
            {"uuid": "GPU-cccc", "name": "NVIDIA L4", "lost": True},
        ]

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def install(self, monkeypatch) -> FakeNvml:
        def fn(name, body):
            def call(*args):
                self._count(name)
                return body(*args)

            monkeypatch.setattr(pynvml, name, call)

        fn("nvmlInit", self._init)
        fn("nvmlDeviceGetCount", lambda: self.count)
        fn("nvmlDeviceGetHandleByIndex", lambda index: self.devices[index])
        fn("nvmlDeviceGetUUID", lambda handle: handle["uuid"])
        fn("nvmlDeviceGetName", lambda handle: handle["name"])
        fn(
            "nvmlDeviceGetUtilizationRates",
            lambda handle: SimpleNamespace(**dict(zip(("gpu", "memory"), self._field(handle, "util")))),
        )
        fn(
            "nvmlDeviceGetMemoryInfo",
            lambda handle: SimpleNamespace(**dict(zip(("used", "total"), self._field(handle, "mem")))),
        )
        fn("nvmlDeviceGetPowerUsage", lambda handle: self._field(handle, "power_mw"))
        return self

    def _init(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    @staticmethod
    def _field(handle: dict, key: str):
        if handle.get("lost"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        value = handle[key]
        if value == pynvml.NVML_ERROR_NOT_SUPPORTED:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value


def registry_of(collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def sample(registry: CollectorRegistry, name: str, labels: list[str] | None = None):
    keys = ("gpu", "uuid", "gpu_name")
    return registry.get_sample_value(name, dict(zip(keys, labels)) if labels else {})


def test_several_gpus_with_labels_units_and_ratios(monkeypatch):
    FakeNvml().install(monkeypatch)
    registry = registry_of(GpuCollector())
    assert sample(registry, "headroom_gpu_up", H100) == 1.0
    assert sample(registry, "headroom_gpu_utilization_ratio", H100) == pytest.approx(0.87)
    assert sample(registry, "headroom_gpu_memory_bandwidth_utilization_ratio", H100) == pytest.approx(0.45)
    assert sample(registry, "headroom_gpu_memory_used_bytes", H100) == 60 * 2**30
    assert sample(registry, "headroom_gpu_memory_total_bytes", H100) == 80 * 2**30
    assert sample(registry, "headroom_gpu_power_watts", H100) == pytest.approx(512.25)
    assert sample(registry, "headroom_gpu_up", A10G) == 1.0  # bytes names from old pynvml decoded
    assert sample(registry, "headroom_gpu_utilization_ratio", A10G) == pytest.approx(0.10)


def test_not_supported_field_is_left_out_not_zeroed(monkeypatch):
    FakeNvml().install(monkeypatch)
    registry = registry_of(GpuCollector())
    assert sample(registry, "headroom_gpu_power_watts", A10G) is None
    assert sample(registry, "headroom_gpu_memory_used_bytes", A10G) == 2 * 2**30


def test_lost_gpu_is_down_alone_and_the_others_still_report(monkeypatch):
    FakeNvml().install(monkeypatch)
    registry = registry_of(SourceHealth([GpuCollector()]))  # the scrape-health families come from it
    assert sample(registry, "headroom_gpu_up", LOST) == 0.0
    for name in (
        "headroom_gpu_utilization_ratio",
        "headroom_gpu_memory_used_bytes",
        "headroom_gpu_power_watts",
    ):
        assert sample(registry, name, LOST) is None
    assert sample(registry, "headroom_gpu_up", H100) == 1.0
    assert registry.get_sample_value("headroom_source_scrape_success", {"source": "gpu"}) == 0.0


def test_nvml_init_is_cached_and_a_scrape_is_three_reads_per_gpu(monkeypatch):
    fake = FakeNvml().install(monkeypatch)
    collector = GpuCollector()
    for _ in range(5):
        list(collector.collect())
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetName"] == 3 and fake.calls["nvmlDeviceGetUUID"] == 3
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 5 * 2  # the lost GPU stops at the first read
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 5 * 3


@pytest.mark.parametrize(
    "error",
    [
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_NO_PERMISSION,
    ],
)
def test_no_library_driver_or_permission_gives_unlabelled_gpu_up_0(monkeypatch, error):
    FakeNvml(init_error=error).install(monkeypatch)
    collector = GpuCollector()
    text = generate_latest(registry_of(collector)).decode()
    assert "\nheadroom_gpu_up 0.0\n" in text
    assert "headroom_gpu_utilization_ratio" not in text
    assert "NVML unavailable" in collector.unavailable_reason


def test_no_device_and_no_package_give_unlabelled_gpu_up_0(monkeypatch):
    FakeNvml(count=0).install(monkeypatch)
    assert sample(registry_of(GpuCollector()), "headroom_gpu_up") == 0.0
    monkeypatch.setattr(gpu_module, "pynvml", None)
    collector = GpuCollector()
    assert sample(registry_of(collector), "headroom_gpu_up") == 0.0
    assert "not installed" in collector.unavailable_reason


def test_failed_init_is_retried_only_after_the_retry_interval(monkeypatch):
    fake = FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED).install(monkeypatch)
    patient, eager = GpuCollector(retry_init_s=3600), GpuCollector(retry_init_s=0)
    for collector in (patient, eager):
        list(collector.collect())
    fake.init_error = None  # the driver has loaded since
    assert sample(registry_of(patient), "headroom_gpu_up") == 0.0
    assert sample(registry_of(eager), "headroom_gpu_up", H100) == 1.0


def test_a_cpu_box_logs_the_missing_gpu_once_at_info_then_at_debug(monkeypatch, caplog):
    FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND).install(monkeypatch)
    collector = GpuCollector(retry_init_s=0)  # every scrape retries, as each minute does on a CPU box
    with caplog.at_level(logging.DEBUG, logger=gpu_module.__name__):
        for _ in range(5):
            list(collector.collect())
    levels = [record.levelno for record in caplog.records if "no GPU metrics" in record.getMessage()]
    assert levels == [logging.INFO] + [logging.DEBUG] * 4, levels


def test_this_machines_real_nvml_path_never_crashes():
    collector = GpuCollector()
    registry = registry_of(collector)
    text = generate_latest(registry).decode()
    try:
        pynvml.nvmlInit()
        has_gpu = pynvml.nvmlDeviceGetCount() > 0
    except pynvml.NVMLError:
        has_gpu = False
    if has_gpu:  # a GPU runner: every GPU is labelled
        assert 'headroom_gpu_up{gpu="0"' in text
    else:  # this development machine: no driver, no device
        assert sample(registry, "headroom_gpu_up") == 0.0
        assert collector.unavailable_reason


def _nvidia_smi_gpus() -> list[dict[str, str]]:
    """The GPUs nvidia-smi reads (index, uuid, name, memory.total in MiB); none without a driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    fields = ("index", "uuid", "name", "memory.total")
    try:
        done = subprocess.run(
            [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=patient(60),
        )
    except (OSError, subprocess.TimeoutExpired):  # a driver that cannot answer: no GPU to check
        return []
    if done.returncode != 0:
        return []
    return [
        dict(zip(fields, (cell.strip() for cell in line.split(",")))) for line in done.stdout.splitlines()
    ]


@pytest.mark.subprocess  # nvidia-smi
def test_on_a_real_gpu_the_sidecar_exports_what_nvidia_smi_reads_and_follows_a_load(tmp_path):
    """The real sidecar on a GPU machine: every GPU nvidia-smi lists, labelled as nvidia-smi names
    it, with its memory total to the MiB; with PyTorch there, a matmul load moves utilisation
    and memory in the next scrapes. No GPU here: skipped (the fake-NVML tests above cover the
    logic; this is the check a GPU machine runs)."""
    gpus = _nvidia_smi_gpus()
    if not gpus:
        pytest.skip("no NVIDIA GPU on this machine (nvidia-smi absent or lists none)")
    with sidecar_rig(tmp_path) as rig:
        metrics = rig.metrics()
        assert metrics[("headroom_source_scrape_success", (("source", "gpu"),))] == 1.0
        for gpu in gpus:
            labels = (("gpu", gpu["index"]), ("gpu_name", gpu["name"]), ("uuid", gpu["uuid"]))
            assert metrics[("headroom_gpu_up", labels)] == 1.0
            total = metrics[("headroom_gpu_memory_total_bytes", labels)]
            assert 0 <= total - int(gpu["memory.total"]) * 2**20 < 2**20  # nvidia-smi floors to MiB
            assert 0 < metrics[("headroom_gpu_memory_used_bytes", labels)] <= total
            assert 0 <= metrics[("headroom_gpu_utilization_ratio", labels)] <= 1
            assert metrics[("headroom_gpu_power_watts", labels)] > 0
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("PyTorch sees no GPU: the load half of this check needs one")
        first = gpus[0]
        labels = (("gpu", first["index"]), ("gpu_name", first["name"]), ("uuid", first["uuid"]))
        used_before = metrics[("headroom_gpu_memory_used_bytes", labels)]
        device = torch.device(f"cuda:{first['index']}")
        ballast = torch.empty(4 * 2**30, dtype=torch.uint8, device=device)  # 4 GiB the driver must count
        matrix = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        stop = threading.Event()

        def load() -> None:  # bounded: stops when the check is done, or after patient(60) s
            deadline = time.monotonic() + patient(60)
            while not stop.is_set() and time.monotonic() < deadline:
                for _ in range(20):
                    matrix @ matrix
                torch.cuda.synchronize(device)

        worker = threading.Thread(target=load, daemon=True)
        worker.start()

        def under_load() -> dict | None:
            scrape = rig.metrics()
            busy = scrape[("headroom_gpu_utilization_ratio", labels)] >= 0.5
            return (
                scrape
                if busy and scrape[("headroom_gpu_memory_used_bytes", labels)] >= used_before + 4 * 2**30
                else None
            )

        try:
            loaded = wait_until(
                under_load,
                timeout_s=30,
                interval_s=0.25,
                what="GPU utilisation >= 0.5 and 4 GiB more memory in the sidecar's scrape",
            )
        finally:
            stop.set()
            worker.join(patient(70))
        print(
            f"{first['name']}: utilisation {loaded[('headroom_gpu_utilization_ratio', labels)]:.2f}, "
            f"memory used {used_before / 2**30:.2f} -> "
            f"{loaded[('headroom_gpu_memory_used_bytes', labels)] / 2**30:.2f} GiB, power "
            f"{metrics[('headroom_gpu_power_watts', labels)]:.0f} -> "
            f"{loaded[('headroom_gpu_power_watts', labels)]:.0f} W"
        )
        del ballast
