"""Fuzzing the sidecar with hypothesis (fixed seed, bounded examples): request bodies and SSE streams.

Whatever a client sends and whatever an upstream streams back, the sidecar never answers its own
500, and once every request is over no gauge is left above 0.
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
    wait_until(lambda: not rig.app.state.tracker.live, 10, what="every request leaving the live set")
    assert set(live_gauges(rig)) <= {0.0}


@seed(20261201)
@FUZZ
@given(body=_bodies)
def test_json_bodies_never_get_a_sidecar_500(rig, body):
    response = httpx.post(rig.url + PATH, json=body, timeout=10)
    assert response.status_code != 500, response.text
    _no_gauge_left(rig)


@seed(20261202)
@FUZZ
@given(raw=_raw_bodies)
def test_raw_bodies_never_get_a_sidecar_500(rig, raw):
    response = httpx.post(
        rig.url + PATH, content=raw, timeout=10, headers={"content-type": "application/json"}
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
    response = httpx.post(rig.url + PATH, json=body, timeout=10, headers={"x-fake": "scripted"})
    assert response.status_code == 200
    _no_gauge_left(rig)
