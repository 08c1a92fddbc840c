"""Request ids both ways: a client's X-Request-Id (bounded, sanitised) becomes its row's
client_request_id and comes back on the answer; without one, the sidecar's own id (the row's key)
comes back. Two clients sending one id never collide on the row's key."""

from __future__ import annotations

import threading

import httpx
import pytest
from support.sidecar import CHAT, sidecar_rig
from support.waiting import patient

from collector.sidecar.headers import with_request_id
from collector.sidecar.proxy import client_request_id
from collector.sidecar.wiring import sidecar_state

PATH = "/v1/chat/completions"


@pytest.fixture
def rig(tmp_path):
    # long enough for the fake upstream to answer on a busy host; the hang case waits it out
    with sidecar_rig(tmp_path, read_timeout_s=2.0, max_request_body_bytes=4096) as rig:
        yield rig


def _post(rig, body=CHAT, mode="ok", **headers):
    return httpx.post(rig.url + PATH, json=body, headers={"x-fake": mode, **headers}, timeout=patient(10))


@pytest.mark.parametrize(
    "mode,body,status",
    [
        ("ok", CHAT, 200),  # a stream
        ("ok", {**CHAT, "stream": False}, 200),
        ("429", CHAT, 429),  # the upstream's error, forwarded
        ("ok", {**CHAT, "pad": "x" * 5000}, 413),  # the sidecar's own error answers
        ("hang", CHAT, 504),
    ],
)
def test_a_clients_request_id_is_in_its_row_and_comes_back(rig, mode, body, status):
    answer = _post(rig, body, mode, **{"X-Request-Id": "req-9f1c_ABC.42:z/+=~@"})
    assert answer.status_code == status
    assert answer.headers.get_list("x-request-id") == ["req-9f1c_ABC.42:z/+=~@"]
    (row,) = rig.rows()
    assert row["client_request_id"] == "req-9f1c_ABC.42:z/+=~@"
    assert row["request_id"] != row["client_request_id"]  # the key stays the sidecar's own


def test_without_a_client_id_the_sidecars_own_id_comes_back_and_is_the_rows_key(rig):
    streamed, refused = _post(rig), _post(rig, {**CHAT, "pad": "x" * 5000})
    rows = rig.rows()
    assert [r["request_id"] for r in rows] == [
        streamed.headers["x-request-id"],
        refused.headers["x-request-id"],
    ]
    assert [r["client_request_id"] for r in rows] == [None, None]
    assert b"[DONE]" in streamed.content and refused.status_code == 413


@pytest.mark.parametrize(
    "sent",
    [
        "x" * 10_240,  # 10 KB
        "x" * 129,  # one past the bound
        "équipe-北京".encode(),  # non-ASCII (UTF-8)
        b"id-\xff\xfe",  # not even UTF-8
        "a b",
        '"><script>alert(1)</script>',
        "id;drop",
        "",
    ],
)
def test_an_unsafe_client_id_is_replaced_by_the_sidecars_and_never_breaks_the_answer(rig, sent):
    answer = _post(rig, **{"X-Request-Id": sent})
    assert answer.status_code == 200 and answer.content.endswith(b"data: [DONE]\n\n")
    (row,) = rig.rows()
    assert row["client_request_id"] is None
    assert answer.headers.get_list("x-request-id") == [row["request_id"]]


@pytest.mark.parametrize(
    "value,taken",
    [
        ("abc\r\nSet-Cookie: x=1", None),
        ("abc\n", None),
        ("abc\x00", None),
        ("a\tb", None),
        ("x" * 128, "x" * 128),
        ("0f8fad5b-d9cb-469f-a165-70867728950e", "0f8fad5b-d9cb-469f-a165-70867728950e"),
    ],
)
def test_what_a_header_may_carry_into_the_row(value, taken):
    scope = {"headers": [(b"x-request-id", value.encode("latin-1"))]}
    assert client_request_id(scope) == taken


def test_an_upstreams_own_id_stays_beside_the_sidecars():
    upstream = [(b"content-type", b"text/event-stream"), (b"X-Request-Id", b"req_openai")]
    assert with_request_id(upstream, b"mine") == [
        (b"content-type", b"text/event-stream"),
        (b"x-upstream-request-id", b"req_openai"),
        (b"x-request-id", b"mine"),
    ]
    echoed = [(b"x-request-id", b"mine")]  # an engine echoing the client's id: said once
    assert with_request_id(echoed, b"mine") == [(b"x-request-id", b"mine")]


def test_two_concurrent_requests_with_one_client_id_both_get_rows(rig):
    answers: dict[str, httpx.Response] = {}

    def send(test_id: str) -> None:
        answers[test_id] = _post(rig, mode="gate-headers", **{"X-Request-Id": "same", "x-test-id": test_id})

    threads = [threading.Thread(target=send, args=(test_id,)) for test_id in ("a", "b")]
    for thread in threads:
        thread.start()
    assert rig.fake.expect("a").wait(patient(10)) and rig.fake.expect("b").wait(
        patient(10)
    )  # both in flight at once
    assert len(sidecar_state(rig.app).tracker.live) == 2
    rig.fake.gate("a").set()
    rig.fake.gate("b").set()
    for thread in threads:
        thread.join(patient(10))
    rows = rig.rows()
    assert [r["client_request_id"] for r in rows] == ["same", "same"]
    assert len({r["request_id"] for r in rows}) == 2
    assert [answers[t].headers["x-request-id"] for t in ("a", "b")] == ["same", "same"]


def test_a_probes_own_id_comes_back_only_with_the_sidecars_token(rig):
    marked = rig.probe_marks("run-1", **{"X-Headroom-Request-Id": "probe-run-1-000001"})
    probe = _post(rig, **marked)
    forged = _post(rig, **{"X-Headroom-Request-Id": "probe-run-1-000002"})
    rows = rig.rows()
    assert [r["request_id"] for r in rows][0] == "probe-run-1-000001" != rows[1]["request_id"]
    assert [probe.headers["x-request-id"], forged.headers["x-request-id"]] == [r["request_id"] for r in rows]
