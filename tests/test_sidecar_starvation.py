"""Monitoring cannot be starved (issue #48, item 2), each against a real sidecar on loopback.

Reserved admin slots serve one answer and close, and one client address holds at most half of
them; one address has bounds on its connections and on its requests not fully sent (429); a
request waits --upstream-wait-timeout at most for an upstream connection (503), and a client that
takes nothing of its answer is cut off after --write-stall-timeout, freeing the upstream connection
its paused stream held. The acceptance: with the default listener, 10 keep-alive pollers and 4,000
half-sent bodies from one address leave /metrics, /healthz and /readyz answering within 100 ms
p99; 16 clients that stop reading never make another wait past the deadline without an answer.

Other client addresses are other loopback addresses (tests/support/sources.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.latency import best_window, bound, p50, p99
from support.processes import headroom_process
from support.sidecar import CHAT, wait_until
from support.sources import connect_from
from support.upstream import FakeUpstream
from support.waiting import patient

from collector.serving import serve_in_thread
from collector.sidecar.addresses import source_limits, source_of
from collector.sidecar.config import SidecarConfig
from collector.sidecar.descriptors import raise_file_limit
from collector.sidecar.server import ADMIN_SLOTS, ADMIN_SLOTS_PER_SOURCE, uvicorn_options
from collector.sidecar.wiring import build_sidecar, sidecar_state

PATH = "/v1/chat/completions"
ADMIN = ("/metrics", "/healthz", "/readyz")
BODY = b'{"model":"m1","stream":false,"messages":[{"role":"user","content":"hi"}]}'
HALF = (
    f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    f"Content-Length: {len(BODY)}\r\n\r\n"
).encode() + BODY[:10]  # headers and part of the body, then nothing


@contextlib.contextmanager
def _guarded(
    tmp_path: Any, upstream: str, bounds: dict[str, Any] | None = None, **config: Any
) -> Iterator[Any]:
    """A real sidecar served by uvicorn with the guard `headroom run` uses; yields (app, handle)."""
    app = build_sidecar(
        SidecarConfig(
            upstream=upstream, engine="none", db_path=str(tmp_path / "log.duckdb"), jobs=False, **config
        )
    )
    # a held connection that sends nothing must outlive a slow test: no test waits for these
    options = {"header_timeout_s": 30.0, "idle_timeout_s": 60.0, "max_connections": 4096, **(bounds or {})}
    handle = serve_in_thread(app, **uvicorn_options(sidecar_state(app).registry, **options))
    try:
        yield app, handle
    finally:
        handle.stop()


def _refused(app: Any, reason: str) -> float:
    value = sidecar_state(app).registry.get_sample_value(
        "headroom_connections_refused_total", {"reason": reason}
    )
    return value or 0.0


def _until_closed(sock: socket.socket) -> bytes:
    received = b""
    while part := sock.recv(65536):  # the socket's timeout bounds each wait
        received += part
    return received


def _get(sock: socket.socket, path: str) -> bytes:
    """One keep-alive GET on `sock` and its whole answer (Content-Length framed)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    received = b""
    while b"\r\n\r\n" not in received:
        part = sock.recv(65536)
        if not part:
            return received
        received += part
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        part = sock.recv(65536)
        if not part:
            break
        body += part
    return head + b"\r\n\r\n" + body


# --- units ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "source"),
    [
        ("10.0.0.5", "10.0.0.5"),
        ("2001:db8::1", "2001:db8::/64"),
        ("2001:db8::ffff:1", "2001:db8::/64"),  # the same /64: one client
        ("2001:db8:0:1::1", "2001:db8:0:1::/64"),
        ("::ffff:10.0.0.5", "10.0.0.5"),  # IPv4-mapped: the IPv4 client
        ("fe80::1%eth0", "fe80::/64"),
        ("not-an-address:x", "not-an-address:x"),
    ],
)
def test_a_client_address_is_an_ipv4_address_or_an_ipv6_64(host, source):
    assert source_of(host) == source


@pytest.mark.parametrize(
    ("cap", "connections", "partial", "expected"),
    [
        (4096, None, None, (4096, 1024)),  # the defaults: the cap, a quarter of it
        (480, None, None, (480, 120)),  # a cap lowered to fit a 1,024-file limit
        (5, None, None, (5, 64)),  # at least 64 requests not fully sent
        (4096, 100, 10, (100, 10)),  # given: as given
    ],
)
def test_per_source_bounds_default_to_the_cap_and_a_quarter_of_it(cap, connections, partial, expected):
    assert source_limits(cap, connections, partial) == expected


