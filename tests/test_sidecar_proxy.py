"""The proxy against a real upstream on loopback: bytes, outcomes and lifecycle per failure mode."""

from __future__ import annotations

import contextlib
import json
import socket
import threading

import httpx
import pytest
from support.sidecar import CHAT, gauge_values, sidecar_rig, wait_until
from support.waiting import patient

from collector.sidecar.uvicorn_cycle import ChunkWriter
from collector.sidecar.wiring import sidecar_state
from collector.store.db import RequestStore

PATH = "/v1/chat/completions"


@pytest.fixture
def rig(tmp_path):
    # long enough for the fake upstream to answer on a busy host; the hang and stall tests wait it out
    with sidecar_rig(tmp_path, read_timeout_s=2.0) as rig:
        yield rig


def _post(rig, body=CHAT, mode="ok", **headers):
    return httpx.post(rig.url + PATH, json=body, headers={"x-fake": mode, **headers}, timeout=patient(10))


def _only_row(rig, **where):
    rows = rig.rows()
    assert len(rows) == 1, rows
    row = rows[0]
    for key, value in where.items():
        assert row[key] == value, (key, row[key], value)
    return row


def test_stream_without_include_usage_is_byte_identical_and_usage_is_accounted(rig):
    direct = httpx.post(rig.upstream.url + PATH, json=CHAT).content
    via = _post(rig).content
    assert via == direct  # the injected usage chunk never reaches the client
    assert b'"usage"' not in via
    sent = rig.fake.requests[-1]["payload"]
    assert sent["stream_options"] == {"include_usage": True}  # the proxy asked for it upstream
    row = _only_row(
        rig,
        outcome="ok",
        status_code=200,
        usage_source="upstream",
        completion_tokens=5,
        prompt_tokens=8,
        cached_prompt_tokens=1,
    )
    assert 0 < row["ttft_s"] <= row["e2e_s"]
    assert row["tpot_s"] == pytest.approx((row["e2e_s"] - row["ttft_s"]) / 4)


def test_stream_with_include_usage_passes_the_usage_chunk_through(rig):
    body = {**CHAT, "stream_options": {"include_usage": True}}
    direct = httpx.post(rig.upstream.url + PATH, json=body).content
    via = _post(rig, body).content
    assert via == direct and b'"usage":{' in via
    _only_row(rig, outcome="ok", usage_source="upstream")


def test_explicit_include_usage_false_is_respected(rig):
    body = {**CHAT, "stream_options": {"include_usage": False}}
    via = _post(rig, body, **{"x-fake-tokens": "12"}).content
    assert b'"usage"' not in via
    assert rig.fake.requests[-1]["payload"]["stream_options"] == {"include_usage": False}
    row = _only_row(rig, outcome="ok", usage_source="estimated")
    assert row["completion_tokens"] == 12  # one " tokN" chunk is one token by the estimate


def test_vllm_style_usage_null_fields_are_removed_when_usage_was_injected(rig):
    direct = httpx.post(rig.upstream.url + PATH, json=CHAT, headers={"x-fake": "usage-null"}).content
    assert direct == _post(rig, mode="usage-null").content


def test_non_streaming_passes_body_and_takes_usage(rig):
    body = {**CHAT, "stream": False}
    direct = httpx.post(rig.upstream.url + PATH, json=body)
    via = _post(rig, body)
    assert via.content == direct.content and via.status_code == 200
    _only_row(rig, outcome="ok", stream=False, usage_source="upstream", completion_tokens=5)


def test_429_keeps_retry_after_and_body(rig):
    response = _post(rig, mode="429")
    assert response.status_code == 429 and response.headers["retry-after"] == "7"
    assert response.json()["error"]["message"] == "slow down"
    _only_row(rig, outcome="rate_limited", status_code=429, ttft_s=None)


@pytest.mark.parametrize("mode,outcome", [("500", "upstream_error"), ("400", "bad_request")])
def test_upstream_error_statuses(rig, mode, outcome):
    response = _post(rig, mode=mode)
    assert response.status_code == int(mode)
    _only_row(rig, outcome=outcome, status_code=int(mode))


