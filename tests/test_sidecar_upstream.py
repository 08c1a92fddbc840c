"""collector/sidecar/upstream.py, the sidecar's one upstream client, against the suite's fake upstream
(raw sockets, so it can break HTTP): pooling and its bound, the single retry on a stale pooled
connection, timeouts, broken answers, and a cancel that closes the connection."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from support.processes import free_port
from support.upstream import FakeUpstream

from collector.sidecar.exchange import (
    BufferedBody,
    UpstreamBodyBroken,
    UpstreamConnectError,
    UpstreamError,
    UpstreamReadTimeout,
    UpstreamUnparsable,
)
from collector.sidecar.upstream import H1Pool

BODY = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()


def _headers(**fake: str) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json")] + [
        (f"x-{name.replace('_', '-')}".encode(), value.encode()) for name, value in fake.items()
    ]


class _Collect:
    """A sink that keeps what it is given, as the relay would forward it."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.failure: UpstreamError | None = None

    def body(self, data: bytes) -> None:
        self.reads.append(data)

    def broken(self, exc: UpstreamError) -> None:
        self.failure = exc


async def _whole(pool: H1Pool, path: bytes = b"/v1/chat/completions", **fake: str) -> tuple[int, bytes, bool]:
    exchange = await pool.send(b"POST", path, _headers(**fake), BODY)
    sink = _Collect()
    exchange.start_body(sink)
    ok = await exchange.ended
    return exchange.status, b"".join(sink.reads), ok


def test_answers_come_whole_and_one_connection_carries_them_in_turn():
    async def main(url: str) -> list[tuple[int, bytes, bool]]:
        pool = H1Pool(url)
        try:
            return [await _whole(pool, fake_tokens="3") for _ in range(3)]
        finally:
            pool.close()

    with FakeUpstream() as upstream:
        answers = asyncio.run(main(upstream.url))
        assert upstream.connections == 1  # kept alive and reused
    for status, body, ok in answers:
        assert status == 200 and ok
        assert body.count(b"data: ") == 1 + 3 + 1 + 1 and body.endswith(
            b"data: [DONE]\n\n"
        )  # role, tokens, finish, DONE


def test_the_bound_holds_requests_until_a_connection_is_free():
    async def main(upstream: FakeUpstream) -> list[int]:
        pool = H1Pool(upstream.url, max_connections=2)
        try:
            sends = [
                asyncio.ensure_future(_whole(pool, fake="gate-headers", test_id=f"t{i}")) for i in range(3)
            ]
            for i in range(2):
                await asyncio.to_thread(upstream.expect(f"t{i}").wait, 10)
            assert upstream.connections == 2 and not upstream.expect("t2").is_set()
            for i in range(3):
                upstream.gate(f"t{i}").set()
            return [status for status, _, _ in await asyncio.gather(*sends)]
        finally:
            pool.close()

    with FakeUpstream() as upstream:
        assert asyncio.run(main(upstream)) == [200, 200, 200]
        assert upstream.connections == 2


def test_a_stale_pooled_connection_is_retried_once_on_a_new_one():
    async def main(url: str) -> list[tuple[int, int]]:
        pool = H1Pool(url)
        out = []
        try:
            for _ in range(4):
                exchange = await pool.send(b"POST", b"/v1/chat/completions", _headers(), BODY)
                exchange.start_body(_Collect())
                assert await exchange.ended
                out.append((exchange.status, exchange.retries))
        finally:
            pool.close()
        return out

    with FakeUpstream(one_request_per_connection=True) as upstream:
        answers = asyncio.run(main(upstream.url))
    assert [status for status, _ in answers] == [200] * 4
    assert answers[0][1] == 0 and sum(retries for _, retries in answers) >= 2


def test_a_failure_on_a_new_connection_is_not_retried():
    async def main(url: str) -> None:
        pool = H1Pool(url)
        try:
            await pool.send(b"POST", b"/v1/chat/completions", _headers(), BODY)
        finally:
            pool.close()

    with FakeUpstream(drop_fresh=True) as upstream:
        with pytest.raises(UpstreamError, match="closed the connection"):
            asyncio.run(main(upstream.url))
        assert upstream.requests_read == 1