def test_the_per_source_options_and_deadlines_are_refused_when_not_positive():
    with pytest.raises(ValueError, match="--max-connections-per-source must be at least 1, got 0"):
        SidecarConfig(upstream="http://127.0.0.1:9", max_connections_per_source=0)
    with pytest.raises(ValueError, match="--max-partial-requests-per-source must be at least 1, got 0"):
        SidecarConfig(upstream="http://127.0.0.1:9", max_partial_requests_per_source=0)
    with pytest.raises(ValueError, match="--upstream-wait-timeout must be positive"):
        SidecarConfig(upstream="http://127.0.0.1:9", upstream_wait_timeout_s=0)
    with pytest.raises(ValueError, match="--write-stall-timeout must be positive"):
        SidecarConfig(upstream="http://127.0.0.1:9", write_stall_timeout_s=0)


# --- reserved admin slots -------------------------------------------------------------------------


def test_a_reserved_slot_answers_once_and_closes_and_one_address_holds_half_of_them(tmp_path):
    """Past the cap: /healthz on a reserved slot says `connection: close` and the connection ends
    after it; one address holds ADMIN_SLOTS_PER_SOURCE reserved slots, its next connection is
    refused, and another address still gets one."""
    with FakeUpstream() as fake, _guarded(tmp_path, fake.url, {"max_connections": 2}) as (app, handle):
        held = [socket.create_connection(("127.0.0.1", handle.port), timeout=patient(5)) for _ in range(2)]
        try:
            with connect_from("127.0.0.2", handle.port, timeout_s=patient(5)) as poller:
                answer = _get(poller, "/healthz")
                assert answer.startswith(b"HTTP/1.1 200") and b"connection: close\r\n" in answer.lower()
                assert poller.recv(1) == b""  # closed after its one answer
            reserved = [
                connect_from("127.0.0.2", handle.port, timeout_s=patient(5))
                for _ in range(ADMIN_SLOTS_PER_SOURCE)
            ]
            held += reserved
            wait_until(
                lambda: len(handle.server.server_state.connections) >= 2 + ADMIN_SLOTS_PER_SOURCE,
                5,
                what="the reserved connections accepted",
            )
            with connect_from("127.0.0.2", handle.port, timeout_s=patient(5)) as extra:
                refused = _until_closed(extra)  # before it sent anything
            assert refused.startswith(b"HTTP/1.1 503") and b"holds 4 of the reserved slots" in refused
            with connect_from("127.0.0.3", handle.port, timeout_s=patient(5)) as other:
                answer = _get(other, "/metrics")
                assert answer.startswith(b"HTTP/1.1 200") and b"headroom_inflight_requests" in answer
                assert other.recv(1) == b""
            assert ADMIN_SLOTS_PER_SOURCE * 2 == ADMIN_SLOTS
        finally:
            for sock in held:
                sock.close()


def test_keep_alive_pollers_never_hold_the_reserved_slots(tmp_path):
    """The client slots are full; 10 keep-alive /healthz pollers from one address poll through the
    reserved slots. Another address's scrapes and probes are all answered 200: the pollers'
    connections close after each answer, and they hold at most half of the slots."""
    stop = threading.Event()
    polls: list[int] = []

    def poll(port: int) -> None:
        for _ in range(10_000):  # bounded; ends with the test
            try:
                with connect_from("127.0.0.2", port, timeout_s=patient(5)) as sock:
                    while not stop.is_set():  # keep-alive, as long as the sidecar keeps the connection
                        answer = _get(sock, "/healthz")
                        polls.append(int(answer[9:12] or 0))
                        if not answer or b"connection: close" in answer.lower():
                            break
                        stop.wait(0.005)
            except OSError:
                pass
            if stop.wait(0.005):
                return

    with FakeUpstream() as fake, _guarded(tmp_path, fake.url, {"max_connections": 3}) as (app, handle):
        held = [socket.create_connection(("127.0.0.1", handle.port), timeout=patient(5)) for _ in range(3)]
        pollers = [threading.Thread(target=poll, args=(handle.port,), daemon=True) for _ in range(10)]
        try:
            for poller in pollers:
                poller.start()
            wait_until(lambda: len(polls) >= 50, 10, what="the pollers polling")
            statuses = []
            for _ in range(30):
                for path in ADMIN:
                    with connect_from("127.0.0.3", handle.port, timeout_s=patient(5)) as monitor:
                        statuses.append(_get(monitor, path)[:12])
            assert set(statuses) == {b"HTTP/1.1 200"}, statuses
            assert 200 in polls
        finally:
            stop.set()
            for poller in pollers:
                poller.join(patient(10))
            for sock in held:
                sock.close()