def test_connection_reset_mid_stream_breaks_the_client_stream_too(rig):
    with pytest.raises(httpx.RemoteProtocolError):
        _post(rig, mode="reset")
    row = _only_row(rig, outcome="upstream_error", status_code=200)
    assert row["completion_tokens"] == 2 and row["usage_source"] == "estimated"


def test_malformed_sse_is_forwarded_and_marked(rig):
    response = _post(rig, mode="malformed")
    assert b"data: {not json" in response.content
    _only_row(rig, outcome="upstream_error", error="malformed_event: malformed event in stream")


def test_upstream_timeout_answers_504(rig):
    response = _post(rig, mode="hang")
    assert response.status_code == 504
    _only_row(rig, outcome="timeout", status_code=504)


def test_timeout_mid_stream(rig):
    with pytest.raises(httpx.RemoteProtocolError):
        _post(rig, mode="stall")
    _only_row(rig, outcome="timeout", status_code=200, completion_tokens=1)


def _cancel_after(rig, mode: str, read_chunks: int) -> None:
    with httpx.Client(timeout=patient(10)) as client:
        with client.stream(
            "POST",
            rig.url + PATH,
            json=CHAT,
            headers={"x-fake": mode, "x-fake-tokens": "1000", "x-fake-delay": "0.01"},
        ) as response:
            chunks = response.iter_raw()
            for _ in range(read_chunks):
                next(chunks)
        # leaving the block closes the connection mid-stream


def test_client_disconnect_mid_stream(tmp_path):
    with sidecar_rig(tmp_path) as rig:
        _cancel_after(rig, "ok", read_chunks=3)
        wait_until(lambda: not sidecar_state(rig.app).tracker.live)
        row = _only_row(rig, outcome="client_cancelled")
        assert row["ttft_s"] is not None and row["completion_tokens"] < 1000
        metrics = rig.metrics()
        assert gauge_values(metrics, "headroom_inflight_requests") == [0.0]
        assert gauge_values(metrics, "headroom_active_tokens") == [0.0]


def test_client_disconnect_before_first_token(tmp_path):
    with sidecar_rig(tmp_path) as rig:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(rig.url + PATH, json=CHAT, headers={"x-fake": "hang"}, timeout=0.5)
        wait_until(lambda: not sidecar_state(rig.app).tracker.live)
        _only_row(rig, outcome="client_cancelled", ttft_s=None, first_byte_at=None)
        assert gauge_values(rig.metrics(), "headroom_inflight_requests") == [0.0]


def test_other_v1_paths_pass_through_unaccounted(rig):
    response = httpx.get(rig.url + "/v1/models")
    assert response.json()["data"][0]["id"] == "fake-model"
    assert rig.rows() == []


def test_bad_json_body_is_forwarded_and_logged(rig):
    response = httpx.post(rig.url + PATH, content=b"{not json", headers={"x-fake": "400"})
    # the fake answers 500 to an unparsable body (its json.loads fails): the sidecar passes it on
    assert response.status_code >= 400
    row = _only_row(rig, model="unknown")
    assert row["outcome"] in ("bad_request", "upstream_error")


def test_probe_load_through_the_sidecar_is_logged_as_probe_not_traffic(rig):
    _post(rig, **rig.probe_marks("run-42"))
    _post(rig, **{"X-Headroom-Source": "something-else"})
    rows = rig.rows()
    assert [(r["source"], r["run_id"]) for r in rows] == [("probe", "run-42"), ("traffic", None)]
    # the credential is the sidecar's: it never reaches the engine
    assert [("x-headroom-probe-token" in r["headers"]) for r in rig.fake.requests] == [False, False]


