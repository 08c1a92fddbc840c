"""The store's routes on their own: the router an owning sidecar serves under /headroom
(collector.service.routes), mounted at / on a bare FastAPI app, for tests of the routes themselves
(the query API's validation, ingest, estimates). Readers through a real sidecar are in
tests/test_sidecar_readers.py."""

from __future__ import annotations

from pathlib import Path

from fastapi import Depends, FastAPI

from collector.service.auth import require_token
from collector.service.routes import build_store_routes
from collector.store.capacity_gauges import CapacityGauges
from collector.store.db import RequestStore
from collector.store.decision import PublishPolicy


def routes_app(
    store: RequestStore,
    token: str,
    *,
    gauges: CapacityGauges | None = None,
    report_dir: Path | None = None,
    policy: PublishPolicy | None = None,
) -> FastAPI:
    """The token-protected store routes on `store`, as build_sidecar wires them."""
    app = FastAPI()
    app.include_router(
        build_store_routes(
            store, [Depends(require_token(token))], report_dir=report_dir, gauges=gauges, policy=policy
        )
    )
    return app
