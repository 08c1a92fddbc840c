"""Bad parameters answer 400 naming each one, whichever app serves the store's routes.

FastAPI answers a RequestValidationError with 422; the routes document 400 with the parameter
named. The answer belongs to the routes, not to the app that includes them (the sidecar's proxy
app, or its admin listener), so every store router is built with `route_class=StoreRoute`.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["StoreRoute", "validation_answer"]


def validation_answer(exc: RequestValidationError) -> JSONResponse:
    """400 with {"detail": [{"parameter": name, "problem": why}, ...]}."""
    problems = [
        {
            "parameter": ".".join(str(p) for p in err.get("loc", ())[1:]) or "body",
            "problem": err.get("msg", "invalid"),
        }
        for err in exc.errors()
    ]
    return JSONResponse(status_code=400, content={"detail": problems})


class StoreRoute(APIRoute):
    """An APIRoute whose invalid parameters answer validation_answer's 400."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return validation_answer(exc)

        return answer
