"""The sidecar gives memory back every minute (collector.sidecar.memory): a full collection on its
event loop, then glibc's malloc_trim in a thread.

BENCHMARKS.md §10b has the soaks that needed it: the RSS crept with no more objects or malloc
bytes in use, and one collection and trim gave 60-70 MiB back.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading

import httpx
import pytest
from support.waiting import patient

from collector.serving import serve_in_thread
from collector.sidecar import app
from collector.sidecar.config import SidecarConfig
from collector.sidecar.memory import MemoryReturn, glibc_malloc_trim
from collector.sidecar.wiring import build_sidecar


async def test_each_round_collects_on_the_loop_then_trims_off_it() -> None:
    loop_thread = threading.current_thread()
    order: list[tuple[str, bool]] = []

    def collect() -> int:
        order.append(("collect", threading.current_thread() is loop_thread))
        return 0

    def trim(pad: int) -> int:
        assert pad == 0
        order.append(("trim", threading.current_thread() is loop_thread))
        return 1

    returning = MemoryReturn(trim, every_s=0.01, collect=collect)
    task = asyncio.create_task(returning.run())
    async with asyncio.timeout(patient(10)):
        while returning.rounds < 3:
            await asyncio.sleep(0.005)  # polling the counter the task under test advances
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert order[:6] == [("collect", True), ("trim", False)] * 3  # collect on the loop, trim off it


async def test_a_failing_round_is_logged_once_and_never_retried(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    def trim(_: int) -> int:
        nonlocal calls
        calls += 1
        raise OSError("no")

    await asyncio.wait_for(MemoryReturn(trim, every_s=0.01, collect=lambda: 0).run(), patient(10))  # returns
    assert calls == 1
    assert [record.message for record in caplog.records] == ["giving memory back failed; not trying again"]


async def test_without_glibc_it_only_collects() -> None:
    collected = []
    returning = MemoryReturn(None, collect=lambda: collected.append(1))
    assert await returning.once() is False
    assert collected == [1] and returning.rounds == 1


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_on_glibc_a_round_returns_garbage_in_cycles_and_a_fragmented_heap() -> None:
    # 240 MiB of 4 KiB buffers (malloc's, not pymalloc's), each held by a reference cycle and the
    # young collections disabled, as a serving sidecar's oldest generation holds them; then one
    # buffer allocated after them and kept, so glibc's own free() cannot give the heap back from
    # its top. One round must bring the RSS down by most of the 240 MiB.
    script = textwrap.dedent(
        """
        import asyncio, gc
        from collector.sidecar.memory import MemoryReturn, glibc_malloc_trim

        def rss_mib():
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) / 1024

        gc.disable()
        for _ in range(60_000):
            cycle = [bytearray(4096)]
            cycle.append(cycle)
        del cycle
        held = bytearray(4096)
        before = rss_mib()
        gave = asyncio.run(MemoryReturn(glibc_malloc_trim()).once())
        print(before, rss_mib(), gave)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    before, after, gave = out.split()
    assert gave == "True"
    assert float(before) - float(after) > 150, out


def test_the_sidecar_returns_memory_while_it_serves_and_stops_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert glibc_malloc_trim() is not None  # the suite runs on glibc (Debian/Ubuntu)
    started, cancelled = threading.Event(), threading.Event()

    class Watched(MemoryReturn):
        async def run(self) -> None:
            started.set()
            try:
                await super().run()
            except asyncio.CancelledError:
                cancelled.set()
                raise

    monkeypatch.setattr(app, "MemoryReturn", Watched)
    config = SidecarConfig(
        upstream="http://127.0.0.1:9", db_path=None, instance="t", engine="none", jobs=False
    )
    sidecar = serve_in_thread(build_sidecar(config))
    try:
        assert httpx.get(f"{sidecar.url}/healthz", timeout=patient(5)).status_code == 200
        assert started.wait(patient(10))
        assert not cancelled.is_set()
    finally:
        sidecar.stop(timeout_s=patient(15))
    assert cancelled.wait(patient(10))  # the lifespan's end stops it