# --- per-source bounds --------------------------------------------------------------------------


def test_one_address_past_its_connection_bound_gets_429_and_only_monitoring(tmp_path):
    with (
        FakeUpstream() as fake,
        _guarded(tmp_path, fake.url, {"max_connections_per_source": 3}) as (
            app,
            handle,
        ),
    ):
        held = [connect_from("127.0.0.2", handle.port, timeout_s=patient(5)) for _ in range(3)]
        try:
            with connect_from("127.0.0.2", handle.port, timeout_s=patient(5)) as extra:
                extra.sendall(HALF[:-10] + BODY)
                answer = _until_closed(extra)
            assert answer.startswith(b"HTTP/1.1 429 Too Many Requests")
            assert b"retry-after: 1\r\n" in answer and b'"limit":"--max-connections-per-source"' in answer
            with connect_from(
                "127.0.0.2", handle.port, timeout_s=patient(5)
            ) as probe:  # monitoring still answered
                assert _get(probe, "/healthz").startswith(b"HTTP/1.1 200")
            with connect_from(
                "127.0.0.3", handle.port, timeout_s=patient(5)
            ) as other:  # another address: served
                other.sendall(HALF[:-10] + BODY)
                assert other.recv(65536).startswith(b"HTTP/1.1 200")
            assert _refused(app, "source_connections") == 1
            assert not sidecar_state(app).tracker.live and len(fake.requests) == 1
        finally:
            for sock in held:
                sock.close()


def test_one_address_past_its_partial_requests_bound_gets_429(tmp_path, caplog):
    """Three half-sent bodies from one address are held; its fourth is refused with 429 at once;
    a whole request from it is served, another address's half-sent body is not refused, and once
    one of the three completes its body, the address may begin another."""
    caplog.set_level(logging.WARNING, logger="collector")
    bounds = {"max_partial_requests_per_source": 3}
    with FakeUpstream() as fake, _guarded(tmp_path, fake.url, bounds) as (app, handle):
        held = []
        try:
            for _ in range(3):
                sock = connect_from("127.0.0.2", handle.port, timeout_s=patient(5))
                sock.sendall(HALF)
                held.append(sock)
            with connect_from("127.0.0.2", handle.port, timeout_s=patient(5)) as fourth:
                fourth.sendall(HALF)
                answer = _until_closed(fourth)
            assert answer.startswith(b"HTTP/1.1 429") and b"retry-after: 1\r\n" in answer
            assert b"--max-partial-requests-per-source" in answer
            assert _refused(app, "source_partial_requests") == 1
            with connect_from("127.0.0.2", handle.port, timeout_s=patient(5)) as whole:
                whole.sendall(HALF[:-10] + BODY)
                assert whole.recv(65536).startswith(b"HTTP/1.1 200")
            with connect_from("127.0.0.3", handle.port, timeout_s=patient(5)) as other:
                other.sendall(HALF)
                other.sendall(BODY[10:])  # its body completes: it was held, not refused
                assert other.recv(65536).startswith(b"HTTP/1.1 200")
            held[0].sendall(BODY[10:])
            assert held[0].recv(65536).startswith(b"HTTP/1.1 200")  # the address is at 2 now
            again = connect_from("127.0.0.2", handle.port, timeout_s=patient(5))
            held.append(again)
            again.sendall(HALF)
            again.sendall(BODY[10:])
            assert again.recv(65536).startswith(b"HTTP/1.1 200")
            assert _refused(app, "source_partial_requests") == 1
            lines = [r.getMessage() for r in caplog.records if "not fully sent" in r.getMessage()]
            assert len(lines) == 1 and "--max-partial-requests-per-source" in lines[0], lines
        finally:
            for sock in held:
                sock.close()


# --- the acceptance: 10 keep-alive pollers and 4,000 half-sent bodies from one address -----------

ATTACK, POLLERS, SAMPLES = 4_000, 10, 50
STARVED_S = 2.5  # half the 5 s --idle-timeout: past it a monitor waits for a slot to be freed


def _monitor(url: str, samples: int = SAMPLES) -> dict[str, list[float]]:
    """Seconds each of `samples` rounds of /metrics, /healthz and /readyz took from another address
    (one kept-alive connection); every answer must be 200."""
    took: dict[str, list[float]] = {path: [] for path in ADMIN}
    nodelay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    with httpx.Client(timeout=patient(5), transport=nodelay) as monitor:
        for _ in range(samples):
            for path in ADMIN:
                start = time.perf_counter()
                answer = monitor.get(url + path)
                took[path].append(time.perf_counter() - start)
                assert answer.status_code == 200, (path, answer.status_code)
    return took


