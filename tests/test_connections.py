"""Connections that never become requests: header timeout (408), connection cap (503), and a real
`headroom run` that keeps answering canaries within 100 ms p99 (on a busy machine: within a few
times their p99 without those connections, support/latency.py) while 2,000 idle connections and
100 slowloris connections are open. The run also checks the modes of the files it writes.
"""

from __future__ import annotations

import gc
import socket
import stat
import threading
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry
from support.latency import RATIO, best_window, bound, p50, p99
from support.processes import headroom_process
from support.sources import connect_from
from support.upstream import FakeUpstream

from collector.serving import serve_in_thread
from collector.sidecar.app import YOUNG_COLLECTION_THRESHOLD
from collector.sidecar.config import SidecarConfig
from collector.sidecar.descriptors import raise_file_limit
from collector.sidecar.server import ADMIN_SLOTS, uvicorn_options
from collector.sidecar.wiring import SIDECAR_STORE_THREADS, build_sidecar, sidecar_state

IDLE, SLOWLORIS, CANARIES, WARM_UP = 2_000, 100, 100, 10
# With the idle and slowloris connections open, the canaries' p99 is within 100 ms or within
# RATIO times their p99 without them, and never past STARVED_S: half the sidecar's 5 s
# --idle-timeout, the shortest timeout that frees a held slot.
STARVED_S = 2.5


def _guarded(tmp_path, fake: FakeUpstream, checkpoint_mb: int | None = None, **bounds):
    app = build_sidecar(
        SidecarConfig(
            upstream=fake.url,
            engine="none",
            db_path=str(tmp_path / "log.duckdb"),
            jobs=False,
            checkpoint_mb=checkpoint_mb,
        )
    )
    options = uvicorn_options(
        sidecar_state(app).registry,
        **{"header_timeout_s": 10.0, "idle_timeout_s": 5.0, "max_connections": 4096, **bounds},
    )
    return app, serve_in_thread(app, **options)


def _refused(app, reason: str) -> float | None:
    return sidecar_state(app).registry.get_sample_value(
        "headroom_connections_refused_total", {"reason": reason}
    )


def test_headers_not_complete_in_time_get_408_and_the_connection_closes(tmp_path):
    with FakeUpstream() as fake:
        app, handle = _guarded(tmp_path, fake, header_timeout_s=0.3)
        try:
            with socket.create_connection(("127.0.0.1", handle.port), timeout=5) as slow:
                slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never finished
                answer = slow.recv(4096)
                assert slow.recv(4096) == b""  # closed after the answer
            assert answer.startswith(b"HTTP/1.1 408") and b"--header-timeout" in answer
            assert _refused(app, "header_timeout") == 1
        finally:
            handle.stop()


def test_a_pipelined_requests_late_headers_never_break_the_stream_before_it(tmp_path):
    """A kept-alive client sends the first bytes of its next request while a stream runs: the
    header deadline waits for the stream to end; the 408 comes after its last byte."""
    with FakeUpstream() as fake:
        app, handle = _guarded(tmp_path, fake, header_timeout_s=0.3)
        body = b'{"model":"m1","stream":true}'
        try:
            with socket.create_connection(("127.0.0.1", handle.port), timeout=5) as client:
                client.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-fake-delay: 0.25\r\nx-test-id: piped\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                assert fake.expect("piped").wait(5)
                client.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next request, never finished
                received = b""
                while part := client.recv(65536):  # the sidecar closes after its 408
                    received += part
            stream, _, after = received.partition(b"HTTP/1.1 408")
            assert stream.startswith(b"HTTP/1.1 200") and stream.endswith(b"0\r\n\r\n"), received[-200:]
            assert b"data: [DONE]" in stream and b"--header-timeout" in after
            assert sidecar_state(app).writer.flush()
            rows = sidecar_state(app).batch_sink.query_dicts("SELECT outcome FROM requests", ())
            assert [r["outcome"] for r in rows] == ["ok"]
        finally:
            handle.stop()


