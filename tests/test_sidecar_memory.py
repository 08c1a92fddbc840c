"""The sidecar gives glibc's free memory back every minute (collector.sidecar.memory).

BENCHMARKS.md §10b has the soak that needed it: the RSS grew with no more objects or malloc bytes
in use, and one malloc_trim(0) gave 64-67 MiB back.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.memory import AllocatorTrim, glibc_malloc_trim
from collector.sidecar.wiring import build_sidecar


def test_the_trim_runs_every_interval_off_the_loop_and_stops() -> None:
    called = threading.Event()
    threads: list[str] = []

    def trim(pad: int) -> int:
        assert pad == 0
        threads.append(threading.current_thread().name)
        if len(threads) >= 3:
            called.set()
        return 1

    trimmer = AllocatorTrim(trim, every_s=0.01)
    trimmer.start()
    assert called.wait(10), "three trims within 10 s at a 10 ms interval"
    trimmer.stop()
    made = trimmer.trims
    assert made >= 3 and set(threads) == {"headroom-malloc-trim"}
    assert not any(thread.name == "headroom-malloc-trim" for thread in threading.enumerate())
    assert trimmer.trims == made  # stopped: no trim after stop()


def test_a_failing_trim_is_logged_once_and_never_retried(caplog: pytest.LogCaptureFixture) -> None:
    failed = threading.Event()

    def trim(_: int) -> int:
        failed.set()
        raise OSError("no")

    trimmer = AllocatorTrim(trim, every_s=0.01)
    trimmer.start()
    assert failed.wait(10)
    trimmer.stop()
    assert trimmer.trims == 1
    assert [record.message for record in caplog.records] == ["malloc_trim failed; not trimming again"]


def test_without_glibc_nothing_runs() -> None:
    trimmer = AllocatorTrim(None)
    trimmer.start()
    assert trimmer.trim_now() is False
    assert not any(thread.name == "headroom-malloc-trim" for thread in threading.enumerate())
    trimmer.stop()


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_on_glibc_a_trim_returns_a_fragmented_heap_to_the_system() -> None:
    # 240 MiB of 4 KiB buffers (malloc's, not pymalloc's) freed below one still held: glibc's own
    # free() can only give back the top of the heap, so the RSS stays until a trim.
    script = textwrap.dedent(
        """
        from collector.sidecar.memory import AllocatorTrim, glibc_malloc_trim

        def rss_mib() -> None:
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) / 1024

        chunks = [bytearray(4096) for _ in range(60_000)]
        held = bytearray(4096)
        del chunks
        before = rss_mib()
        gave = AllocatorTrim(glibc_malloc_trim()).trim_now()
        print(before, rss_mib(), gave)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    before, after, gave = out.split()
    assert gave == "True"
    assert float(before) - float(after) > 150, out


def test_the_sidecar_trims_while_it_serves() -> None:
    assert glibc_malloc_trim() is not None  # the suite runs on glibc (Debian/Ubuntu)
    config = SidecarConfig(
        upstream="http://127.0.0.1:9", db_path=None, instance="t", engine="none", jobs=False
    )
    sidecar = serve_in_thread(build_sidecar(config))
    try:
        assert any(thread.name == "headroom-malloc-trim" for thread in threading.enumerate())
    finally:
        sidecar.stop(timeout_s=15)
    assert not any(thread.name == "headroom-malloc-trim" for thread in threading.enumerate())
