"""`headroom integrations keda|gateway|llm-d --db FILE` while a sidecar owns FILE: the estimate is
asked of the sidecar (GET /headroom/v1/query/estimate, what its gauges publish), and the database is
never copied (no GET /headroom/v1/snapshot): collector.store.owner.read_published."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
import yaml
from click.testing import CliRunner
from conftest import free_port
from support.upstream import FakeUpstream
from test_analysis_estimate import _estimate

from collector.cli import main
from collector.integrations.render import keda_scaled_object
from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar
from collector.store import owner as owner_module
from collector.store.db import RequestStore
from collector.store.decision import Published, published_estimates
from collector.store.estimates import save_estimate
from collector.store.owner import Owner, OwnerError, owner_file_for, published_from_owner, token_file_for


@pytest.fixture
def owned(tmp_path, monkeypatch):
    """A request log holding one publishable probe estimate for model m (knee 8, pool 5, pool in
    tokens 1300), owned by a running sidecar; every snapshot, asked or served, fails the test."""
    monkeypatch.delenv("HEADROOM_TOKEN", raising=False)
    db = tmp_path / "log.duckdb"
    estimate = _estimate(model="m", knee_at=8)
    mean = estimate.knee.tokens
    estimate = replace(
        estimate,
        token_capacity={"mean": mean, "p95": mean * 3 // 2, "pool_tokens": 1300, "max_request_tokens": 40},
    )
    store = RequestStore(db)
    save_estimate(store, estimate)
    (published,) = published_estimates(store)
    store.close()

    snapshots: list[str] = []

    def no_client_snapshot(*args: object, **kwargs: object) -> None:
        snapshots.append("fetch_snapshot")
        raise AssertionError("the reader asked the owner for a snapshot")

    def no_served_snapshot(self: RequestStore, path: object) -> None:
        snapshots.append("RequestStore.snapshot")
        raise AssertionError("the owner was asked for a snapshot")

    monkeypatch.setattr(owner_module, "fetch_snapshot", no_client_snapshot)
    monkeypatch.setattr(RequestStore, "snapshot", no_served_snapshot)
    asked: list[Owner] = []
    ask = owner_module.published_from_owner

    def spy(owner: Owner, **kwargs: object) -> list[Published]:
        asked.append(owner)
        return ask(owner)

    monkeypatch.setattr(owner_module, "published_from_owner", spy)

    upstream = FakeUpstream()
    port = free_port()
    app = build_sidecar(
        SidecarConfig(
            upstream=upstream.url,
            engine="none",
            db_path=str(db),
            instance="box",
            jobs=False,
            listen_port=port,
        )
    )
    sidecar = serve_in_thread(app, port=port, timeout_graceful_shutdown=5)
    try:
        assert owner_file_for(db).exists()
        yield sidecar, db, published, snapshots, asked
    finally:
        sidecar.stop()
        upstream.stop()


def _integrations(*args: str) -> str:
    result = CliRunner().invoke(main, ["integrations", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_keda_from_an_owned_db_asks_the_sidecar_for_the_estimate_and_copies_nothing(owned):
    sidecar, db, published, snapshots, asked = owned
    text = _integrations("keda", "--db", str(db), "--deployment", "x")
    assert snapshots == [], "the database was copied (GET /headroom/v1/snapshot)"
    assert [o.url for o in asked] == [sidecar.url + "/headroom"], "the owner was not asked"
    scaled = yaml.safe_load(text)
    # the document is the one the published estimate renders: its thresholds are the estimate's
    assert scaled == keda_scaled_object(published.estimate, deployment="x")
    annotations = scaled["metadata"]["annotations"]
    assert annotations["llm-headroom/pool-requests"] == str(published.estimate.recommended_pool) == "5"
    assert annotations["llm-headroom/knee-requests"] == "8"
    assert annotations["llm-headroom/estimate"] == published.estimate.created_at.isoformat()
    requests, tokens = scaled["spec"]["triggers"]
    assert "or vector(5)" in requests["metadata"]["query"]
    assert "or vector(1300)" in tokens["metadata"]["query"]

    # gateway and llm-d through the owner too, with the sidecar still holding the file
    gateway = yaml.safe_load(_integrations("gateway", "--db", str(db), "--mode", "tokens"))
    assert gateway["plugins"][0]["parameters"]["maxTokenConcurrency"] == 1300
    llmd = yaml.safe_load(_integrations("llm-d", "--db", str(db)))
    assert llmd["kind"] == "ConfigMap"
    assert snapshots == [] and len(asked) == 3

    # the sidecar gone, the file is read as it is, and renders the same document
    sidecar.stop()
    assert not owner_file_for(db).exists()
    assert _integrations("keda", "--db", str(db), "--deployment", "x") == text
    assert snapshots == [] and len(asked) == 3


def test_a_refused_token_is_explained_and_nothing_is_copied(owned):
    _, db, _, snapshots, _ = owned
    token = token_file_for(db)
    assert token is not None
    token.write_text("not-the-token\n")
    result = CliRunner().invoke(main, ["integrations", "keda", "--db", str(db), "--deployment", "x"])
    assert result.exit_code == 1
    assert f"cannot read an estimate from {db}" in result.output and "refused the token" in result.output
    assert snapshots == []


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (401, b'{"detail": "unauthorized"}', "refused the token"),
        (503, b"busy", "/v1/query/estimate answered HTTP 503: busy"),
        (200, b"<html>", "answered something other than published estimates"),
        (200, b'{"rows": [{"model": "m"}]}', "answered something other than published estimates"),
    ],
)
def test_published_from_owner_names_what_went_wrong(status, body, message):
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/headroom/v1/query/estimate"
        assert request.headers["Authorization"] == "Bearer t"
        return httpx.Response(status, content=body)

    owner = Owner(url="http://owner.invalid/headroom", proxy=None, token="t")
    with pytest.raises(OwnerError, match=message):
        published_from_owner(owner, transport=httpx.MockTransport(answer))


def test_published_from_owner_reads_the_routes_rows_back_as_published_estimates():
    estimate = _estimate(model="m", knee_at=8)
    row = Published(estimate, "probe run probe-1 (0.0 h old)").to_dict()

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"rows": [row]})

    owner = Owner(url="http://owner.invalid/headroom", proxy=None, token="t")
    (published,) = published_from_owner(owner, transport=httpx.MockTransport(answer))
    assert published.because == "probe run probe-1 (0.0 h old)"
    assert "published_because" not in published.estimate.extra
    assert published.estimate.to_dict() == estimate.to_dict()
    with pytest.raises(OwnerError, match="cannot reach the owner"):
        published_from_owner(
            owner, transport=httpx.MockTransport(lambda r: (_ for _ in ()).throw(httpx.ConnectError("no")))
        )