def test_past_the_connection_cap_a_new_connection_gets_503_at_once(tmp_path):
    """Past the cap and its reserved admin slots (tests/test_sidecar_hardening.py has those), which
    two addresses hold: one address holds at most ADMIN_SLOTS_PER_SOURCE of them."""
    with FakeUpstream() as fake:
        app, handle = _guarded(tmp_path, fake, max_connections=5)
        held = [socket.create_connection(("127.0.0.1", handle.port)) for _ in range(5)]
        held += [connect_from(f"127.0.0.{2 + i % 2}", handle.port) for i in range(ADMIN_SLOTS)]
        try:
            with connect_from("127.0.0.4", handle.port) as extra:
                answer = extra.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503") and b"--max-client-connections" in answer
            assert _refused(app, "connection_cap") == 1
            for sock in held:
                sock.close()
        finally:
            handle.stop()


def _slowloris(port: int, stop: threading.Event, opened: list[socket.socket]) -> None:
    """SLOWLORIS connections that send one header byte every half second, never finishing."""
    for _ in range(SLOWLORIS):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        opened.append(sock)
    for _ in range(120):  # bounded: at most a minute
        if stop.wait(0.5):
            return
        for sock in opened:
            try:
                sock.sendall(b"a")
            except OSError:
                pass


def _canaries(url: str, count: int) -> list[float]:
    """Seconds each of `count` canaries took, one after another on one kept-alive connection, sorted."""
    took = []
    # TCP_NODELAY: else Nagle holds the body behind the headers for a delayed ACK (40 ms)
    nodelay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    with httpx.Client(timeout=5, transport=nodelay) as client:
        for index in range(count):
            began = time.perf_counter()
            response = client.post(
                url + "/v1/chat/completions",
                json={"model": "m1", "messages": [{"role": "user", "content": "hi"}]},
            )
            took.append(time.perf_counter() - began)
            assert response.status_code == 200, (index, response.text)
    return sorted(took)


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.serial  # a latency limit: measured on this machine, alone
def test_canaries_answered_within_100_ms_p99_with_2000_idle_and_100_slowloris(tmp_path):
    """The limit is 100 ms p99 or, where this machine is too busy for that (CPU hogs beside the
    suite), RATIO times the p99 of the same canaries on the same sidecar without the idle and
    slowloris connections (the larger of before they opened and after they closed): what those
    connections cost is measured against the sidecar's own pace on this machine, not against a
    timer. Up to three windows of canaries run with the connections open and the best must pass
    (one hog's time slice can hold any process for 100 ms); the median is held to the same ratio of
    the median before (or 20 ms) in every window: a cost paid on every request (a walk over every
    open connection) shows there first. A sidecar that starves canaries behind those connections
    (a slot freed only by a timeout, a loop that stalls on partial headers) fails every window, and
    past STARVED_S it fails however busy the machine."""
    raise_file_limit(IDLE + SLOWLORIS + 512)  # this process holds the other end of every socket
    db = tmp_path / "data" / "log.duckdb"
    with (
        FakeUpstream() as fake,
        headroom_process(
            "run",
            "--upstream",
            fake.url,
            "--db",
            str(db),
            "--engine",
            "none",
            "--no-jobs",
            health="/healthz",
            log=tmp_path / "sidecar.log",
        ) as url,
    ):
        port = int(url.rsplit(":", 1)[1])
        _canaries(url, WARM_UP)  # the first requests (imports, the upstream pool, DuckDB's first insert)
        baseline = _canaries(url, CANARIES)
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(IDLE)]
        stop, slow = threading.Event(), []
        loris = threading.Thread(target=_slowloris, args=(port, stop, slow), daemon=True)
        loris.start()
        try:
            while len(slow) < SLOWLORIS and loris.is_alive():  # every slowloris connection open
                time.sleep(0.01)
            windows = best_window(
                lambda: _canaries(url, CANARIES),
                lambda took: p99(took) < bound(0.100, p99(baseline), STARVED_S),
            )
            modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in db.parent.iterdir()}
            metrics = httpx.get(url + "/metrics", timeout=5).text
        finally:
            stop.set()
            loris.join(10)
            for sock in idle + slow:
                sock.close()
        _canaries(url, WARM_UP)  # behind the sidecar's 2,100 closes
        after = _canaries(url, CANARIES)
    base = max(p99(baseline), p99(after))  # the machine's pace may change meanwhile
    limit = bound(0.100, base, STARVED_S)
    print(
        f"\ncanaries with {IDLE} idle and {SLOWLORIS} slowloris connections: "
        + ", ".join(f"p50 {p50(took) * 1000:.1f} ms p99 {p99(took) * 1000:.1f} ms" for took in windows)
        + f"; without them p50 {p50(baseline) * 1000:.1f} ms, p99 {p99(baseline) * 1000:.1f} ms before, "
        f"{p99(after) * 1000:.1f} ms after; p99 bound {limit * 1000:.0f} ms"
    )
    assert min(p99(took) for took in windows) < limit, ([p99(took) for took in windows], base)
    assert all(took[-1] < STARVED_S for took in windows), [took[-1] for took in windows]
    for took in windows:  # no cost on every request
        assert p50(took) < max(0.020, RATIO * p50(baseline)), (p50(took), p50(baseline))
    assert len(slow) == SLOWLORIS and "headroom_connections_refused_total" in metrics
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert modes and set(modes.values()) == {0o600}, modes  # the DuckDB file and its WAL