def test_a_probe_mark_without_the_token_is_traffic_and_counted(rig):
    forged = {"X-Headroom-Source": "probe", "X-Headroom-Run-Id": "run-forged", "X-Headroom-Probe-Level": "2"}
    _post(rig, mode="500", **forged)  # a client hiding its failures as probe load
    _post(rig, mode="500", **forged, **{"X-Headroom-Probe-Token": "guess"})
    _post(rig, **rig.probe_marks("run-real", **{"X-Headroom-Probe-Level": "2"}))
    rows = rig.rows()
    assert [(r["source"], r["run_id"], r["probe_level"]) for r in rows] == [
        ("traffic", None, None),
        ("traffic", None, None),
        ("probe", "run-real", 2),
    ]
    metrics = rig.metrics()
    ignored = {
        dict(labels)["reason"]: v
        for (name, labels), v in metrics.items()
        if name == "headroom_probe_marks_ignored_total"
    }
    assert ignored == {"no_token": 1.0, "wrong_token": 1.0}
    failed = {
        dict(labels)["source"]
        for (name, labels), v in metrics.items()
        if name == "headroom_requests_total" and dict(labels).get("outcome") != "ok" and v
    }
    assert failed == {"traffic"}  # the SLO rules see the forged failures


def test_what_a_probe_request_measures_travels_in_its_headers_into_the_row(rig):
    def probe(**more: str | bytes) -> dict[str, str | bytes]:
        return rig.probe_marks("run-7", **more)

    _post(rig, **probe(**{"X-Headroom-Request-Id": "probe-run-7-000001", "X-Headroom-Probe-Level": "8"}))
    _post(rig, **probe(**{"X-Headroom-Probe-Level": "16", "X-Headroom-Probe-Warmup": "1"}))
    _post(rig, **probe(**{"X-Headroom-Probe-Rate": "2.5", "X-Headroom-Probe-Warmup": "0"}))
    for garbage in ("nan", "-1", "1e9", "\u00b2".encode(), "eight"):  # not recorded, and never a crash
        _post(rig, **probe(**{"X-Headroom-Probe-Level": garbage, "X-Headroom-Probe-Rate": garbage}))
    _post(rig, **{"X-Headroom-Probe-Level": "8"})  # traffic naming a level: not a probe's row
    rows = rig.rows()
    assert [(r["probe_level"], r["probe_rate_per_s"], r["probe_warmup"]) for r in rows] == [
        (8, None, False),
        (16, None, True),
        (None, 2.5, False),
        *[(None, None, None)] * 6,
    ]
    assert rows[0]["request_id"] == "probe-run-7-000001" and rows[-1]["source"] == "traffic"


def test_query_string_on_an_accounted_path_reaches_the_upstream(rig):
    response = httpx.post(rig.url + PATH + "?api-version=2024-06-01", json=CHAT, timeout=patient(10))
    assert response.status_code == 200
    assert rig.fake.targets[-1] == (PATH.encode(), b"api-version=2024-06-01")
    _only_row(rig, outcome="ok", endpoint=PATH)


def test_pass_through_keeps_the_percent_encoded_path(rig):
    response = httpx.get(rig.url + "/v1/models/org%2Fmodel?x=a%26b")
    assert response.status_code == 200
    assert rig.fake.targets[-1] == (b"/v1/models/org%2Fmodel", b"x=a%26b")


@pytest.mark.parametrize("mode", ["error-event", "error-field"])
def test_an_error_sent_inside_a_200_stream_is_an_upstream_error(rig, mode):
    response = _post(rig, mode=mode)
    assert response.status_code == 200 and b"error" in response.content  # forwarded as sent
    row = _only_row(
        rig, outcome="upstream_error", status_code=200, error="error_event: error event in stream"
    )
    assert row["completion_tokens"] == 2


def test_shutdown_with_a_stream_in_flight_logs_its_row_as_a_shutdown(tmp_path):
    with sidecar_rig(tmp_path) as rig:
        arrived = rig.fake.expect("long")

        def client():
            with contextlib.suppress(httpx.HTTPError):
                with httpx.stream(
                    "POST",
                    rig.url + PATH,
                    json=CHAT,
                    timeout=patient(30),
                    headers={"x-fake-tokens": "100000", "x-fake-delay": "0.01", "x-test-id": "long"},
                ) as response:
                    for _ in response.iter_raw():
                        pass

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        assert arrived.wait(patient(10))
        wait_until(lambda: any(r.first_token_mono for r in sidecar_state(rig.app).tracker.live.values()))
        rig.sidecar.server.config.timeout_graceful_shutdown = 0.2  # cancel what is in flight
        rig.sidecar.stop()
        thread.join(patient(10))
        path = sidecar_state(rig.app).config.db_path
    store = RequestStore(path)  # the row was flushed by the shutdown itself
    rows = store.query_dicts("SELECT outcome, error, status_code FROM requests")
    store.close()
    assert rows == [{"outcome": "client_cancelled", "error": "sidecar shut down", "status_code": 200}]


