"""The proxy's ASGI handlers: accounted completions endpoints and the untouched pass-through.

Raw ASGI rather than framework responses, because the proxy must (1) learn the upstream status
before it starts the client's response, yet (2) keep the upstream wait cancellable when the client
goes away. Each accounted request runs its upstream exchange in a task while a watcher awaits the
client's `http.disconnect`; whichever ends first decides. The terminal transition is synchronous
and idempotent, so the `finally` blocks here can always complete it, even under cancellation
(the gauge leak peers had, docs/domain.md §9).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

import aiohttp
import orjson
from yarl import URL

from collector.sidecar.requests import ParsedRequest, parse_request
from collector.sidecar.tenants import LabelCap, resolve_tenant
from collector.sidecar.tracker import LiveRequest, Tracker
from collector.sse import DONE, ERROR, MALFORMED, EventSplitter, inspect_event
from collector.upstream import UpstreamClient

__all__ = ["CompletionsProxy", "PassThrough", "outcome_for_status"]

log = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailers", b"transfer-encoding", b"upgrade", b"host", b"content-length",
})
_USAGE_NULL = b',"usage":null'


_PROBE_ID = re.compile(r"probe-[A-Za-z0-9._:-]{1,120}")
_TASK_CLASS = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_MAX_TASK_CLASSES = 16


def outcome_for_status(status: int) -> str:
    """Outcome of a request the upstream answered with `status`, e.g. 429 -> 'rate_limited'.

    503 is `overloaded`: an engine shedding load (vLLM's --max-num-queued-reqs) or a gateway with
    no healthy engine behind it. Both 429 and 503 count as load shedding and as errors.
    """
    if status == 429:
        return "rate_limited"
    if status == 503:
        return "overloaded"
    if status >= 500:
        return "upstream_error"
    if status >= 400:
        return "bad_request"
    return "ok"


def _request_headers(scope: dict, *, identity: bool) -> list[tuple[str, str]]:
    headers = [(k.decode("latin-1"), v.decode("latin-1"))
               for k, v in scope["headers"] if k not in _HOP_BY_HOP]
    if identity:  # the proxy reads the stream, so it must arrive uncompressed
        headers = [(k, v) for k, v in headers if k.lower() != "accept-encoding"]
        headers.append(("Accept-Encoding", "identity"))
    return headers


def _response_headers(raw: tuple[tuple[bytes, bytes], ...], *, keep_length: bool) -> list:
    return [(k, v) for k, v in raw
            if (k.lower() not in _HOP_BY_HOP) or (keep_length and k.lower() == b"content-length")]


def _target(upstream: str, scope: dict) -> URL:
    """Upstream URL for this request: the path as the client encoded it, and its query string.

    `scope["path"]` is percent-decoded (a model id `org%2Fname` would become two segments), so the
    raw path is forwarded, unquoted by nobody.
    """
    raw = scope.get("raw_path")
    query = scope.get("query_string")
    tail = ("?" + query.decode("latin-1")) if query else ""
    if raw:
        return URL(upstream + raw.decode("latin-1") + tail, encoded=True)
    return URL(upstream + scope["path"] + tail)


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def _read_body(receive) -> bytes | None:
    """The whole request body, or None when the client disconnected before sending it."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send_error(send, status: int, message: str, kind: str) -> None:
    body = orjson.dumps({"error": {"message": message, "type": kind, "code": status}})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class CompletionsProxy:
    """ASGI app for POST /v1/chat/completions and /v1/completions: proxied and accounted."""

    def __init__(self, client: UpstreamClient, upstream: str,
                 tracker: Tracker, *, tenant_header: str, engine=None) -> None:
        self._client = client
        self._upstream = upstream
        self._tracker = tracker
        self._tenant_header = tenant_header.lower().encode("latin-1")
        self._task_cap = LabelCap(_MAX_TASK_CLASSES)  # named by probes: few, but a client could lie
        self._engine = engine

    async def __call__(self, scope, receive, send) -> None:
        body = await _read_body(receive)
        if body is None:
            return  # never admitted: the client left before its request was read
        read_at = time.monotonic()  # the sidecar's own time (headroom_proxy_overhead_seconds) starts
        parsed = parse_request(body)
        request = self._admit(scope, parsed)
        work = asyncio.ensure_future(self._exchange(request, parsed, scope, send, read_at))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # the watcher only ends on the client's disconnect; otherwise this task was cancelled
            # (the server's graceful-shutdown timeout), which the row must not blame on the client
            gone = watcher.done() and not watcher.cancelled()
            watcher.cancel()
            if not work.done():
                work.cancel()  # client gone (or server shutdown): stop the upstream exchange
            self._tracker.finish(request, "client_cancelled",
                                 error="client disconnected" if gone else "sidecar shut down")

    def _admit(self, scope: dict, parsed: ParsedRequest) -> LiveRequest:
        tenant = resolve_tenant(_header(scope, self._tenant_header), _header(scope, b"authorization"))
        request = LiveRequest(parsed.model, tenant, scope["path"], parsed.stream, parsed.max_tokens,
                              parsed.prompt_tokens_estimate)
        if _header(scope, b"x-headroom-source") == "probe":  # `headroom probe` marks its load
            request.source = "probe"
            request.run_id = (_header(scope, b"x-headroom-run-id") or "")[:64] or None
            # the probe's own id carries the level (probe-...-c0008-000123): the stored run is
            # then estimated from this sidecar's rows; never an id already live (gauges key on it)
            probe_id = _header(scope, b"x-headroom-request-id") or ""
            if _PROBE_ID.fullmatch(probe_id) and probe_id not in self._tracker.live:
                request.request_id = probe_id
            task = _header(scope, b"x-headroom-task-class") or ""
            if _TASK_CLASS.fullmatch(task):  # the class of the probe's workload it measures
                request.task_class, request.task_class_label = task, self._task_cap(task)
        snapshot = getattr(self._engine, "latest", None)
        if snapshot is not None:
            request.engine_waiting = getattr(snapshot, "waiting", None)
            request.kv_usage = getattr(snapshot, "kv_usage_ratio", None)
        self._tracker.admit(request)
        return request

    async def _exchange(self, request: LiveRequest, parsed: ParsedRequest, scope, send,
                        read_at: float) -> None:
        started = False
        outcome, error = "upstream_error", None
        try:
            url = _target(self._upstream, scope)
            headers = _request_headers(scope, identity=True)
            request.overhead_s = time.monotonic() - read_at  # body read to upstream send
            upstream = await self._client.request("POST", url, data=parsed.body, headers=headers,
                                                  allow_redirects=False)
            if upstream.retries:
                self._tracker.retried(request, upstream.retry_reason or "stale_connection")
            async with upstream.response as resp:
                self._tracker.first_byte(request)
                request.status_code = resp.status
                outcome = outcome_for_status(resp.status)
                streaming = parsed.stream and resp.status == 200 and \
                    resp.content_type == "text/event-stream"
                await send({"type": "http.response.start", "status": resp.status,
                            "headers": _response_headers(resp.raw_headers, keep_length=not streaming)})
                started = True
                if streaming:
                    await self._relay_stream(request, parsed, resp, send, outcome)
                else:
                    await self._relay_body(request, resp, send, outcome)
                return
        except asyncio.CancelledError:
            outcome, error = "client_cancelled", "client disconnected"
            raise
        except asyncio.TimeoutError:
            outcome, error = "timeout", "upstream read timed out"
            await self._fail(request, send, started, 504, outcome, error)
        except aiohttp.ClientError as exc:
            outcome, error = "upstream_error", f"{type(exc).__name__}: {str(exc)[:120]}"
            await self._fail(request, send, started, 502, outcome, error)
        except Exception as exc:  # never let upstream input crash the sidecar
            log.exception("unexpected proxy error")
            outcome, error = "upstream_error", f"proxy error: {type(exc).__name__}"
            await self._fail(request, send, started, 502, outcome, error)
        finally:
            self._tracker.finish(request, outcome, error=error)

    async def _fail(self, request: LiveRequest, send, started: bool, status: int, outcome: str,
                    error: str) -> None:
        """Finish a failed exchange; answer the client ourselves if nothing was sent yet.

        After the response started, returning without its end makes uvicorn close the
        connection: the client sees the break, as it would have seen it from the upstream.
        """
        if started:
            self._tracker.finish(request, outcome, error=error)
            return
        self._tracker.finish(request, outcome, status_code=status, error=error)
        await _send_error(send, status, f"{outcome}: {error}", outcome)

    async def _relay_body(self, request: LiveRequest, resp: aiohttp.ClientResponse, send,
                          outcome: str) -> None:
        """Buffer a non-streamed answer, read its usage, finish, then hand it to the client."""
        body = await resp.read()
        began = time.monotonic()
        if resp.status == 200:
            try:
                payload = orjson.loads(body)
            except orjson.JSONDecodeError:
                payload = None
            usage = payload.get("usage") if isinstance(payload, dict) else None
            if isinstance(usage, dict):
                request.usage = usage
        request.overhead_s += time.monotonic() - began
        # Finish before the last send: once the client has its answer, the row and counters exist.
        self._tracker.finish(request, outcome)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _relay_stream(self, request: LiveRequest, parsed: ParsedRequest,
                            resp: aiohttp.ClientResponse, send, outcome: str) -> None:
        """Forward events as they complete; finish the request just before the final send."""
        splitter = EventSplitter()
        tracker, strip = self._tracker, parsed.usage_injected
        malformed = errored = False
        clock = time.monotonic
        async for data in resp.content.iter_any():
            began = clock()
            complete, events = splitter.feed(data)
            kept = None  # None: forward `complete` exactly as received
            for index, event in enumerate(events):
                info = inspect_event(event)
                if info is None or info is DONE:
                    pass
                elif info is MALFORMED:
                    malformed = True
                elif info is ERROR:  # the engine failed mid-stream and said so
                    errored = True
                else:
                    if info.tokens_estimate:
                        tracker.generated(request, info.tokens_estimate)
                    if info.usage is not None:
                        request.usage = info.usage  # cumulative: replace, never sum
                        if strip and info.usage_only:  # the usage chunk we asked for
                            kept = events[:index] if kept is None else kept
                            continue
                    if strip and _USAGE_NULL in event:
                        kept = events[:index] if kept is None else kept
                        event = event.replace(_USAGE_NULL, b"")
                if kept is not None:
                    kept.append(event)
            body = complete if kept is None else splitter.join(kept)
            request.overhead_s += clock() - began
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})
        rest = splitter.remainder()
        if rest:
            await send({"type": "http.response.body", "body": rest, "more_body": True})
        error = "malformed event in stream" if malformed else "error event in stream" if errored \
            else "stream ended inside an event" if rest.strip() else None
        self._tracker.finish(request, "upstream_error" if error else outcome, error=error)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class PassThrough:
    """ASGI app for every other /v1/* path: forwarded as-is, streamed back, not accounted."""

    def __init__(self, client: UpstreamClient, upstream: str) -> None:
        self._client, self._upstream = client, upstream

    async def __call__(self, scope, receive, send) -> None:
        body = await _read_body(receive)
        if body is None:
            return
        work = asyncio.ensure_future(self._forward(scope, body, send))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not work.done():
                work.cancel()  # client gone: drop the upstream request (a stream would run on)

    async def _forward(self, scope, body: bytes, send) -> None:
        url = _target(self._upstream, scope)
        started = False
        try:
            upstream = await self._client.request(scope["method"], url, data=body or None,
                                                  headers=_request_headers(scope, identity=False),
                                                  allow_redirects=False)
            async with upstream.response as resp:
                await send({"type": "http.response.start", "status": resp.status,
                            "headers": _response_headers(resp.raw_headers, keep_length=True)})
                started = True
                async for data in resp.content.iter_any():
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            if not started:
                await _send_error(send, 502, f"upstream failed: {type(exc).__name__}", "upstream_error")
        except Exception as exc:  # never let client or upstream input crash the request unanswered
            log.exception("unexpected pass-through error")
            if not started:
                await _send_error(send, 502, f"proxy error: {type(exc).__name__}", "upstream_error")
