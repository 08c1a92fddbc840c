"""Fault injection: a hostile upstream (support.upstream's raw-socket modes) against a real sidecar.

Every case ends with the live gauges at 0, exactly one row with the right outcome, the client
answered within the read timeout, and memory bounded; none leaves upstream bytes in the row or
in our own error answer.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import tracemalloc

import httpx
import pytest
from support.sidecar import CHAT, Rig, live_gauges, sidecar_rig, wait_until
from support.waiting import patient

from collector.sidecar import proxy, uvicorn_cycle  # the modules whose names the watch is looked up by
from collector.sidecar.wiring import sidecar_state

READ_TIMEOUT_S = 3.0
PATH = "/v1/chat/completions"
SECRET = "UPSTREAM-SECRET-91c2"


@pytest.fixture
def rig(tmp_path):
    with sidecar_rig(tmp_path, read_timeout_s=READ_TIMEOUT_S, max_request_body_bytes=2**20) as rig:
        yield rig


def _post(
    rig: Rig, mode: str, body: dict | None = None, *, secret: bool = True, **headers: str
) -> tuple[httpx.Response | Exception, float]:
    """POST through the sidecar; (the response or the client's exception, seconds it took).

    With `secret`, the upstream puts SECRET in its completion text and in the bytes it breaks with.
    """
    began = time.monotonic()
    headers = {"x-fake": mode, **({"x-fake-text": SECRET} if secret else {}), **headers}
    try:
        response = httpx.post(
            rig.url + PATH, json=body or CHAT, timeout=patient(READ_TIMEOUT_S + 2), headers=headers
        )
    except httpx.HTTPError as exc:
        return exc, time.monotonic() - began
    return response, time.monotonic() - began


def _settled_row(rig: Rig, **expected: object) -> dict:
    """After the request: gauges back to 0, one row, with `expected` values."""
    wait_until(lambda: not sidecar_state(rig.app).tracker.live, 5, what="the request leaving the live set")
    assert set(live_gauges(rig)) == {0.0}
    rows = rig.rows()
    assert len(rows) == 1, rows
    for key, value in expected.items():
        assert rows[0][key] == value, (key, rows[0][key], value)
    assert SECRET not in repr(rows[0])
    return rows[0]


def test_broken_chunk_framing_ends_the_stream_at_once_as_upstream_error(rig):
    answer, took = _post(rig, "broken-framing")
    assert isinstance(answer, httpx.RemoteProtocolError)  # the client sees the break
    assert took < READ_TIMEOUT_S  # no hang until a timeout
    row = _settled_row(rig, outcome="upstream_error", status_code=200)
    assert row["error"].startswith("bad_framing: ") and row["completion_tokens"] == 10  # two events of 5


def test_an_unparseable_upstream_head_is_our_502_without_its_bytes(rig):
    answer, took = _post(rig, "garbage-head")
    assert isinstance(answer, httpx.Response) and answer.status_code == 502 and took < READ_TIMEOUT_S
    assert SECRET not in answer.text and answer.json()["error"]["type"] == "upstream_error"
    _settled_row(rig, outcome="upstream_error", status_code=502)


@pytest.mark.parametrize("mode", ["endless-event", "huge-event"])
def test_an_event_past_the_limit_ends_the_stream_with_memory_bounded(rig, mode):
    tracemalloc.start()
    try:
        answer, took = _post(rig, mode)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(answer, httpx.RemoteProtocolError) and took < READ_TIMEOUT_S
    assert peak < 16 * 2**20  # the fake sends 64 MiB (endless) or 4 MiB; the limit is 1 MiB
    row = _settled_row(rig, outcome="upstream_error")
    assert "--max-sse-event-bytes" in row["error"]


def test_expect_100_continue_is_not_forwarded(rig):
    answer, took = _post(rig, "ok", **{"Expect": "100-continue"})
    assert isinstance(answer, httpx.Response) and answer.status_code == 200 and took < READ_TIMEOUT_S
    assert "expect" not in rig.fake.requests[-1]["headers"]
    _settled_row(rig, outcome="ok")


def test_a_non_sse_answer_to_a_stream_is_streamed_through(rig):
    gate = rig.fake.gate("non-sse-1")
    with httpx.stream(
        "POST",
        rig.url + PATH,
        json=CHAT,
        timeout=patient(READ_TIMEOUT_S),
        headers={"x-fake": "non-sse", "x-test-id": "non-sse-1"},
    ) as response:
        parts = response.iter_bytes()
        first = next(parts)  # arrives while the upstream still holds the rest back
        gate.set()
        rest = b"".join(parts)
    assert first == b'{"part":1}\n' and rest == b'{"part":2}\n'
    assert response.headers["content-type"] == "application/x-ndjson"
    _settled_row(rig, outcome="ok", status_code=200)


@pytest.mark.parametrize("mode", ["usage-negative", "usage-huge", "usage-string", "usage-float"])
def test_rejected_usage_numbers_make_the_row_estimated(rig, mode):
    answer, _ = _post(rig, mode, secret=False)
    assert isinstance(answer, httpx.Response) and answer.status_code == 200
    _settled_row(rig, outcome="ok", usage_source="estimated", completion_tokens=5)


def _stream_request(mode: str, test_id: str, **headers: str) -> bytes:
    """A streamed completions request as raw bytes: a client that can hang up at any byte."""
    body = b'{"model":"m1","stream":true}'
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (
        f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-fake: {mode}\r\n"
        f"{extra}x-test-id: {test_id}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _read_until(client: socket.socket, marker: bytes) -> bytes:
    """What the sidecar sent, up to and including `marker` (fails if it closes first)."""
    client.settimeout(patient(READ_TIMEOUT_S))
    received = b""
    while marker not in received:
        part = client.recv(65536)
        assert part, received
        received += part
    return received


def test_a_disconnect_at_the_headers_is_client_cancelled_without_a_runtime_error(rig, caplog):
    with socket.create_connection(("127.0.0.1", rig.sidecar.port)) as client:
        client.sendall(_stream_request("gate-headers", "gone-1"))
        assert rig.fake.expect("gone-1").wait(patient(5))
    # awaited, not raced: a FIN sent from one CPU can reach the sidecar after bytes the upstream
    # sent later from another (CI once logged this request `ok`, its answer written before the
    # FIN was read); what is tested is that a request the client left while its headers were
    # pending ends as client_cancelled, and the headers arriving afterwards break nothing
    wait_until(lambda: not sidecar_state(rig.app).tracker.live, 5, what="the sidecar seeing the client gone")
    rig.fake.gate("gone-1").set()  # the headers leave the upstream after the client is gone
    row = _settled_row(rig, outcome="client_cancelled")
    assert row["error"] == "client disconnected"
    assert "RuntimeError" not in caplog.text and "Expected ASGI" not in caplog.text


def test_a_client_gone_after_done_had_its_answer_and_is_ok(rig):
    """Many SSE clients hang up at [DONE], before the upstream's body (and so the relay) ends:
    the client had every event, so the row is ok, with the upstream's usage."""
    with socket.create_connection(("127.0.0.1", rig.sidecar.port)) as client:
        client.sendall(_stream_request("gate-end", "done-1"))
        _read_until(client, b"data: [DONE]")
    # the client has closed; the upstream's body ends only now
    rig.fake.gate("done-1").set()
    row = _settled_row(rig, outcome="ok", usage_source="upstream", completion_tokens=5)
    assert row["error"] is None


def test_a_client_gone_before_done_is_client_cancelled(rig):
    """The same stream, the client gone one event earlier: it never had the whole answer."""
    with socket.create_connection(("127.0.0.1", rig.sidecar.port)) as client:
        client.sendall(_stream_request("gate-headers", "early-1", **{"x-fake-delay": "0.2"}))
        assert rig.fake.expect("early-1").wait(patient(5))
        rig.fake.gate("early-1").set()
        _read_until(client, b"tok0")  # the first token, then gone
    row = _settled_row(rig, outcome="client_cancelled")
    assert row["error"] == "client disconnected"


def test_the_sidecars_server_is_watched_without_a_task_and_shows_the_clients_transport(rig, monkeypatch):
    """On uvicorn (what `headroom run` serves on) the disconnect watch is the cycle's own event,
    no task per request (collector.sidecar.uvicorn_cycle.CycleWatch), and the decision at an
    exchange's end can read the client's transport (uvicorn_cycle.client_closing); were it hidden, a FIN read with
    the last upstream bytes would depend on the order of one poll's callbacks."""
    watches: list[tuple[object, bool | None]] = []
    original = proxy.CycleWatch.on

    def recorded(receive, gone):
        watches.append((watch := original(receive, gone), uvicorn_cycle.client_closing(receive)))
        return watch

    monkeypatch.setattr(proxy.CycleWatch, "on", staticmethod(recorded))
    answer, _ = _post(rig, "ok")
    assert isinstance(answer, httpx.Response) and answer.status_code == 200
    _settled_row(rig, outcome="ok")
    assert len(watches) == 1
    watch, closing = watches[0]
    assert isinstance(watch, uvicorn_cycle.CycleWatch) and closing is False


def test_one_warning_per_failure_class_per_interval(rig, caplog):
    caplog.set_level(logging.WARNING, logger="collector")
    for _ in range(3):
        _post(rig, "broken-framing")
    wait_until(lambda: len(rig.rows()) == 3, 5, what="three rows")
    warnings = [r for r in caplog.records if r.name.startswith("collector") and "upstream" in r.getMessage()]
    assert len(warnings) == 1 and SECRET not in caplog.text


def test_metrics_render_off_the_event_loop(rig):
    """A slow collector holds /metrics, not the proxy: a request completes while it renders."""
    release = threading.Event()

    class Slow:
        def collect(self):
            release.wait(patient(5))
            return []

    sidecar_state(rig.app).registry.register(Slow())
    scrape = threading.Thread(target=lambda: httpx.get(rig.url + "/metrics", timeout=patient(10)))
    scrape.start()
    answer, took = _post(rig, "ok")  # the scrape is rendering in its thread meanwhile
    release.set()
    scrape.join(patient(10))
    assert isinstance(answer, httpx.Response) and answer.status_code == 200 and took < 4


def _raw(rig: Rig, target: str, body: bytes = b'{"model":"m1","stream":false}') -> bytes:
    """One request with a path sent byte for byte (httpx would normalise it first)."""
    head = (
        f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", rig.sidecar.port), timeout=patient(5)) as client:
        client.sendall(head + body)
        chunks = []
        while chunk := client.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "spelling",
    ["/v1/chat/completions/", "//v1//chat/completions", "/v1/./chat/completions", "/v1/%2e/chat/completions"],
)
def test_every_spelling_of_the_completions_path_is_accounted(rig, spelling):
    answer = _raw(rig, spelling)
    assert answer.startswith(b"HTTP/1.1 200")
    assert rig.fake.targets[-1][0] == b"/v1/chat/completions"
    _settled_row(rig, outcome="ok", endpoint="/v1/chat/completions")


@pytest.mark.parametrize("spelling", ["/v1/../metrics", "/v1/x/%2e%2e/models", "/v1/a%2F..%2Fb"])
def test_traversal_is_refused_and_never_reaches_the_engine(rig, spelling):
    answer = _raw(rig, spelling)
    assert answer.startswith(b"HTTP/1.1 400") and b"'..'" in answer
    assert rig.fake.targets == []


def test_a_body_over_the_limit_is_413_naming_the_flag_with_a_row(rig):
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * (2**20 + 10)}]}
    answer, _ = _post(rig, "ok", body)
    assert isinstance(answer, httpx.Response) and answer.status_code == 413
    assert answer.json()["error"]["limit"] == "--max-request-body-bytes"
    assert rig.fake.requests == []
    _settled_row(rig, outcome="bad_request", status_code=413)


@pytest.mark.parametrize(("depth", "status"), [(300, 200), (1100, 400)])
def test_deep_json_is_forwarded_or_refused_never_a_500(rig, depth, status):
    body = (
        '{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}],"meta":'
        + "[" * depth
        + "]" * depth
        + "}"
    ).encode()
    answer = _raw(rig, PATH, body)
    assert answer.startswith(f"HTTP/1.1 {status}".encode())
    _settled_row(rig, outcome="ok" if status == 200 else "bad_request", status_code=status)


def test_big_integers_reach_the_engine_exactly(rig):
    body = (
        b'{"model":"m1","stream":true,"seed":18446744073709551617,'
        b'"messages":[{"role":"user","content":"hi"}]}'
    )
    assert _raw(rig, PATH, body).startswith(b"HTTP/1.1 200")
    sent = rig.fake.requests[-1]["payload"]
    assert sent["seed"] == 18446744073709551617 and sent["stream_options"] == {"include_usage": True}
    _settled_row(rig, outcome="ok", usage_source="upstream")