def _common_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))  # soft and hard: cannot be raised


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.serial  # a latency limit
def test_monitoring_answers_within_100_ms_p99_beside_keep_alive_pollers_and_4000_half_sent_bodies(tmp_path):
    """`headroom run` on its default listener under the common open-file limit of 1,024 (which
    makes its connection cap 480, so the bodies overflow it, as in the issue): one address opens
    4,000 connections that each send headers and part of a body, then polls /healthz over 10
    keep-alive connections. From another address /metrics, /healthz and /readyz each answer 50
    times, every one 200, the p99 under 100 ms (on a busy host: RATIO times their p99 before the
    attack, best of three windows, never past STARVED_S; support/latency.py). Before this fix the bodies held every client slot
    and the pollers the 8 reserved ones: 503 for as long as they liked."""
    raise_file_limit(ATTACK + 1024)  # this process holds the other end of every socket
    log = tmp_path / "sidecar.log"
    args = ["run", "--upstream", "", "--db", str(tmp_path / "log.duckdb"), "--engine", "none", "--no-jobs"]
    stop = threading.Event()
    attack: list[socket.socket] = []
    polls: list[int] = []

    def poll(port: int) -> None:
        for _ in range(10_000):  # bounded; ends with the test
            try:
                with connect_from("127.0.0.2", port, timeout_s=patient(5)) as sock:
                    while not stop.is_set():
                        answer = _get(sock, "/healthz")
                        polls.append(int(answer[9:12] or 0))
                        if not answer or b"connection: close" in answer.lower():
                            break
                        stop.wait(0.01)
            except OSError:
                pass
            if stop.wait(0.01):
                return

    with FakeUpstream() as fake:
        args[2] = fake.url
        with headroom_process(*args, health="/healthz", log=log, preexec_fn=_common_file_limit) as url:
            port = int(url.rsplit(":", 1)[1])
            _monitor(url, samples=5)  # the first answers (imports, the first collection)
            baseline = _monitor(url)
            limit = bound(0.100, max(map(p99, baseline.values())), STARVED_S)
            pollers = [threading.Thread(target=poll, args=(port,), daemon=True) for _ in range(POLLERS)]
            try:
                began = time.monotonic()
                for _ in range(ATTACK):
                    sock = connect_from("127.0.0.2", port, timeout_s=patient(10))
                    attack.append(sock)
                    with contextlib.suppress(OSError):  # refused and closed already: a reset
                        sock.sendall(HALF)
                opened = time.monotonic() - began
                for poller in pollers:
                    poller.start()
                wait_until(lambda: len(polls) >= 10 * POLLERS, 10, what="the pollers polling")
                windows = best_window(
                    lambda: _monitor(url), lambda took: max(map(p99, took.values())) < limit
                )
                metrics = httpx.get(url + "/metrics", timeout=patient(5)).text
            finally:
                stop.set()
                for poller in pollers:
                    poller.join(patient(10))
                for sock in attack:
                    sock.close()
    print(
        f"\n{ATTACK} half-sent bodies opened in {opened:.1f} s, {len(polls)} polls; limit {limit * 1000:.0f} ms; "
        + "; ".join(
            ", ".join(
                f"{path} p50 {p50(t) * 1000:.1f} ms p99 {p99(t) * 1000:.1f} ms" for path, t in took.items()
            )
            for took in (baseline, *windows)
        )
    )
    assert min(max(map(p99, took.values())) for took in windows) < limit, windows
    assert all(max(map(max, took.values())) < STARVED_S for took in windows)
    assert 'headroom_connections_refused_total{reason="source_partial_requests"}' in metrics
    refused = float(metrics.split('reason="source_partial_requests"} ')[1].split()[0])
    assert refused >= ATTACK - 480, metrics  # the address kept at most its quarter of the cap
    lines = [line for line in log.read_text().splitlines() if "--max-partial-requests-per-source" in line]
    assert lines and " WARNING " in lines[0]


# --- the acceptance: 16 clients that stop reading against a pool of 16 ---------------------------


