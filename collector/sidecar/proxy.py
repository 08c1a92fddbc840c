"""The proxy's ASGI handler for the accounted completions endpoints: one owner of a request's life.

Raw ASGI rather than framework responses, because the proxy must (1) learn the upstream status
before it starts the client's response, yet (2) keep the upstream wait cancellable when the client
goes away. `CompletionsProxy.__call__` owns each request from admission to its last byte:

    read the body (bounded) -> admit -> exchange with the upstream, watched for a disconnect
    -> finish (the one call of Tracker.finish) -> send the last byte

The upstream is reached through the sidecar's one client (collector.sidecar.upstream), whose
connections hand each socket read of a stream to the relay in a callback. The exchange and its
relays (collector.sidecar.relay) return an `Ending` (collector.sidecar.ending) that says what
happened; they never finish the request and never send the last byte. The terminal transition is
synchronous and idempotent and sits in a `finally`, so it completes even under cancellation (the
gauge leak peers had, docs/domain.md §9). Once the client has its last byte, the row and the
counters exist.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
from typing import Any

from collector.goodput import HeaderMode, request_slo, slo_header_values
from collector.sidecar.client import BodyTooLarge, ClientChannel, TaskWatch, read_body
from collector.sidecar.config import MAX_REQUEST_BODY_BYTES
from collector.sidecar.ending import Ending, describe_failure
from collector.sidecar.exchange import DECODED_CODINGS, BufferedBody, DecodedBody, Exchange
from collector.sidecar.faults import FaultLog
from collector.sidecar.headers import (
    content_coding,
    media_type,
    response_headers,
    upstream_headers,
    upstream_target,
)
from collector.sidecar.live import LiveRequest, ProbeStep
from collector.sidecar.relay import relay_body, relay_exchange_stream
from collector.sidecar.requests import ParsedRequest, parse_request
from collector.sidecar.tenants import LabelCap, decode_header_text, resolve_tenant
from collector.sidecar.tracecontext import Telemetry
from collector.sidecar.tracker import Tracker
from collector.sidecar.upstream import H1Pool
from collector.sidecar.uvicorn_cycle import CycleWatch
from collector.sources import EngineSource

__all__ = ["CompletionsProxy", "ProxyLimits", "client_request_id"]

log = logging.getLogger(__name__)

Scope = dict[str, Any]


class ProxyLimits:
    """The bounds on one request (each a `headroom run` flag; docs/sidecar.md has the defaults)."""

    __slots__ = ("max_request_body_bytes", "max_buffered_response_bytes", "max_sse_event_bytes")

    def __init__(
        self,
        *,
        max_request_body_bytes: int = MAX_REQUEST_BODY_BYTES,
        max_buffered_response_bytes: int = 16 * 2**20,
        max_sse_event_bytes: int = 2**20,
    ) -> None:
        self.max_request_body_bytes = max_request_body_bytes
        self.max_buffered_response_bytes = max_buffered_response_bytes
        self.max_sse_event_bytes = max_sse_event_bytes


_PROBE_ID = re.compile(r"probe-[A-Za-z0-9._:-]{1,120}")
# a client's X-Request-Id taken as the row's correlation id: bounded, of characters that are safe in
# a header, a log line, a label or a URL; any other value is ignored (the sidecar's own id answers)
_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=~-]{1,128}")
_TASK_CLASS = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")  # the class a probe's workload measures
_MAX_PROBE_LEVEL = 100_000  # concurrency levels and offered rates (requests/s) a probe may name
_MAX_PROBE_RATE = 100_000.0
_MAX_TASK_CLASSES = 16  # named by probes: few, but a client could send anything
_SHUT_DOWN = Ending("client_cancelled", "sidecar shut down")
_CLIENT_GONE = Ending("client_cancelled", "client disconnected")
_UNDECODED = (
    "an answer in a Content-Encoding the sidecar does not decode (it asks for identity, and decodes "
    "gzip and deflate) was forwarded unread: its tokens are estimated"
)


class CompletionsProxy:
    """ASGI app for POST /v1/chat/completions and /v1/completions: accounted, with usage injected."""

    def __init__(
        self,
        pool: H1Pool,
        tracker: Tracker,
        *,
        tenant_header: str,
        engine: EngineSource | None = None,
        limits: ProxyLimits | None = None,
        faults: FaultLog | None = None,
        read_timeout_s: float = 600.0,
        tracing: bool = False,
        probe_token: str | None = None,
        slo_headers: HeaderMode = "tighten",
    ) -> None:
        self._pool = pool
        self._slo_headers = slo_headers  # what a request's SLO headers may do (collector.goodput)
        self._tracker = tracker
        self._tenant_header = tenant_header.lower().encode("latin-1")
        self._task_cap = LabelCap(_MAX_TASK_CLASSES)  # named by probes: few, but a client could lie
        self._engine = engine
        self._limits = limits or ProxyLimits()
        self._faults = faults or FaultLog(log)
        self._read_timeout_s = read_timeout_s
        self._tracing = tracing  # W3C trace context to the engine, response facts for the span
        # the credential that makes a request the probe's (X-Headroom-Probe-Token): a header alone
        # never does, or a client could hide its failures as probe load or forge an estimate
        self._probe_token = probe_token.encode() if probe_token else None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        client = ClientChannel(send)
        refusal: Ending | None
        try:
            body = await read_body(receive, scope, self._limits.max_request_body_bytes)
        except BodyTooLarge as exc:
            parsed, refusal = (
                parse_request(b""),
                Ending("bad_request", str(exc), answer=413, limit="--max-request-body-bytes"),
            )
        else:
            if body is None:
                return  # never admitted: the client left before its request was read
            parsed = parse_request(body, scope["path"])
            refusal = None if parsed.refusal is None else Ending("bad_request", parsed.refusal, answer=400)
        read_at = time.monotonic()  # the sidecar's own time (headroom_proxy_overhead_seconds) starts
        request = self._admit(scope, parsed)
        # every answer says which id the row holds: the client's own, else the sidecar's
        client.request_id = (request.client_request_id or request.request_id).encode("latin-1")
        ending = _SHUT_DOWN  # unless the exchange says otherwise, this task was cancelled
        try:
            ending = refusal or await self._watched(request, parsed, scope, receive, client, read_at)
        finally:
            # our own answer's status only where it will be sent: a started response keeps the upstream's
            self._tracker.finish(
                request,
                ending.outcome,
                error=ending.error,
                status_code=None if client.started else ending.answer,
                failure=ending.failure,
            )
        await client.end(ending)

    def _admit(self, scope: Scope, parsed: ParsedRequest) -> LiveRequest:
        tenant = resolve_tenant(_text_header(scope, self._tenant_header), _header(scope, b"authorization"))
        probe = self._is_probe(scope)  # `headroom probe` marks its load, with the sidecar's token
        run_id = (_header(scope, b"x-headroom-run-id") or "")[:64] or None if probe else None
        # the probe's own id and what it measures: the stored run is then estimated from this
        # sidecar's rows; never an id already live (gauges key on it)
        probe_id = (_header(scope, b"x-headroom-request-id") or "") if probe else ""
        keep_id = _PROBE_ID.fullmatch(probe_id) is not None and probe_id not in self._tracker.live
        snapshot = self._engine.latest if self._engine is not None else None
        task = (_header(scope, b"x-headroom-task-class") or "") if probe else ""
        named = _TASK_CLASS.fullmatch(task) is not None
        request = LiveRequest(
            parsed.model,
            tenant,
            scope["path"],
            parsed.stream,
            parsed.max_tokens,
            parsed.prompt_tokens_estimate,
            source="probe" if probe else None,
            run_id=run_id,
            request_id=probe_id if keep_id else None,
            engine_waiting=snapshot.waiting if snapshot is not None else None,
            kv_usage=snapshot.kv_usage_ratio if snapshot is not None else None,
            task_class=task if named else None,
            task_class_label=self._task_cap(task) if named else None,
            telemetry=Telemetry.start(_header(scope, b"traceparent")) if self._tracing else None,
            probe_step=_probe_step(scope) if probe else None,
            client_request_id=client_request_id(scope),
            ignore_eos=parsed.ignore_eos,
        )
        self._tracker.admit(request)
        if self._slo_headers != "ignore":
            ttft, tpot = slo_header_values(scope["headers"])
            if ttft is not None or tpot is not None:
                self._tracker.judged_by(
                    request, *request_slo(self._tracker.slo, ttft, tpot, self._slo_headers)
                )
        return request

    def _is_probe(self, scope: Scope) -> bool:
        """True when the request carries the probe's mark and the sidecar's token beside it. A mark
        without the token is ordinary traffic (counted in headroom_probe_marks_ignored_total)."""
        if _header(scope, b"x-headroom-source") != "probe":
            return False
        presented = _header(scope, b"x-headroom-probe-token")
        if self._probe_token is None:
            reason = "untrusted"
        elif presented is None:
            reason = "no_token"
        elif hmac.compare_digest(presented.encode("latin-1"), self._probe_token):
            return True
        else:
            reason = "wrong_token"
        self._tracker.probe_marks_ignored.labels(reason).inc()
        self._faults.warn(
            f"probe_mark_{reason}",
            f"a request marked as the probe's was counted as traffic ({reason}): headroom probe "
            "sends the sidecar's token (HEADROOM_TOKEN, or the --db owner's) in X-Headroom-Probe-Token",
        )
        return False

    async def _watched(
        self,
        request: LiveRequest,
        parsed: ParsedRequest,
        scope: Scope,
        receive: Any,
        client: ClientChannel,
        read_at: float,
    ) -> Ending:
        """The exchange, in this task, watched for a disconnect that cancels it.

        No task of its own where the server is uvicorn's (`headroom run`): the watch is the
        cycle's own event (`CycleWatch`); elsewhere one watcher task beside the server's
        (`TaskWatch`). A disconnect seen before the last byte is sent means the client never had
        the whole answer: client_cancelled, even when the exchange finished in the same loop
        step. A relay that finds every byte buffered runs to its end without yielding, while the
        client's FIN, read in the same poll, reaches the watch only steps later; so the decision
        reads the client's transport where the server shows it (`client_closing`). A client gone
        after a stream's `[DONE]` was forwarded had the whole answer: the relay's
        `client.answered` is the ending then.
        """
        task = asyncio.current_task()
        assert task is not None  # an ASGI app runs in a task
        gone = settled = False

        def disconnected() -> None:
            nonlocal gone
            if not settled:  # a watch that fires after the exchange settled changes nothing
                gone = True
                task.cancel()

        watch = CycleWatch.on(receive, disconnected) or TaskWatch(receive, disconnected)
        try:
            ending = await self._exchange(request, parsed, scope, client, read_at)
            seen = watch.seen()
            if seen is None:  # the server does not show its transport: one more step for the watch
                await asyncio.sleep(0)
                seen = watch.seen()
            gone = gone or bool(seen)
        except asyncio.CancelledError:
            # ours is one cancel request; any other (a shutdown beside the disconnect) stays
            if not gone or task.uncancel() > 0:
                raise  # server shutdown: the request ends as such in __call__
        finally:
            settled = True
            watch.stop()
        if gone:
            client.gone = True
            return client.answered or _CLIENT_GONE  # gone after [DONE] reached it: answered
        return ending

    async def _exchange(
        self, request: LiveRequest, parsed: ParsedRequest, scope: Scope, client: ClientChannel, read_at: float
    ) -> Ending:
        """Send upstream, relay the answer; returns how it ended and never raises (but cancels).

        An exchange still open when this returns (a cancel, a client gone, a relay that failed)
        is abandoned: its connection closes, so the engine stops generating for nobody, and is
        never pooled again."""
        exchange: Exchange | None = None
        try:
            target = upstream_target(scope)
            telemetry = request.telemetry
            headers = upstream_headers(scope, telemetry.traceparent() if telemetry is not None else None)
            self._tracker.sending(request, read_at)  # body read to upstream send: the hop
            exchange = await self._pool.send(b"POST", target, headers, parsed.body)
            if exchange.retries:
                self._tracker.retried(request, exchange.retry_reason or "stale_connection")
            self._tracker.responded(request, exchange.status)
            # compressed although identity was asked for: decoded to be read, and sent decoded
            coding = content_coding(exchange.headers)
            decode = coding in DECODED_CODINGS
            if coding is not None and not decode:
                self._faults.warn("content_encoding", _UNDECODED)
            if (
                exchange.status == 200
                and (coding is None or decode)
                and media_type(exchange.headers) == "text/event-stream"
            ):
                await client.start(200, response_headers(exchange.headers, keep_length=False, decoded=decode))
                return self._relayed(
                    await relay_exchange_stream(
                        self._tracker,
                        request,
                        parsed.usage_injected,
                        exchange,
                        client,
                        self._limits.max_sse_event_bytes,
                        decode,
                    )
                )
            await client.start(
                exchange.status, response_headers(exchange.headers, keep_length=not decode, decoded=decode)
            )
            body = BufferedBody(exchange)
            return await relay_body(
                self._tracker,
                request,
                DecodedBody(body) if decode else body,
                client,
                self._limits.max_buffered_response_bytes,
            )
        except Exception as exc:
            return self._failed(exc)
        finally:
            if exchange is not None and exchange.connection is not None:
                exchange.abandon()

    def _failed(self, exc: Exception) -> Ending:
        """The Ending of an exchange that raised, and one rate-limited WARNING for its class."""
        ending = describe_failure(exc, self._read_timeout_s)
        if ending.failure == "proxy_error":
            self._faults.warn("proxy_error", f"unexpected proxy failure: {ending.error}", exc=exc)
        else:
            self._faults.warn(ending.failure or ending.outcome, f"upstream request failed: {ending.error}")
        return ending

    def _relayed(self, ending: Ending) -> Ending:
        """A stream's Ending; one rate-limited WARNING for its class where the stream failed."""
        if ending.failure is not None:
            self._faults.warn(ending.failure, f"upstream stream failed: {ending.error}")
        return ending


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def client_request_id(scope: Scope) -> str | None:
    """The client's X-Request-Id where it is 1-128 safe ASCII characters (`_CLIENT_REQUEST_ID`),
    else None: an oversized, non-ASCII or CRLF-bearing id is never stored or echoed."""
    value = _header(scope, b"x-request-id")
    return value if value is not None and _CLIENT_REQUEST_ID.fullmatch(value) else None


def _probe_step(scope: Scope) -> ProbeStep | None:
    """The level or offered rate a probe request measures, from its headers; None when neither is a
    number in range (a client's garbage is not recorded)."""
    level_text = _header(scope, b"x-headroom-probe-level")
    rate_text = _header(scope, b"x-headroom-probe-rate")
    warmup = _header(scope, b"x-headroom-probe-warmup") == "1"
    if (
        level_text is not None
        and level_text.isascii()
        and level_text.isdigit()
        and 0 < int(level_text) <= _MAX_PROBE_LEVEL
    ):
        return ProbeStep(int(level_text), None, warmup)
    try:
        rate = float(rate_text) if rate_text is not None else None
    except ValueError:
        return None
    if rate is not None and 0 < rate <= _MAX_PROBE_RATE:  # also refuses nan and inf
        return ProbeStep(None, rate, warmup)
    return None


def _text_header(scope: Scope, name: bytes) -> str | None:
    """A header meant as text (the tenant): UTF-8, as clients send it (`équipe-北京`), else the
    bytes as Latin-1, so that a value that is not UTF-8 still gets one stable label."""
    for key, value in scope["headers"]:
        if key == name:
            return decode_header_text(bytes(value))
    return None