def test_registry_of_a_guard_counts_refusals_by_reason():
    registry = CollectorRegistry()
    protocol = uvicorn_options(registry, header_timeout_s=1, idle_timeout_s=1, max_connections=1)["http"]
    protocol.refused.labels("header_timeout").inc()
    assert registry.get_sample_value("headroom_connections_refused_total", {"reason": "header_timeout"}) == 1


def test_a_started_sidecar_collects_young_garbage_in_large_steps_with_start_up_frozen(tmp_path):
    """Serving changes the collector: start-up objects frozen, the youngest generation collected
    every YOUNG_COLLECTION_THRESHOLD allocations rather than CPython's 700 (BENCHMARKS.md §2)."""
    with FakeUpstream() as fake:
        _, handle = _guarded(tmp_path, fake)
        try:
            assert gc.get_threshold()[0] == YOUNG_COLLECTION_THRESHOLD > 700
            assert gc.get_freeze_count() > 10_000  # the imports and the app, at least
        finally:
            handle.stop()


def test_the_sidecars_own_store_takes_one_duckdb_thread_whatever_the_cores(tmp_path):
    """DuckDB's default is a thread per core; beside a proxy its inserts take one (BENCHMARKS.md §5f)."""
    with FakeUpstream() as fake:
        app, handle = _guarded(tmp_path, fake)
        try:
            store = sidecar_state(app).writer.sink
            assert store.query("SELECT current_setting('threads')")[0][0] == SIDECAR_STORE_THREADS == 1
        finally:
            handle.stop()


@pytest.mark.parametrize(("checkpoint_mb", "setting"), [(None, "16.0 MiB"), (64, "61.0 MiB")])
def test_the_sidecars_own_store_folds_its_log_every_checkpoint_mb(tmp_path, checkpoint_mb, setting):
    """--checkpoint-mb reaches the started sidecar's DuckDB; unset, DuckDB's 16 MB (= 16.0 MiB
    as DuckDB shows it; 64 MB is 61.0 MiB) stays (BENCHMARKS.md §5g)."""
    with FakeUpstream() as fake:
        app, handle = _guarded(tmp_path, fake, checkpoint_mb=checkpoint_mb)
        try:
            store = sidecar_state(app).writer.sink
            assert store.query("SELECT current_setting('checkpoint_threshold')")[0][0] == setting
        finally:
            handle.stop()


@pytest.mark.parametrize(("store_memory_mb", "setting"), [(None, "244.1 MiB"), (100, "95.3 MiB")])
def test_the_sidecars_own_store_is_bounded_by_store_memory_mb(tmp_path, store_memory_mb, setting):
    """Without a bound DuckDB keeps every block it writes up to 80 % of the machine's memory (a
    sidecar grew by ~53 bytes a row, BENCHMARKS.md §10): 256 MB (DuckDB shows 244.1 MiB) unless
    --store-memory-mb says otherwise; below 64 MB it is refused."""
    options = {} if store_memory_mb is None else {"store_memory_mb": store_memory_mb}
    app = build_sidecar(
        SidecarConfig(
            upstream="http://127.0.0.1:9",
            engine="none",
            db_path=str(tmp_path / "log.duckdb"),
            jobs=False,
            **options,
        )
    )
    try:
        store = sidecar_state(app).writer.sink
        assert store.query("SELECT current_setting('memory_limit')")[0][0] == setting
    finally:
        sidecar_state(app).writer.close()
    with pytest.raises(ValueError, match="--store-memory-mb must be at least 64, got 63"):
        SidecarConfig(upstream="http://127.0.0.1:9", store_memory_mb=63)
