"""A fake engine's monitoring side for the source tests: /metrics (and llama.cpp's /slots) that
can hang, fail or send garbage, and the /v1/models list the served model is read from. The
OpenAI side of an engine is support.upstream."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from collector.serving import serve_in_thread
from support.waiting import patient

FIXTURES = Path(__file__).parent.parent / "fixtures"
GARBAGE = ("\x00\x01 not metrics {{{ " * 4000).encode()  # ~80 kB of junk, like a broken proxy page


class FakeEngine:
    """Mutable behaviour: set .metrics_text, .slots, .models and .mode ('ok', 'hang', 'garbage', 'error').

    .models is the /v1/models answer (None: 404); .models_mode 'hang' holds that answer back.
    """

    def __init__(self, metrics_text: str = "", slots: object = None) -> None:
        self.metrics_text = metrics_text
        self.slots = slots
        self.models: object = None
        self.models_mode = "ok"
        self.mode = "ok"
        self.metrics_hits = 0
        self.models_hits = 0
        self.release = threading.Event()  # set at teardown so hanging handlers end

    async def _metrics(self) -> Response:
        self.metrics_hits += 1
        if self.mode == "hang":
            while not self.release.is_set() and self.mode == "hang":
                await asyncio.sleep(0.05)
        if self.mode == "garbage":
            return Response(GARBAGE, media_type="text/plain")
        if self.mode == "error":
            return PlainTextResponse("engine exploded", status_code=500)
        return PlainTextResponse(self.metrics_text)

    async def _slots(self) -> Response:
        if self.slots is None:  # what llama-server answers with --no-slots
            return JSONResponse(
                {"error": {"code": 501, "message": "slots endpoint is disabled"}}, status_code=501
            )
        return JSONResponse(self.slots)

    async def _models(self) -> Response:
        self.models_hits += 1
        while self.models_mode == "hang" and not self.release.is_set():
            await asyncio.sleep(0.05)
        if self.models is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return JSONResponse(self.models)

    async def _chat(self, request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse(
            {
                "id": "cmpl-fake",
                "object": "chat.completion",
                "created": 0,
                "model": "fake",
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }
        )

    def app(self) -> FastAPI:
        app = FastAPI()
        app.add_api_route("/metrics", self._metrics, methods=["GET"])
        app.add_api_route("/slots", self._slots, methods=["GET"])
        app.add_api_route("/v1/models", self._models, methods=["GET"])
        app.add_api_route("/v1/chat/completions", self._chat, methods=["POST"])
        return app


@pytest.fixture
def fake_engine():
    """A FakeEngine served on 127.0.0.1 (any port); yields (engine, base_url)."""
    engine = FakeEngine((FIXTURES / "vllm/metrics_v0_11.txt").read_text())
    handle = serve_in_thread(engine.app())
    try:
        yield engine, handle.url
    finally:
        engine.release.set()
        handle.stop(timeout_s=patient(10))