class _SilentStreamUpstream:
    """Answers every completions request at once with one SSE event of EVENT_BYTES, then keeps the
    stream open and silent: a client that reads nothing makes the sidecar pause it, and its
    upstream connection stays taken. Counts the requests it read and the connections the sidecar
    closed."""

    EVENT_BYTES = 512 * 1024

    def __init__(self) -> None:
        self.requests = self.closed = 0
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        assert ready.wait(patient(10))

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        streamed = False
        try:
            for _ in range(1000):  # requests per connection: bounded
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                payload = json.loads(await reader.readexactly(length))
                self.requests += 1
                if not payload.get("stream"):  # a whole answer, at once
                    answer = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                        % (len(answer), answer)
                    )
                    await writer.drain()
                    continue
                streamed = True
                event = b'data: {"choices":[{"delta":{"content":"' + b"x" * self.EVENT_BYTES + b'"}}]}\n\n'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                    + b"%x\r\n%b\r\n" % (len(event), event)
                )
                await writer.drain()
                await reader.read()  # silent until the sidecar leaves
                return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed += streamed
            writer.close()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(patient(10))


def _stalled_reader(port: int) -> socket.socket:
    """A client that sends a streamed request and reads nothing; a small window and segment size
    keep the sidecar's kernel buffer for it small, so the event fills it and the sidecar pauses."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    sock.connect(("127.0.0.1", port))
    body = b'{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    sock.sendall(
        f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


@pytest.mark.slow
def test_16_stalled_readers_never_keep_another_client_waiting_past_the_deadline(tmp_path, caplog):
    """A pool of 16 upstream connections, each held by a client that reads nothing: another
    client is answered 503 naming --upstream-wait-timeout once its 1 s wait is over (counted,
    logged, a row `overloaded`); past --write-stall-timeout (3 s) the 16 are cut off, their rows
    client_cancelled and their upstream connections closed, and the next client is served."""
    caplog.set_level(logging.WARNING, logger="collector")
    wait_s, stall_s = 1.0, 3.0
    upstream = _SilentStreamUpstream()
    config = {"max_connections": 16, "upstream_wait_timeout_s": wait_s}
    stalled: list[socket.socket] = []
    try:
        with _guarded(tmp_path, upstream.url, {"write_stall_timeout_s": stall_s}, **config) as (app, handle):
            stalled_at = time.monotonic()
            stalled += [_stalled_reader(handle.port) for _ in range(16)]
            wait_until(lambda: upstream.requests == 16, 10, what="every stalled stream reaching the upstream")
            began = time.monotonic()
            answer = httpx.post(handle.url + PATH, json=CHAT | {"stream": False}, timeout=patient(10))
            waited = time.monotonic() - began
            print(f"\nanswered {answer.status_code} after {waited:.2f} s (deadline {wait_s:g} s)")
            assert answer.status_code == 503 and wait_s - 0.05 <= waited < wait_s + 1.0
            error = answer.json()["error"]
            assert error["limit"] == "--upstream-wait-timeout" and error["type"] == "overloaded"
            assert "all 16 in use" in error["message"]
            assert sidecar_state(app).registry.get_sample_value("headroom_upstream_wait_timeouts_total") == 1
            assert _refused(app, "write_stall") == 0  # not yet: they stalled under 3 s ago
            lines = [r.getMessage() for r in caplog.records if "--upstream-wait-timeout" in r.getMessage()]
            assert len(lines) == 1, lines  # one WARNING per class per minute
            # past the stall deadline every stalled client is cut off and its connection freed
            wait_until(
                lambda: _refused(app, "write_stall") == 16, stall_s + 5, what="16 stalled clients cut off"
            )
            assert time.monotonic() - stalled_at >= stall_s
            wait_until(lambda: upstream.closed == 16, 5, what="their upstream connections closed")
            wait_until(lambda: not sidecar_state(app).tracker.live, 5, what="their requests finished")
            began = time.monotonic()
            served = httpx.post(handle.url + PATH, json=CHAT | {"stream": False}, timeout=patient(10))
            assert served.status_code == 200 and time.monotonic() - began < wait_s
            assert sidecar_state(app).writer.flush(patient(30))
            rows = sidecar_state(app).batch_sink.query_dicts(
                "SELECT outcome, status_code, error FROM requests ORDER BY admitted_at", ()
            )
            outcomes = [row["outcome"] for row in rows]
            assert outcomes.count("client_cancelled") == 16 and outcomes[-1] == "ok", outcomes
            (shed,) = [row for row in rows if row["outcome"] == "overloaded"]
            assert shed["status_code"] == 503 and "--upstream-wait-timeout" in shed["error"]
            stall_lines = [
                r.getMessage() for r in caplog.records if "--write-stall-timeout" in r.getMessage()
            ]
            assert len(stall_lines) == 1, stall_lines  # one WARNING for the 16
    finally:
        for sock in stalled:
            sock.close()
        upstream.stop()
