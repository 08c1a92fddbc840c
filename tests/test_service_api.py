"""The store's routes (an owning sidecar's /headroom): token on every route, injection rejected and
harmless, idempotent ingest."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from fastapi.testclient import TestClient
from support.owner_routes import routes_app
from support.synthetic import synthetic_rows

from collector.service.auth import resolve_token
from collector.store.db import RequestStore

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
T0 = datetime(2026, 11, 23, tzinfo=UTC)
INJECTIONS = (
    "x'; DROP TABLE requests; --",
    "1 OR 1=1",
    "model) ; DELETE FROM requests; --",
    "ttft_s, (SELECT 1)",
    "' UNION SELECT * FROM headroom_schema --",
)
QUERY_PARAMS = {
    "/v1/query/percentiles": (
        "metric",
        "quantiles",
        "group_by",
        "since",
        "until",
        "model",
        "tenant",
        "outcome",
        "source",
        "instance",
        "run_id",
        "endpoint",
    ),
    "/v1/query/curve": ("caliber", "since", "until", "model", "tenant", "outcome", "source"),
    "/v1/query/outcomes": ("group_by", "since", "until", "model", "tenant", "instance"),
    "/v1/query/probe-runs": ("since", "until", "model", "run_id"),
    "/v1/query/estimate": ("model", "since"),
    "/v1/report": ("since", "format"),
}


@pytest.fixture
def store():
    store = RequestStore()
    store.insert_rows(synthetic_rows(400, T0, models=("model-a", "model-b")))
    yield store
    store.close()


@pytest.fixture
def client(store):
    with TestClient(routes_app(store, TOKEN)) as client:
        yield client


def _snapshot(store: RequestStore) -> tuple:
    tables = store.query("SELECT table_name FROM information_schema.tables ORDER BY table_name")
    checksum = store.query("SELECT count(*), sum(hash(request_id)), sum(ttft_s) FROM requests")
    return tuple(tables), tuple(checksum)


def _protected_routes(client) -> list[tuple[str, str]]:
    """Every documented route except health and metrics, read from the app's own OpenAPI."""
    paths = client.get("/openapi.json").json()["paths"]
    return [
        (method.upper(), path)
        for path, item in sorted(paths.items())
        for method in sorted(item)
        if path not in ("/healthz", "/metrics")
    ]


def test_every_v1_route_answers_401_without_or_with_a_wrong_token(client):
    routes = _protected_routes(client)
    assert {("GET", "/v1/query/percentiles"), ("POST", "/v1/ingest"), ("GET", "/reports/latest")} <= set(
        routes
    )
    for method, path in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            response = client.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, headers)


def test_injection_in_every_parameter_is_rejected_and_changes_nothing(client, store):
    before = _snapshot(store)
    for path, params in QUERY_PARAMS.items():
        for name in params:
            for attack in INJECTIONS:
                response = client.get(path, params={name: attack}, headers=AUTH)
                assert response.status_code == 400, (path, name, attack, response.text)
        response = client.get(path, params={"extra; DROP TABLE requests": "1"}, headers=AUTH)
        assert response.status_code == 400, path
    assert _snapshot(store) == before


def test_injection_in_ingest_is_stored_as_data_or_rejected(client, store):
    before = store.count()
    bad_column = [{"request_id": "r1", "model) VALUES (1); DROP TABLE requests; --": "x"}]
    assert (
        client.post("/v1/ingest", content=orjson.dumps({"rows": bad_column}), headers=AUTH).status_code == 400
    )
    bad_time = [{"request_id": "r2", "admitted_at": "now'); DROP TABLE requests; --"}]
    assert (
        client.post("/v1/ingest", content=orjson.dumps({"rows": bad_time}), headers=AUTH).status_code == 400
    )
    bad_type = [{"request_id": "r3", "prompt_tokens": "12; DROP TABLE requests"}]
    assert (
        client.post("/v1/ingest", content=orjson.dumps({"rows": bad_type}), headers=AUTH).status_code == 400
    )
    assert client.post("/v1/ingest", content=b"{not json", headers=AUTH).status_code == 400
    as_data = [{"request_id": "r4", "model": "x'; DROP TABLE requests; --"}]
    assert (
        client.post("/v1/ingest", content=orjson.dumps({"rows": as_data}), headers=AUTH).json()["inserted"]
        == 1
    )
    assert store.count() == before + 1
    assert store.query("SELECT model FROM requests WHERE request_id = 'r4'") == [(as_data[0]["model"],)]


