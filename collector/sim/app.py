"""The simulator's HTTP surface: OpenAI-compatible endpoints, engine /metrics, /slots, /sim/state.

`create_sim_app(SimConfig(...))` returns a FastAPI app whose lifespan starts the engine loop; run it
with uvicorn (`headroom sim`) or `collector.serving.serve_in_thread` (tests, `headroom demo`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from collector.sim.config import SimConfig
from collector.sim.cost import CostModel
from collector.sim.engine import Engine, Stream
from collector.sim.metrics import EngineMetricsCollector, render_metrics
from collector.sim.openai import (
    DONE,
    BadRequest,
    ParsedRequest,
    chunk,
    full_response,
    parse_request,
    sse,
    usage_chunk,
)
from collector.sim.scheduler import QueueFull, SimRequest
from collector.sim.slots import slots_view
from collector.sim.timings import answer_fields, finish_chunk_fields

__all__ = ["create_sim_app", "model_list"]

RETRY_AFTER_S = 1
DISCONNECT_POLL_S = 0.5


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _stream_events(
    engine: Engine, stream: Stream, req: ParsedRequest, model: str
) -> AsyncIterator[bytes]:
    """SSE body: role chunk with the first tokens, content every stream_interval tokens, then
    the closing events."""
    tokens, sent, started = req.plan.tokens, 0, False
    interval = engine.config.stream_interval
    try:
        while True:
            await stream.changed.wait()
            stream.changed.clear()
            upto = min(stream.delivered, len(tokens))
            parts = []
            if req.chat and not started and (upto > sent or stream.finished):
                parts.append(sse(chunk(req, model, None, role=True)))
                started = True
            if upto > sent and (sent == 0 or upto - sent >= interval or stream.finished):
                parts.append(sse(chunk(req, model, "".join(tokens[sent:upto]))))
                sent = upto
            if stream.finished:
                parts.append(_closing_events(engine.config, stream, req, model))
            if parts:
                yield b"".join(parts)
            if stream.finished:
                return
    finally:
        if not stream.finished:
            engine.abort(stream)  # client went away: free the slot and its KV blocks


def _closing_events(config: SimConfig, stream: Stream, req: ParsedRequest, model: str) -> bytes:
    """The finish chunk, the usage chunk when asked for, and [DONE]; the engine's own timings ride
    the flavor's chunk (collector.sim.timings), computed once, now that the request is over."""
    final = chunk(req, model, None, finish_reason=req.plan.finish_reason)
    if not req.include_usage:
        return sse(final | finish_chunk_fields(config, stream.request)) + DONE
    usage = usage_chunk(req, model, stream.request.generated) | answer_fields(config, stream.request)
    return sse(final) + sse(usage) + DONE


async def _complete(engine: Engine, request: Request, chat: bool) -> Response:
    config = engine.config
    try:
        body = orjson.loads(await request.body())
        parsed = parse_request(body, chat, config)
    except orjson.JSONDecodeError as exc:
        return _error(400, f"the request body is not valid JSON: {exc}", "invalid_request_error")
    except BadRequest as exc:
        return _error(400, str(exc), "invalid_request_error")
    model = str(body.get("model") or config.model)
    sim_request = SimRequest(
        parsed.response_id,
        parsed.prompt_tokens,
        max(1, len(parsed.plan.tokens)),
        adapter=config.adapter_of(body.get("model")),
    )
    try:
        stream = engine.submit(sim_request)
    except QueueFull as exc:
        return _error(
            429,
            f"engine queue is full: {exc}; retry later",
            "rate_limit_error",
            {"Retry-After": str(RETRY_AFTER_S)},
        )
    if parsed.stream:
        return StreamingResponse(
            _stream_events(engine, stream, parsed, model), media_type="text/event-stream"
        )
    return await _wait_whole(engine, stream, request, parsed, model)


async def _wait_whole(
    engine: Engine, stream: Stream, request: Request, parsed: ParsedRequest, model: str
) -> Response:
    """Non-streaming: wait for the last token, checking every DISCONNECT_POLL_S for a client gone."""
    loop = asyncio.get_running_loop()
    next_check = loop.time() + DISCONNECT_POLL_S
    while not stream.finished:
        try:
            await asyncio.wait_for(stream.changed.wait(), DISCONNECT_POLL_S)
        except TimeoutError:
            pass
        stream.changed.clear()
        if not stream.finished and loop.time() >= next_check:
            next_check = loop.time() + DISCONNECT_POLL_S
            if await request.is_disconnected():
                engine.abort(stream)  # like vLLM: a client that left frees its slot
                return Response(status_code=499)
    answer = full_response(parsed, model, stream.request.generated)
    return JSONResponse(answer | answer_fields(engine.config, stream.request))


def model_list(config: SimConfig) -> list[dict[str, Any]]:
    """/v1/models' entries as vLLM lists them: the base model, then each LoRA adapter with its
    `parent` (the base model's id) and `root` (where it was loaded from)."""
    entry = {
        "object": "model",
        "created": 0,
        "owned_by": "headroom-sim",
        "max_model_len": config.max_model_len,
    }
    base = {"id": config.model, "root": config.model, "parent": None, **entry}
    adapters = [
        {"id": name, "root": f"/adapters/{name}", "parent": config.model, **entry}
        for name in config.lora_adapters
    ]
    return [base, *adapters]


def create_sim_app(config: SimConfig | None = None, cost: CostModel | None = None) -> FastAPI:
    """Build the simulator app; the engine loop runs while the app's lifespan is active."""
    config = config or SimConfig()
    engine = Engine(config, cost)
    metrics = EngineMetricsCollector(engine.state, config.flavor, config.model, config.vllm_legacy_kv_metric)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(title="headroom sim", lifespan=lifespan)
    app.state.engine = engine
    app.state.metrics = metrics  # tests set metrics.fault (collector.sim.metrics.FAULTS)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _complete(engine, request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _complete(engine, request, chat=False)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": model_list(config)}

    @app.get("/metrics")
    async def engine_metrics() -> Response:
        return Response(render_metrics(metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/slots")
    async def slots() -> list[dict[str, Any]]:
        return slots_view(engine.scheduler)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/sim/state")
    async def state() -> dict[str, Any]:
        return {**engine.state(), "flavor": config.flavor, "model": config.model}

    return app