def test_connect_and_read_failures_are_ours_and_typed():
    async def refused() -> None:
        await H1Pool(f"http://127.0.0.1:{free_port()}").send(b"POST", b"/", [], b"")

    with pytest.raises(UpstreamConnectError, match="cannot connect"):
        asyncio.run(refused())

    async def main(url: str, read_timeout_s: float, **fake: str) -> tuple[int, bytes, bool]:
        pool = H1Pool(url, read_timeout_s=read_timeout_s)
        try:
            return await _whole(pool, **fake)
        finally:
            pool.close()

    with FakeUpstream() as upstream:
        with pytest.raises(UpstreamReadTimeout, match="sent nothing for 0.3 s"):
            asyncio.run(main(upstream.url, 0.3, fake="hang"))
        with pytest.raises(UpstreamUnparsable) as caught:
            # time enough for the fake's broken head to arrive on a busy host
            asyncio.run(main(upstream.url, 5.0, fake="garbage-head", fake_text="upstream secret"))
        assert "secret" not in str(caught.value)  # never the peer's bytes


def test_a_body_that_breaks_tells_the_sink_and_ends_false():
    async def main(url: str) -> tuple[_Collect, bool]:
        pool = H1Pool(url)
        try:
            exchange = await pool.send(
                b"POST", b"/v1/chat/completions", _headers(fake="broken-framing"), BODY
            )
            sink = _Collect()
            exchange.start_body(sink)
            return sink, await exchange.ended
        finally:
            pool.close()

    with FakeUpstream() as upstream:
        sink, ok = asyncio.run(main(upstream.url))
    assert not ok and isinstance(sink.failure, UpstreamBodyBroken)
    assert b"".join(sink.reads).count(b"data: ") == 3  # the role chunk and two tokens came first


def test_abandoning_an_exchange_closes_its_connection():
    async def main(upstream: FakeUpstream) -> None:
        pool = H1Pool(upstream.url)
        try:
            exchange = await pool.send(b"GET", b"/v1/slow", [], b"")
            exchange.start_body(_Collect())
            exchange.abandon()
            assert await exchange.ended is False
            await asyncio.to_thread(upstream.slow_client_left.wait, 10)
        finally:
            pool.close()

    with FakeUpstream() as upstream:
        asyncio.run(main(upstream))
        assert upstream.slow_client_left.is_set()


def test_a_cancelled_send_leaves_no_connection_behind():
    async def main(upstream: FakeUpstream) -> int:
        pool = H1Pool(upstream.url)
        headers = _headers(fake="hang", test_id="cancelled")
        send = asyncio.ensure_future(pool.send(b"POST", b"/v1/chat/completions", headers, BODY))
        await asyncio.to_thread(upstream.expect("cancelled").wait, 10)
        send.cancel()
        with pytest.raises(asyncio.CancelledError):
            await send
        await asyncio.sleep(0)
        return pool._open

    with FakeUpstream() as upstream:
        assert asyncio.run(main(upstream)) in (0, 1)  # closing; forgotten once its loss is read


def test_url_credentials_become_basic_authorization_and_the_base_path_prefixes_the_target():
    async def main(url: str) -> None:
        pool = H1Pool(url)
        try:
            exchange = await pool.send(b"POST", b"/v1/chat/completions?x=1", _headers(), BODY)
            body = BufferedBody(exchange)
            while await body.readany():
                pass
        finally:
            pool.close()

    with FakeUpstream() as upstream:
        asyncio.run(main(upstream.url.replace("http://", "http://user:p%40ss@")))
        headers = upstream.requests[0]["headers"]
        assert headers["authorization"] == "Basic " + base64.b64encode(b"user:p@ss").decode()
        assert upstream.targets[-1] == (b"/v1/chat/completions", b"x=1")


def test_the_buffered_body_reads_the_whole_answer_and_its_length():
    async def main(url: str) -> tuple[int | None, bytes]:
        pool = H1Pool(url)
        try:
            exchange = await pool.send(b"POST", b"/v1/chat/completions", _headers(), b'{"model":"m"}')
            body = BufferedBody(exchange)
            parts = []
            while data := await body.readany():
                parts.append(data)
            return body.content_length, b"".join(parts)
        finally:
            pool.close()

    with FakeUpstream() as upstream:
        length, data = asyncio.run(main(upstream.url))
    assert length == len(data) and json.loads(data)["object"] == "chat.completion"