def test_same_batch_twice_creates_no_duplicate(client, store):
    batch = synthetic_rows(50, T0 + timedelta(days=2), prefix="dup")
    body = orjson.dumps({"rows": batch})
    first = client.post("/v1/ingest", content=body, headers=AUTH).json()
    second = client.post("/v1/ingest", content=body, headers=AUTH).json()
    assert first == {"received": 50, "inserted": 50, "duplicates": 0}
    assert second == {"received": 50, "inserted": 0, "duplicates": 50}
    assert store.query(
        "SELECT count(*), count(DISTINCT request_id) FROM requests WHERE request_id LIKE 'dup-%'"
    ) == [(50, 50)]


def test_percentiles_are_exact_and_grouped_by_the_whitelist(client, store):
    response = client.get(
        "/v1/query/percentiles",
        headers=AUTH,
        params={
            "metric": "ttft_s",
            "quantiles": "0.5,0.95",
            "group_by": "model,inflight_bucket",
            "since": T0.isoformat(),
            "until": (T0 + timedelta(hours=1)).isoformat(),
            "tenant": "team-a",
        },
    )
    assert response.status_code == 200, response.text
    rows = response.json()["rows"]
    expected = store.query(
        "SELECT model, CAST(pow(2, round(log2(inflight_at_admit))) AS BIGINT) AS b, count(*), "
        "quantile_cont(ttft_s, 0.5), quantile_cont(ttft_s, 0.95) FROM requests "
        "WHERE ttft_s IS NOT NULL AND tenant = 'team-a' GROUP BY model, b ORDER BY model, b"
    )
    got = [(r["model"], r["inflight_bucket"], r["n"], r["p50"], r["p95"]) for r in rows]
    assert len(got) == len(expected) > 4
    for mine, sql in zip(got, expected):
        assert mine[:3] == sql[:3] and mine[3:] == pytest.approx(sql[3:], rel=1e-12)


def test_curve_outcomes_and_openapi(client, store):
    tokens = client.get("/v1/query/curve", params={"caliber": "tokens"}, headers=AUTH).json()
    requests = client.get("/v1/query/curve", params={"caliber": "requests"}, headers=AUTH).json()
    assert [r["bucket"] for r in requests["rows"]] == [1, 2, 4, 8, 16]
    assert sum(r["n"] for r in requests["rows"]) == sum(r["n"] for r in tokens["rows"]) == 400
    outcomes = client.get("/v1/query/outcomes", params={"group_by": "model"}, headers=AUTH).json()["rows"]
    direct = dict(
        ((m, o), n) for m, o, n in store.query("SELECT model, outcome, count(*) FROM requests GROUP BY ALL")
    )
    assert {(r["model"], r["outcome"]): r["n"] for r in outcomes} == direct
    spec = client.get("/openapi.json").json()
    names = {p["name"] for p in spec["paths"]["/v1/query/percentiles"]["get"]["parameters"]}
    assert {"metric", "quantiles", "group_by", "since", "until", "model", "tenant"} <= names


def test_token_comes_from_flag_then_env_then_a_private_file(tmp_path, monkeypatch):
    db = tmp_path / "h.duckdb"
    monkeypatch.delenv("HEADROOM_TOKEN", raising=False)
    assert resolve_token("flag", db) == ("flag", None)
    monkeypatch.setenv("HEADROOM_TOKEN", "from-env")
    assert resolve_token(None, db) == ("from-env", None)
    monkeypatch.delenv("HEADROOM_TOKEN")
    token, path = resolve_token(None, db)
    assert path == tmp_path / "h.duckdb.token" and len(token) >= 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert resolve_token(None, db) == (token, path)  # reused after a restart


def test_an_ingest_body_over_the_limit_is_413_naming_it(client, monkeypatch):
    from collector.service import ingest

    monkeypatch.setattr(ingest, "MAX_BODY_BYTES", 1_000)
    response = client.post("/v1/ingest", headers=AUTH, content=b'{"rows":[' + b" " * 2_000 + b"]}")
    assert response.status_code == 413 and "MAX_BODY_BYTES" in response.json()["detail"]
