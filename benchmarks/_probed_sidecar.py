"""`headroom run` with a memory probe, for hostile_soak.py: what holds the sidecar's memory?

    python benchmarks/_probed_sidecar.py PROBE_DIR [TRACEMALLOC_FRAMES] -- run --upstream ...

Runs the `headroom` command line in this process after arming two signals:

SIGUSR1  append one JSON line to PROBE_DIR/probe.jsonl: VmRSS (and by kind of mapping), glibc's mallinfo2 (bytes in use, bytes free but held), Python's own arenas
         (sys._debugmallocstats), live objects by type (gc, start-up's frozen ones left out),
         the gc's generation counts, the sizes of
         every per-request or per-connection map the sidecar keeps (live requests, upstream
         connections, idle and waiting, label sets, rate-limited log keys, the log queue, client
         connections, asyncio tasks), DuckDB's own memory (duckdb_memory()) and, with
         TRACEMALLOC_FRAMES > 0, the bytes Python allocated since the app was built and still
         holds, with a snapshot saved as snap-N.pickle (compare two with
         `python benchmarks/_probed_sidecar.py --diff A B`).
SIGUSR2  the same, after `gc.collect()` and glibc's `malloc_trim(0)`, with the RSS before them:
         what the allocator held but did not use.

Benchmark plumbing only: the sidecar itself never imports this.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import gc
import json
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

_APP: list[Any] = []


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _MallInfo2
_LIBC.fopen.restype = ctypes.c_void_p
_LIBC.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
_LIBC.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
_LIBC.fclose.argtypes = [ctypes.c_void_p]


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _rss_split() -> dict[str, float]:
    """VmRSS apart: anonymous memory (heaps, arenas) and file pages (the libraries' code)."""
    split = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name = line.split(":", 1)[0]
        if name in ("RssAnon", "RssFile", "RssShmem"):
            split[name] = int(line.split()[1]) / 1024
    return split


def _mappings() -> dict[str, float]:
    """Resident MiB by kind of mapping (/proc/self/smaps): the main thread's malloc heap (sbrk),
    anonymous mappings (Python's arenas, the other threads' malloc arenas, large blocks), files."""
    kinds: dict[str, float] = collections.defaultdict(float)
    kind = "anon"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else ""
            kind = (
                "heap" if name == "[heap]" else "anon" if not name else "files" if name[0] == "/" else "other"
            )
        elif head[0] == "Rss:":
            kinds[kind] += int(head[1]) / 1024
    return dict(kinds)


def _arenas() -> list[float]:
    """Each glibc arena's size in MiB (malloc_info): the main one first, then the threads'."""
    with tempfile.NamedTemporaryFile(suffix=".xml") as out:
        stream = _LIBC.fopen(out.name.encode(), b"w")
        _LIBC.malloc_info(0, stream)
        _LIBC.fclose(stream)
        text = Path(out.name).read_text()
    sizes = []
    for heap in text.split("<heap nr=")[1:]:
        for line in heap.splitlines():
            if '<system type="current"' in line:
                sizes.append(int(line.split('size="')[1].split('"')[0]) / 2**20)
                break
    return sizes


def _pymalloc() -> dict[str, float]:
    """Python's small-object allocator: its arenas (1 MiB each) and the bytes in use in them."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    found = {}
    for key, name in (
        ("# arenas allocated current", "arenas"),
        ("# arenas highwater mark", "arenas_highwater"),
        ("# bytes in allocated blocks", "in_use_mib"),
        ("# bytes in available blocks", "free_in_pools_mib"),
    ):
        for line in text.splitlines():
            if line.startswith(key):
                value = int(line.rsplit("=", 1)[1].replace(",", "").strip())
                found[name] = value / 2**20 if name.endswith("_mib") else value
                break
    return found


def _mallinfo() -> dict[str, float]:
    info = _LIBC.mallinfo2()
    mib = 2**20
    return {
        "heap_arena_mib": info.arena / mib,  # main + thread arenas' sbrk/mmap'd heaps
        "mmapped_mib": info.hblkhd / mib,
        "in_use_mib": info.uordblks / mib,
        "free_held_mib": info.fordblks / mib,  # freed, kept by malloc
    }


def _maps() -> dict[str, int]:
    """Sizes of the sidecar's per-request and per-connection state."""
    if not _APP:
        return {}
    from collector.sidecar.wiring import sidecar_state

    state = sidecar_state(_APP[0])
    tracker = state.tracker
    sizes: dict[str, int] = {
        "tracker.live": len(tracker.live),
        "tracker.label_sets": len(getattr(tracker, "_label_sets", ())),
        "tracker.task_label_sets": len(getattr(tracker, "_task_label_sets", ())),
    }
    budget = tracker.budget
    for name in (
        "_models",
        "_tenants",
        "_pairs",
        "_task_pairs",
        "_probe_models",
        "_probe_pairs",
        "_adapters",
    ):
        if hasattr(budget, name):
            sizes["budget." + name] = len(getattr(budget, name))
    exported = tracker.exported
    sizes["exported.prefix_entries"] = sum(len(cache) for cache in getattr(exported, "_prefixes", ()))
    for vec_name in ("requests", "prompt_tokens", "generated_tokens", "ttft", "tpot", "duration", "retries"):
        sizes["vec." + vec_name] = len(getattr(tracker, vec_name).children)
    writer = state.writer
    if writer is not None:
        sizes["log.queue"] = len(writer._queue)
    # the proxy's pool, rate-limited log and label cap (made at start-up, so frozen out of gc's
    # lists: reached through the app); the readiness pool is a pool of one
    proxy, passthrough = _APP[0].accounted, _APP[0].passthrough
    pool = proxy._pool
    sizes["pool.all"], sizes["pool.idle"] = len(pool._all), len(pool._idle)
    sizes["pool.waiters"], sizes["pool.open"] = len(pool._waiters), pool._open
    sizes["proxy.faultlog_keys"] = len(proxy._faults._last) + len(proxy._faults._folded)
    sizes["passthrough.faultlog_keys"] = len(passthrough._faults._last) + len(passthrough._faults._folded)
    sizes["proxy.task_cap"] = len(proxy._task_cap)
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        protocols = [o for o in gc.get_objects() if isinstance(o, HttpToolsProtocol)]
        sizes["client.protocols"] = len(protocols)
        if protocols:
            sizes["client.connections_set"] = len(protocols[0].connections)
            sizes["client.cycles_held"] = sum(len(getattr(p, "_cycles", ())) for p in protocols)
            guard = type(protocols[0]).faults
            if guard is not None:
                sizes["server.faultlog_keys"] = len(guard._last) + len(guard._folded)
    except ImportError:
        pass
    loop = asyncio._get_running_loop()
    if loop is not None:
        sizes["asyncio.tasks"] = len(asyncio.all_tasks(loop))
        sizes["asyncio.scheduled"] = len(getattr(loop, "_scheduled", ()))
        sizes["asyncio.ready"] = len(getattr(loop, "_ready", ()))
    return sizes


def _duckdb_memory() -> dict[str, float]:
    from collector.sidecar.wiring import sidecar_state

    if not _APP or sidecar_state(_APP[0]).batch_sink is None:
        return {}
    store = sidecar_state(_APP[0]).batch_sink
    con = getattr(store, "_con", None)
    if con is None:
        return {}
    try:
        rows = (
            con.cursor()
            .execute("SELECT tag, memory_usage_bytes FROM duckdb_memory() WHERE memory_usage_bytes > 0")
            .fetchall()
        )
    except Exception as exc:  # a busy or closing database: say so, never stop the sidecar
        return {"error": str(exc)[:80]}  # type: ignore[dict-item]
    sizes = {tag: size / 2**20 for tag, size in rows}
    wal, usage, limit = (
        con.cursor()
        .execute("SELECT wal_size, memory_usage, memory_limit FROM pragma_database_size()")
        .fetchone()
    )
    sizes |= {"wal_size": wal, "memory_usage": usage, "memory_limit": limit}  # type: ignore[dict-item]
    return sizes


def _probe(directory: Path, trim: bool) -> None:
    began = time.perf_counter()
    line: dict[str, Any] = {"t": time.time(), "rss_mib": _rss_mib()}
    if trim:
        gc.collect()
        line["rss_before_trim_mib"] = line["rss_mib"]
        line["malloc_trim"] = _LIBC.malloc_trim(0)
        line["rss_mib"] = _rss_mib()
    line["malloc"] = _mallinfo()
    line["rss_split"] = _rss_split()
    line["mappings"] = _mappings()
    line["malloc_arenas_mib"] = _arenas()
    line["pymalloc"] = _pymalloc()
    line["gc_count"] = gc.get_count()
    line["gc_frozen"] = gc.get_freeze_count()
    counts = collections.Counter(type(o).__name__ for o in gc.get_objects())
    line["objects"] = len(gc.get_objects())
    line["types"] = dict(counts.most_common(40))
    line["maps"] = _maps()
    line["duckdb_mib"] = _duckdb_memory()
    if tracemalloc.is_tracing():
        current, peak = tracemalloc.get_traced_memory()
        line["traced_mib"], line["traced_peak_mib"] = current / 2**20, peak / 2**20
        index = sum(1 for _ in directory.glob("snap-*.pickle"))
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        path = directory / f"snap-{index:03d}.pickle"
        snapshot.dump(str(path))
        line["snapshot"] = path.name
    line["probe_s"] = time.perf_counter() - began
    with (directory / "probe.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")


def _diff(a: str, b: str, top: int = 25) -> None:
    old, new = tracemalloc.Snapshot.load(a), tracemalloc.Snapshot.load(b)
    for key in ("filename", "lineno", "traceback"):
        stats = new.compare_to(old, key)
        print(f"== by {key}: top {top} growth ==")
        for stat in stats[: top if key != "traceback" else 8]:
            print(stat)
            if key == "traceback":
                for frame in stat.traceback.format()[-12:]:
                    print("     ", frame)


def main() -> None:
    if sys.argv[1] == "--diff":
        _diff(sys.argv[2], sys.argv[3])
        return
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    split = sys.argv.index("--")
    frames = int(sys.argv[2]) if split > 2 else 0

    from collector.sidecar import wiring

    build = wiring.build_sidecar

    def capture(*args: Any, **kwargs: Any) -> Any:
        app = build(*args, **kwargs)
        _APP.append(app)
        if frames:  # from here: start-up's imports are neither traced nor slowed
            tracemalloc.start(frames)
        return app

    wiring.build_sidecar = capture

    def on_signal(number: int, _frame: Any) -> None:
        loop = asyncio._get_running_loop()
        trim = number == signal.SIGUSR2
        if loop is None:
            _probe(directory, trim)
        else:  # between two callbacks, not inside one
            loop.call_soon_threadsafe(_probe, directory, trim)

    signal.signal(signal.SIGUSR1, on_signal)
    signal.signal(signal.SIGUSR2, on_signal)
    from collector.cli import main as headroom

    sys.argv = ["headroom", *sys.argv[split + 1 :]]
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    headroom()


if __name__ == "__main__":
    main()
