"""Fuzzing the sidecar with hypothesis (fixed seed, bounded examples): request bodies and SSE streams.

Whatever a client sends and whatever an upstream streams back, the sidecar never answers its own
500, and once every request is over no gauge is left above 0. Generated tool calls and Responses
API streams are counted by the same rule as chat content (issue #36 N9, N8).
"""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from support.sidecar import live_gauges, sidecar_rig, wait_until
from support.strategies import json_scalars
from support.waiting import patient

from collector.sidecar.wiring import sidecar_state
from collector.tokens import tokens_for_characters

PATH = "/v1/chat/completions"
FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

_scalars = json_scalars(max_text=20)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_known = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.text(max_size=12), _scalars),
        "stream": st.one_of(st.booleans(), _scalars),
        "stream_options": _json,
        "max_tokens": _scalars,
        "max_completion_tokens": _scalars,
        "messages": st.one_of(
            st.lists(st.fixed_dictionaries({}, optional={"role": _scalars, "content": _json}), max_size=3),
            _json,
        ),
        "prompt": _json,
    },
)
_bodies = st.one_of(
    st.builds(
        lambda known, extra: {**extra, **known},
        _known,
        st.dictionaries(st.text(max_size=8), _json, max_size=3),
    ),
    _json,
)
_raw_bodies = st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode))


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with sidecar_rig(tmp_path_factory.mktemp("fuzz"), read_timeout_s=5.0) as rig:
        yield rig


def _no_gauge_left(rig) -> None:
    wait_until(lambda: not sidecar_state(rig.app).tracker.live, 10, what="every request leaving the live set")
    assert set(live_gauges(rig)) <= {0.0}


@seed(20261201)
@FUZZ
@given(body=_bodies)
def test_json_bodies_never_get_a_sidecar_500(rig, body):
    response = httpx.post(rig.url + PATH, json=body, timeout=patient(10))
    assert response.status_code != 500, response.text
    _no_gauge_left(rig)


@seed(20261202)
@FUZZ
@given(raw=_raw_bodies)
def test_raw_bodies_never_get_a_sidecar_500(rig, raw):
    response = httpx.post(
        rig.url + PATH, content=raw, timeout=patient(10), headers={"content-type": "application/json"}
    )
    assert response.status_code != 500, response.text
    _no_gauge_left(rig)


_event_lines = st.one_of(
    st.builds(lambda obj: b"data: " + repr(obj).encode(), _json),
    st.builds(lambda obj: b"data: " + json.dumps(obj).encode(), _json),
    st.sampled_from(
        [
            b"data: [DONE]",
            b": keep-alive",
            b"event: error",
            b"error: {}",
            b"id: 7",
            b"data:",
            b'data: {"choices":[{"delta":{"content":"hi"}}]}',
            b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":-1}}',
            b'data: {"choices":[{"delta":{"tool_calls":[{"id":"x"}]}}],"usage":null}',
        ]
    ),
    st.binary(max_size=40),
)
_streams = st.lists(st.lists(_event_lines, min_size=1, max_size=3).map(b"\n".join), max_size=8).map(
    lambda events: b"".join(event + b"\n\n" for event in events)
)


@seed(20261203)
@FUZZ
@given(
    stream=_streams,
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=6),
    usage=st.booleans(),
    crlf=st.booleans(),
)
def test_sse_streams_never_get_a_sidecar_500_or_leak_a_gauge(rig, stream, cuts, usage, crlf):
    if crlf:
        stream = stream.replace(b"\n", b"\r\n")
    body = {
        "model": "m1",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "x_fake_stream": base64.b64encode(stream).decode(),
        "x_fake_cuts": cuts,
    }
    if usage:
        body["stream_options"] = {"include_usage": True}
    response = httpx.post(rig.url + PATH, json=body, timeout=patient(10), headers={"x-fake": "scripted"})
    assert response.status_code == 200
    _no_gauge_left(rig)