def test_pass_through_stream_is_cancelled_upstream_when_the_client_leaves(rig):
    with httpx.Client(timeout=patient(10)) as client:
        with client.stream("GET", rig.url + "/v1/slow") as response:
            chunks = response.iter_raw()
            assert next(chunks).startswith(b"data: 0")
    # the client hung up after one chunk: the sidecar must drop its upstream request too, or an
    # unaccounted generation keeps running on the engine for nobody
    assert rig.fake.slow_client_left.wait(patient(5))


def test_a_redirect_reaches_the_client_as_sent(rig):
    response = httpx.get(rig.url + "/v1/moved")  # httpx does not follow redirects by default
    assert response.status_code == 307 and response.headers["location"] == "/v1/models"
    assert rig.fake.targets[-1][0] == b"/v1/moved"  # the proxy did not follow it either


@pytest.mark.parametrize("path", ["/v1/models", PATH])
def test_cors_preflight_is_passed_through(rig, path):
    response = httpx.options(
        rig.url + path, headers={"Origin": "http://ui.example", "Access-Control-Request-Method": "POST"}
    )
    assert response.status_code != 405  # the sidecar has no opinion on OPTIONS; the engine answers
    assert rig.fake.targets[-1][0] == path.encode()
    assert rig.rows() == []  # and it is not an accounted request


def test_a_client_that_stops_reading_holds_the_upstream_back(tmp_path, monkeypatch):
    """The relay writes each read's chunk to uvicorn's transport itself (a ChunkWriter),
    so it must keep uvicorn's flow control: while the client reads nothing, the sidecar stops
    reading the upstream, which then cannot send the whole of a ~29 MB stream; once the client
    reads, every event arrives and the request ends as one ok row."""
    cycles = []
    writer_on = ChunkWriter.on
    monkeypatch.setattr(
        ChunkWriter, "on", staticmethod(lambda send: cycles.append(writer_on(send)) or cycles[-1])
    )
    tokens, text = 60_000, "x" * 400
    body = json.dumps({**CHAT, "stream": True}).encode()
    with sidecar_rig(tmp_path) as rig:
        drained = rig.fake.drained("held")
        host, port = rig.url.removeprefix("http://").split(":")
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # no autotuned window
            sock.settimeout(patient(30))
            sock.connect((host, int(port)))
            head = (
                f"POST {PATH} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nx-test-id: held\r\nx-fake-tokens: {tokens}\r\n"
                f"x-fake-text: {text}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)
            received = sock.recv(1024)
            assert received.startswith(b"HTTP/1.1 200")
            # bounded wait for what must not happen: without flow control the sidecar would read
            # the whole stream into its own buffers in well under a second
            assert not drained.wait(2.0), "the upstream sent everything to a client that read nothing"
            while not received.endswith(b"\r\n0\r\n\r\n"):
                more = sock.recv(1 << 20)
                assert more, "the sidecar closed the stream early"
                received += more
        assert drained.is_set()
        assert cycles and cycles[0] is not None  # the chunks went straight to uvicorn's transport
        assert received.count(json.dumps(text).encode()) == tokens
        assert received.rstrip().endswith(b"data: [DONE]\n\n\r\n0")
        row = _only_row(rig, outcome="ok", completion_tokens=tokens)
        assert row["e2e_s"] >= 2.0  # it waited for the client


def test_the_chunk_writer_is_only_for_uvicorns_own_started_chunked_response():
    async def send(message):
        pass

    assert ChunkWriter.on(send) is None  # any other server's send: ASGI messages
    assert ChunkWriter.on(print) is None  # a bound builtin's __self__ is a module