# Issue #36 N9 and N8: what the engine generates is counted whatever shape it streams in


def _last_row(rig) -> dict:
    wait_until(lambda: not sidecar_state(rig.app).tracker.live, 10, what="the request leaving the live set")
    return rig.rows()[-1]


def _scripted(rig, path: str, events: list[bytes], cuts: list[int], **extra) -> httpx.Response:
    stream = b"".join(events)
    body = {
        "model": "m1",
        "stream": True,
        "x_fake_stream": base64.b64encode(stream).decode(),
        "x_fake_cuts": cuts,
        **extra,
    }
    return httpx.post(rig.url + path, json=body, timeout=patient(10), headers={"x-fake": "scripted"})


def _sse(obj: dict, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj).encode() + b"\n\n"


@seed(20261204)
@settings(FUZZ, max_examples=15)
@given(
    arguments=st.text(min_size=1, max_size=3000),
    pieces=st.integers(min_value=1, max_value=12),
    cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=4),
)
def test_tool_call_arguments_without_usage_are_estimated_like_content(rig, arguments, pieces, cuts):
    """N9: without engine usage, a tool call's arguments count as their characters / 4, not one
    token a chunk (a 2,000-character argument string is about 500 tokens, and counted 1)."""
    size = -(-len(arguments) // pieces)
    parts = [arguments[i : i + size] for i in range(0, len(arguments), size)]
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    events = [_sse({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}]})]
    for part in parts:
        delta = {"tool_calls": [{"index": 0, "function": {"arguments": part}}]}
        events.append(_sse({"choices": [{"index": 0, "delta": delta}]}))
    events.append(b"data: [DONE]\n\n")
    answer = _scripted(rig, PATH, events, cuts, stream_options={"include_usage": False})
    assert answer.status_code == 200
    row = _last_row(rig)
    expected = tokens_for_characters(len("get_weather")) + sum(tokens_for_characters(len(p)) for p in parts)
    assert row["usage_source"] == "estimated" and row["completion_tokens"] == expected
    assert row["completion_tokens"] >= len(arguments) // 4


@seed(20261205)
@settings(FUZZ, max_examples=15)
@given(
    deltas=st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=10),
    usage=st.one_of(st.none(), st.tuples(st.integers(0, 10**6), st.integers(0, 10**6))),
    cuts=st.lists(st.integers(min_value=1, max_value=2000), max_size=4),
)
def test_responses_api_streams_are_accounted_like_chat_completions(rig, deltas, usage, cuts):
    """N8: /v1/responses is accounted: `response.output_text.delta` events carry the tokens (and
    the first one is the first token), `response.completed` the usage; one row each."""
    before = len(rig.rows())
    events = [_sse({"type": "response.created", "response": {"id": "resp_1"}}, "response.created")]
    for text in deltas:
        delta = {"type": "response.output_text.delta", "item_id": "msg_1", "delta": text}
        events.append(_sse(delta, "response.output_text.delta"))
    if usage is not None:
        counts = {"input_tokens": usage[0], "output_tokens": usage[1], "total_tokens": sum(usage)}
        done = {"type": "response.completed", "response": {"id": "resp_1", "usage": counts}}
        events.append(_sse(done, "response.completed"))
    answer = _scripted(rig, "/v1/responses", events, cuts, input="tell me a story please")
    assert answer.status_code == 200 and answer.content == b"".join(events)  # forwarded untouched
    assert "stream_options" not in rig.fake.requests[-1]["payload"]  # never asked for
    row = _last_row(rig)
    assert len(rig.rows()) == before + 1
    assert row["endpoint"] == "/v1/responses" and row["outcome"] == "ok" and row["ttft_s"] is not None
    if usage is None:
        estimate = sum(tokens_for_characters(len(text)) for text in deltas)
        assert row["usage_source"] == "estimated" and row["completion_tokens"] == estimate
    else:
        assert row["usage_source"] == "upstream"
        assert (row["prompt_tokens"], row["completion_tokens"]) == usage
