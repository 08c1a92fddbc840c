"""Pure pieces of the sidecar: SSE splitting, chunk reading, request parsing, tenants, tracker."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from support.strategies import json_scalars
from support.waiting import patient
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from collector.sidecar.client import ClientChannel
from collector.sidecar.ending import Ending
from collector.sidecar.live import LiveRequest
from collector.sidecar.proxy import CompletionsProxy
from collector.sidecar.requests import parse_request
from collector.sidecar.tenants import LabelCap, resolve_tenant
from collector.sidecar.tracker import Tracker
from collector.sidecar.uvicorn_cycle import client_closing
from collector.sse import (
    DONE,
    ERROR,
    MALFORMED,
    EventSplitter,
    _parse_plain,
    _strip_plain,
    inspect_event,
    plain_read,
)


def _now() -> tuple[float, float]:
    """(began, now) of an upstream read that took no time, for Tracker.relayed."""
    now = time.monotonic()
    return now, now


def plain_tokens(complete: bytes) -> int | None:
    """The tokens `plain_read` reads in a read of plain chunks, None when it leaves the read."""
    read = plain_read(complete)
    return None if read is None else read[0]


def test_splitter_reassembles_the_real_llamacpp_stream_under_any_chunking(fixtures_dir):
    data = (fixtures_dir / "llamacpp" / "chat_stream_with_usage.sse").read_bytes()
    rng = random.Random(7)
    for _ in range(20):
        splitter, forwarded, events, i = EventSplitter(), [], [], 0
        while i < len(data):
            step = rng.randint(1, 400)
            complete, completed = splitter.feed(data[i : i + step])
            forwarded.append(complete)
            events += completed
            assert splitter.join(completed) == complete
            i += step
        assert b"".join(forwarded) == data and splitter.remainder() == b""
        assert len(events) == 304


def test_splitter_handles_crlf_and_keeps_a_truncated_tail():
    splitter = EventSplitter()
    assert splitter.feed(b"data: a\r\n\r\ndata: b") == (b"data: a\r\n\r\n", [b"data: a"])
    assert splitter.remainder() == b"data: b"
    assert splitter.feed(b"\r\n\r\n") == (b"data: b\r\n\r\n", [b"data: b"])


def test_real_stream_token_estimate_and_usage(fixtures_dir):
    data = (fixtures_dir / "llamacpp" / "chat_stream_with_usage.sse").read_bytes()
    infos = [inspect_event(e) for e in EventSplitter().feed(data)[1]]
    lean = inspect_event(EventSplitter().feed(data)[1][0], keep_chunk=False)  # 0 tokens, shared
    assert lean.tokens_estimate == 0 and lean not in (DONE, MALFORMED, ERROR)  # markers by identity
    assert infos[0].tokens_estimate == 0  # role-only first chunk is not a token
    assert infos[1].tokens_estimate == 1
    assert infos[-1] is DONE
    assert infos[-2].usage_only and infos[-2].usage["completion_tokens"] == 300
    estimate = sum(i.tokens_estimate for i in infos if i not in (DONE, MALFORMED))
    assert abs(estimate - 300) <= 3  # documented heuristic, checked on a real capture


@pytest.mark.parametrize(
    "event,tokens",
    [
        (b'data: {"choices":[{"delta":{"tool_calls":[{"id":"x"}]}}]}', 1),
        (b'data: {"choices":[{"text":"hello there friend"}]}', 4),
        (b'data: {"choices":[{"delta":{"content":""}}]}', 0),
        (b": keep-alive", None),
        (b'event: message\ndata: {"choices":[{"delta":{"content":"abcd"}}]}', 1),
        (b'data: {"choices":[{"delta":{"reasoning_content":"abcdefgh"}}]}', 2),  # DeepSeek, old vLLM
        (b'data: {"choices":[{"delta":{"reasoning":"abcdefgh"}}]}', 2),  # vLLM >= 0.9: thinking is tokens
        (b'data: {"choices":[{"delta":{"reasoning":"abcdefgh","reasoning_content":"abcdefgh"}}]}', 2),
    ],
)
def test_chunk_token_estimates(event, tokens):
    info = inspect_event(event)
    assert (info.tokens_estimate if info is not None else None) == tokens
    lean = inspect_event(event, keep_chunk=False)  # the proxy's way when not tracing: same reading
    assert (lean.tokens_estimate if lean is not None else None) == tokens


def test_without_the_parsed_chunk_a_plain_chunk_is_a_shared_answer_and_usage_is_still_read():
    plain = b'data: {"id":"c1","choices":[{"delta":{"content":"abcdefgh"}}]}'
    assert inspect_event(plain).chunk == {"id": "c1", "choices": [{"delta": {"content": "abcdefgh"}}]}
    lean = inspect_event(plain, keep_chunk=False)
    assert lean is inspect_event(plain, keep_chunk=False) and lean.chunk is None and lean.tokens_estimate == 2
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}}'
    read = inspect_event(usage, keep_chunk=False)
    assert read.usage == {"prompt_tokens": 3, "completion_tokens": 9} and read.usage_only
    many = b'data: {"choices":[{"delta":{"content":"' + b"x" * 400 + b'"}}]}'  # past the shared ones
    assert inspect_event(many, keep_chunk=False).tokens_estimate == 100


def _one_by_one(complete: bytes) -> int | None:
    """The event-by-event reading of a read: its tokens when every event is a plain chunk."""
    tokens = 0
    for event in EventSplitter().feed(complete)[1]:
        info = inspect_event(event, keep_chunk=False)
        if info is None or info is DONE or info is MALFORMED or info is ERROR or info.usage is not None:
            return None
        tokens += info.tokens_estimate
    return tokens


_PLAIN = b'data: {"choices":[{"delta":{"content":"abcdefgh"}}]}\n\n'
_OTHERS = [
    b": keep-alive\n\n",
    b"data: [DONE]\n\n",
    b'data: {"choices":[],"usage":{"completion_tokens":4}}\n\n',
    b'data: {"error":{"message":"boom"}}\n\n',
    b'error: {"code":500}\n\n',
    b"data: {oops\n\n",
    b"data: [1,2]\n\n",
    b"data: 1, 2\n\n",
    b'id: 7\ndata: {"choices":[{"delta":{"content":"abcd"}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"ab"}}]}\ndata: {"choices":[]}\n\n',
    b'data: {"choices":[{"delta":{"content":"abcd"}}]}\r\n\r\n',
]


def test_a_read_of_plain_chunks_is_read_in_one_parse_and_anything_else_is_left_to_the_slow_path(fixtures_dir):
    vllm = b'data: {"choices":[{"delta":{"content":"abcdefghijkl"}}],"usage":null}\n\n'
    assert plain_tokens(_PLAIN) == 2 and plain_tokens(_PLAIN * 8) == 16 and plain_tokens(vllm * 3) == 9
    # whether a chunk's own usage is null: the relay searches only such reads for what it strips
    assert _parse_plain(_PLAIN * 8) == (16, False) and _parse_plain(_PLAIN * 2 + vllm) == (7, True)
    assert _parse_plain(b'data: {"choices":[{"delta":{"content":"ab","usage":null}}]}\n\n') == (1, False)
    assert plain_tokens(_PLAIN.replace(b"data: ", b"data:") * 2) == 4  # TGI writes no space
    assert plain_tokens(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n') == 0
    for event, tokens in [  # the deltas the inlined common case must leave to `_delta_tokens`
        (b'data: {"choices":[{"delta":{"content":"","tool_calls":[{"id":"x"}]}}]}\n\n', 1),
        (b'data: {"choices":[{"delta":{"content":"abcd","reasoning":"abcdefgh"}}]}\n\n', 3),
        (b'data: {"choices":[{"delta":{"content":null,"reasoning_content":"abcdefgh"}}]}\n\n', 2),
        (b'data: {"choices":[{"text":"hello there friend"}]}\n\n', 4),
        (b'data: {"choices":[{"delta":{"content":"\\u00e9t\\u00e9s"}}]}\n\n', 1),
    ]:
        assert plain_tokens(event) == tokens == _one_by_one(event), event
    rng = random.Random(11)
    for _ in range(400):  # reads mixing plain chunks with every other kind of event
        events = [_PLAIN if rng.random() < 0.7 else rng.choice(_OTHERS) for _ in range(rng.randint(1, 6))]
        complete = b"".join(events)
        if complete.startswith(b"id:") or complete.startswith(b"error:") or complete.startswith(b":"):
            complete = _PLAIN + complete
        fast = plain_tokens(complete)
        assert fast is None or fast == _one_by_one(complete), complete
        if all(event == _PLAIN for event in events):
            assert fast == 2 * len(events)  # the fast path takes every read of plain chunks
    # payloads that are not JSON alone but would join into JSON: the count differs, read slowly
    assert plain_tokens(b"data: [1\n\ndata: 2]\n\n") is None
    capture = (fixtures_dir / "llamacpp" / "chat_stream_with_usage.sse").read_bytes()
    body = capture[: capture.index(b'"usage"')]
    body = body[: body.rindex(b"\n\n") + 2]  # the plain chunks of the real llama.cpp stream
    assert plain_tokens(body) == _one_by_one(body) and plain_tokens(body) > 250


_values = st.one_of(
    json_scalars(max_text=12),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["id", "x"]), st.text(max_size=4), max_size=2),
)
# what a chunk's token-bearing fields may hold: mostly text, sometimes anything
_field = st.one_of(st.text(max_size=12), st.text(max_size=12), _values)
_deltas = st.fixed_dictionaries(
    {},
    optional={
        name: _field for name in ("content", "reasoning", "reasoning_content", "tool_calls", "function_call")
    }
    | {"role": st.just("assistant")},
)
_choices = st.one_of(
    st.fixed_dictionaries({"index": st.integers(0, 3), "delta": _deltas}),
    st.fixed_dictionaries({"index": st.integers(0, 3), "delta": _deltas, "finish_reason": st.none()}),
    st.fixed_dictionaries({"text": _field}),
    st.dictionaries(st.sampled_from(["delta", "text", "finish_reason"]), _values, max_size=3),
    _values,
)
_chunks = st.fixed_dictionaries(
    {
        "choices": st.one_of(
            st.lists(_choices, min_size=1, max_size=3), st.lists(_choices, max_size=3), _values
        )
    },
    optional={
        "id": st.text(max_size=8),
        "model": _values,
        "usage": st.one_of(st.none(), st.none(), st.just({"completion_tokens": 2})),
        "timings": _values,
    },
)


@given(st.lists(_chunks, min_size=1, max_size=6), st.booleans())
@settings(max_examples=600, deadline=None, database=None, derandomize=True)
def test_the_one_parse_reads_any_chunks_as_the_event_by_event_reading_does(chunks, ascii_only):
    complete = b"".join(
        b"data: " + json.dumps(chunk, ensure_ascii=ascii_only).encode() + b"\n\n" for chunk in chunks
    )
    fast = plain_tokens(complete)
    assert fast is None or fast == _one_by_one(complete), complete
    if all(
        type(c["choices"]) is list and all(type(x) is dict and _typed(x) for x in c["choices"])
        for c in chunks
    ):
        # every read of plain chunks takes the fast path; the engine's timings are not plain (read
        # event by event, where they are kept)
        if all(c.get("usage") is None and c.get("timings") is None for c in chunks):
            assert fast == _one_by_one(complete)


# mostly chunks of the kind the one parse takes, so that most reads are all of them
_NULL_END = b',"usage":null}\n\n'
_plain_chunks = st.fixed_dictionaries(
    {"choices": st.lists(st.fixed_dictionaries({"index": st.integers(0, 3), "delta": _deltas}), max_size=2)},
    optional={"id": st.text(max_size=8), "model": _values},
)


@given(
    st.lists(st.one_of(_plain_chunks, _plain_chunks, _plain_chunks, _chunks), min_size=1, max_size=6),
    st.lists(st.sampled_from([True, True, True, False]), min_size=6, max_size=6),
    st.booleans(),
)
@settings(max_examples=600, deadline=None, database=None, derandomize=True)
def test_the_strip_in_the_split_forwards_and_counts_what_parse_then_replace_did(chunks, nulls, ascii_only):
    """vLLM-style reads (`"usage":null` ending each chunk, some or all): `plain_read`'s one split
    must give the old path's tokens and bytes, and take every read whose chunks all end so."""
    texts = []
    for chunk, null in zip(chunks, nulls, strict=False):
        text = json.dumps({k: v for k, v in chunk.items() if k != "usage"}, ensure_ascii=ascii_only).encode()
        texts.append(b"data: " + (text[:-1] + b',"usage":null}' if null else text) + b"\n\n")
    complete = b"".join(texts)
    old = _parse_plain(complete)
    expected = (
        None if old is None else (old[0], complete.replace(b',"usage":null', b"") if old[1] else complete)
    )
    assert plain_read(complete, True) == expected, complete
    assert plain_read(complete, False) == (None if old is None else (old[0], complete))  # asked: kept
    stripped = _strip_plain(complete)
    assert stripped is None or stripped == expected
    if old is not None and all(nulls[: len(texts)]):
        assert stripped == expected  # the one split takes every such read


def test_the_strip_in_the_split_leaves_what_is_not_a_chunks_own_field():
    nested = b'data: {"choices":[{"delta":{"content":"abcd","usage":null}}],"usage":null}\n\n'
    # only the field that ends the chunk is the chunk's own (the whole-read replace took both)
    assert plain_read(nested * 2, True) == (
        2,
        b'data: {"choices":[{"delta":{"content":"abcd","usage":null}}]}\n\n' * 2,
    )
    vllm = b'data: {"choices":[{"delta":{"content":"abcd"}}],"usage":null}\n\n'
    assert _strip_plain(vllm) == (1, b'data: {"choices":[{"delta":{"content":"abcd"}}]}\n\n')
    assert _strip_plain(nested) == (
        1,
        b'data: {"choices":[{"delta":{"content":"abcd","usage":null}}]}\n\n',
    )
    assert _strip_plain(b"data: {oops" + _NULL_END) is None
    assert plain_read(vllm, True) == (1, b'data: {"choices":[{"delta":{"content":"abcd"}}]}\n\n')
    split = b'data: {"choices":\n[{"delta":{"content":"abcd"}}],"usage":null}\n\n'  # two SSE lines
    assert _strip_plain(split * 2) is None and _strip_plain(vllm + split) is None
    assert _strip_plain(split) is None and _parse_plain(split) is None
    for other in _OTHERS:  # a read holding anything else is not taken, whatever ends it
        assert _strip_plain(vllm + other + vllm) is None, other
    assert _strip_plain(b'data: {"choices":[]} {"choices":[],"usage":null}\n\n' + vllm) is None
    assert _strip_plain(vllm.replace(b"abcd", "\u00e9t\u00e9".encode()) * 2) == (
        2,
        b'data: {"choices":[{"delta":{"content":"\xc3\xa9t\xc3\xa9"}}]}\n\n' * 2,
    )
    assert _strip_plain(vllm.replace(b"abcd", b"\xff\xfe") * 2) is None  # not UTF-8: malformed


@given(st.lists(_deltas, min_size=1, max_size=3))
@settings(max_examples=300, deadline=None, database=None, derandomize=True)
def test_any_delta_of_a_plain_chunk_counts_as_the_event_by_event_reading_counts_it(deltas):
    """Every read here is plain, so the one parse must take it: each field's rule is exercised."""
    event = b"data: " + json.dumps({"choices": [{"index": 0, "delta": d} for d in deltas]}).encode() + b"\n\n"
    assert plain_tokens(event) == _one_by_one(event) is not None, event


def _typed(choice: dict) -> bool:
    """A choice the one parse accepts: an object `delta` or none (text is read whatever it is)."""
    return "delta" not in choice or choice["delta"] is None or type(choice["delta"]) is dict


def test_an_event_of_more_than_one_line_or_value_is_left_to_the_event_by_event_reading():
    split = b'data: {"choices":[{"delta":{"content":"abcd"}}]\n}\n\n'  # the SSE line ends at the newline
    assert plain_tokens(split) is None
    assert plain_tokens(_PLAIN + split + _PLAIN) is None
    assert plain_tokens(b'data: {"choices":[]} {"choices":[]}\n\n') is None  # two values, one event


def test_invalid_utf8_in_a_field_nobody_reads_is_still_malformed():
    event = b'data: {"id":"\xff\xfe","choices":[{"delta":{"content":"abcd"}}]}\n\n'
    assert plain_tokens(event) is None and inspect_event(event[:-2]) is MALFORMED
    utf8 = 'data: {"id":"\u00e9","choices":[{"delta":{"content":"\u00e9t\u00e9s"}}]}\n\n'.encode()
    assert plain_tokens(utf8 * 2) == 2 == _one_by_one(utf8 * 2)


def test_malformed_and_non_object_chunks():
    assert inspect_event(b"data: {oops") is MALFORMED
    assert inspect_event(b"data: [1,2]") is MALFORMED
    assert inspect_event(b"data: [DONE]") is DONE


def test_parse_request_injects_usage_only_when_unset():
    injected = parse_request(b'{"model":"m","stream":true,"messages":[{"role":"user","content":"abcdefgh"}]}')
    assert injected.usage_injected and b'"include_usage":true' in injected.body
    assert injected.prompt_tokens_estimate == 3 + 2
    explicit = parse_request(b'{"model":"m","stream":true,"stream_options":{"include_usage":false}}')
    assert not explicit.usage_injected and b"false" in explicit.body
    plain = parse_request(b'{"model":"m","prompt":"abcd","max_tokens":7}')
    assert (plain.stream, plain.max_tokens, plain.prompt_tokens_estimate) == (False, 7, 1)
    garbage = parse_request(b"\xff\xfe not json")
    assert garbage.model == "unknown" and "not valid JSON" in garbage.refusal


def test_tenant_resolution_never_exposes_the_key():
    assert resolve_tenant("team-a", "Bearer sk-secret") == "team-a"
    key = resolve_tenant(None, "Bearer sk-secret")
    assert key.startswith("key-") and len(key) == 12 and "secret" not in key
    assert resolve_tenant(None, None) == "anonymous"


def test_label_cap_admits_the_first_n_values():
    cap = LabelCap(20)
    labels = {cap(f"tenant-{i}") for i in range(500)}
    assert len(labels) == 21 and "other" in labels and cap("tenant-3") == "tenant-3"


def _request(prompt: int) -> LiveRequest:
    return LiveRequest("m", "t", "/v1/chat/completions", True, None, prompt)


def _gauges(registry):
    return (
        registry.get_sample_value("headroom_inflight_requests", {"model": "m", "tenant": "t"}),
        registry.get_sample_value("headroom_active_tokens", {"model": "m", "tenant": "t"}),
    )


def test_token_caliber_walk_with_flat_inflight_and_climbing_tokens():
    registry = CollectorRegistry()
    tracker = Tracker(registry, instance="unit")
    short, long_a, long_b = _request(10), _request(1000), _request(4000)
    tracker.admit(short)
    assert _gauges(registry) == (1, 10) and short.active_tokens_at_admit == 10
    tracker.admit(long_a)
    tracker.admit(long_b)
    assert _gauges(registry) == (3, 5010)
    assert (long_b.inflight_at_admit, long_b.active_tokens_at_admit) == (3, 5010)
    # the batch decodes: request count flat at 3, token caliber climbing every step
    seen = []
    for _ in range(5):
        for request in (short, long_a, long_b):
            tracker.relayed(request, 2, *_now())
        seen.append(_gauges(registry))
    assert [s[0] for s in seen] == [3] * 5
    assert [s[1] for s in seen] == [5016, 5022, 5028, 5034, 5040]
    row = tracker.finish(long_a, "ok", status_code=200)
    assert row.completion_tokens == 10 and row.usage_source == "estimated"
    assert _gauges(registry) == (2, 5040 - 1010)
    assert tracker.finish(long_a, "timeout") is None  # terminal exactly once
    tracker.reported_usage(long_b, {"prompt_tokens": 3900, "completion_tokens": 0})  # 0 is a value
    row = tracker.finish(long_b, "ok")
    assert (row.prompt_tokens, row.completion_tokens, row.tpot_s, row.usage_source) == (
        3900,
        0,
        None,
        "upstream",
    )
    tracker.finish(short, "client_cancelled")
    assert _gauges(registry) == (0, 0) and tracker.active_tokens_total == 0
    assert (
        registry.get_sample_value(
            "headroom_requests_total", {"model": "m", "tenant": "t", "outcome": "ok", "source": "traffic"}
        )
        == 2
    )


def test_tpot_uses_usage_tokens_not_chunks():
    tracker = Tracker(CollectorRegistry(), instance="unit")
    request = _request(5)
    tracker.admit(request)
    tracker.relayed(request, 1, *_now())  # one chunk...
    tracker.reported_usage(request, {"prompt_tokens": 5, "completion_tokens": 11})  # 11 in all
    row = tracker.finish(request, "ok")
    assert row.tpot_s == pytest.approx((row.e2e_s - row.ttft_s) / 10)


@pytest.mark.parametrize(
    "event",
    [
        # SSE allows a field after `data:` (an `id:` line) and splits data across lines (WHATWG §9.2.6)
        b'data: {"choices":[{"delta":{"content":"abcdefgh"}}]}\nid: 7',
        b'data: {"choices":[{"delta":\ndata: {"content":"abcdefgh"}}]}',
        b'event: message\r\ndata:{"choices":[{"delta":\r\ndata: {"content":"abcdefgh"}}]}\r\n: note',
    ],
)
def test_valid_multi_line_events_are_read_not_marked_malformed(event):
    info = inspect_event(event)
    assert info is not MALFORMED and info.tokens_estimate == 2


def test_multi_line_done_is_done():
    assert inspect_event(b"data: [DONE]\nid: 9") is DONE


def test_a_raising_row_sink_neither_breaks_finish_nor_starves_the_others(caplog):
    tracker = Tracker(CollectorRegistry(), instance="unit")
    received = []

    def broken(row):
        raise RuntimeError("exporter down")

    tracker.add_row_sink(broken)
    tracker.add_row_sink(received.append)
    request = _request(5)
    tracker.admit(request)
    row = tracker.finish(request, "ok")  # must not raise into the proxy (it would cut the stream)
    assert received == [row] and not tracker.live
    assert "exporter down" in caplog.text


def test_error_events_are_recognised():
    from collector.sse import ERROR

    assert inspect_event(b'data: {"error":{"message":"boom","code":500}}') is ERROR  # vLLM, SGLang
    assert inspect_event(b'error: {"code":500,"message":"boom"}') is ERROR  # llama.cpp server
    assert inspect_event(b'event: error\ndata: {"message":"boom"}') is ERROR
    assert inspect_event(b'data: {"choices":[{"delta":{"content":"ab"}}],"error":null}') is not ERROR


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","stream":true,"stream_options":[1]}',
        b'{"model":"m","stream":true,"stream_options":"yes"}',
        b'{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":5}]}]}',
        b'{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":["a"]}]}]}',
        b'{"model":"m","prompt":[{"text":7}]}',
    ],
)
def test_hostile_request_bodies_parse_without_raising(body):
    parsed = parse_request(body)  # an exception here is a 500 with no row for the request
    assert parsed.model == "m" and parsed.prompt_tokens_estimate >= 0
    if b"stream_options" in body:  # not ours to fix: forwarded untouched, the engine answers it
        assert parsed.body == body and not parsed.usage_injected


def test_token_id_prompts_count_their_tokens():
    assert parse_request(b'{"model":"m","prompt":[1,2,3,4,5]}').prompt_tokens_estimate == 5
    assert parse_request(b'{"model":"m","prompt":[[1,2],[3,4,5]]}').prompt_tokens_estimate == 5


def test_absurd_upstream_usage_falls_back_to_the_estimate():
    tracker = Tracker(CollectorRegistry(), instance="unit")
    request = _request(7)
    tracker.admit(request)
    tracker.relayed(request, 3, *_now())
    # a value beyond the INTEGER column would get the row's batch rejected by the request log
    tracker.reported_usage(request, {"prompt_tokens": 2**40, "completion_tokens": -1})
    row = tracker.finish(request, "ok")
    assert (row.prompt_tokens, row.completion_tokens, row.usage_source) == (7, 3, "estimated")


def test_config_rejects_bad_urls_and_ports_with_the_option_name():
    from collector.serving import parse_listen
    from collector.sidecar.config import SidecarConfig

    with pytest.raises(ValueError, match="--listen"):
        parse_listen("127.0.0.1:99999")
    with pytest.raises(ValueError, match="--engine-metrics-url 'metrics'"):
        SidecarConfig(upstream="http://x:1", engine_metrics_url="metrics")
    assert parse_listen("[::1]:9100") == ("::1", 9100)


def test_engine_has_one_default_for_the_cli_and_the_config():
    from collector.sidecar.cli import run
    from collector.sidecar.config import SidecarConfig

    option = next(param for param in run.params if param.name == "engine")
    assert option.default == SidecarConfig(upstream="http://x:1").engine == "auto"


def test_healthz_never_shows_upstream_credentials():
    from collector.sidecar.admin import _without_credentials

    assert _without_credentials("http://user:secret@engine:8000") == "http://engine:8000"
    assert _without_credentials("https://engine:8000/base") == "https://engine:8000/base"


def test_one_place_finishes_a_request_and_only_the_tracker_changes_it():
    """Tracker.finish is called once in the sidecar (CompletionsProxy.__call__), and no module but
    the tracker assigns to a LiveRequest's attributes."""
    import ast
    from pathlib import Path

    sidecar = Path(__file__).resolve().parent.parent / "collector" / "sidecar"
    finishes, assignments = [], []
    for path in sorted(sidecar.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "finish" and isinstance(node.ctx, ast.Load):
                finishes.append(path.name)
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "request"
                    and path.name != "tracker.py"
                ):
                    assignments.append(f"{path.name}:{node.lineno}")
    assert finishes == ["proxy.py"] and assignments == []


class _Reads:
    """A stand-in upstream response: its body in the reads given (as BufferedBody hands them over)."""

    status = 200

    def __init__(self, reads: list[bytes]) -> None:
        self._reads = iter(reads)

    async def readany(self) -> bytes:  # BufferedBody's: b"" at the end
        return next(self._reads, b"")


class _Sent:
    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.answered = None  # ClientChannel's: set by the relay once [DONE] was sent

    async def send(self, message: dict) -> None:  # the relay sends its bodies with the ASGI send
        assert message["type"] == "http.response.body" and message["more_body"] is True
        self.data.append(message["body"])


def _relayed(stream: bytes, per_read: int, strip_usage: bool) -> tuple[bytes, int, object, str]:
    """What relay_stream forwards of `stream` cut into reads of `per_read` events, and counts."""
    import asyncio  # noqa: PLC0415 - only this helper runs an event loop

    from collector.sidecar.relay import relay_stream  # noqa: PLC0415 - beside its only user

    events = [event + b"\n\n" for event in stream.split(b"\n\n") if event]
    reads = [b"".join(events[i : i + per_read]) for i in range(0, len(events), per_read)]
    tracker = Tracker(CollectorRegistry(), instance="t")
    request = LiveRequest("m", "t", "/v1/chat/completions", True, 64, 10)
    tracker.admit(request)
    sent = _Sent()
    ending = asyncio.run(relay_stream(tracker, request, strip_usage, _Reads(reads), sent, 2**20))  # type: ignore[arg-type]
    return b"".join(sent.data) + ending.last, request.generated_tokens, request.usage, ending.outcome


@pytest.mark.parametrize("strip_usage", [True, False])
def test_the_relay_reads_a_stream_alike_whatever_its_reads_hold(fixtures_dir, strip_usage):
    capture = (fixtures_dir / "llamacpp" / "chat_stream_with_usage.sse").read_bytes()
    null = b'"finish_reason":null}]'
    vllm = capture.replace(null, null + b',"usage":null')  # vLLM's every-chunk usage field
    for stream in (capture, vllm):
        one_by_one = _relayed(stream, 1, strip_usage)
        for per_read in (2, 3, 8, 64, 10_000):  # 10,000: the whole answer in one read
            assert _relayed(stream, per_read, strip_usage) == one_by_one, per_read
        forwarded, tokens, usage, outcome = one_by_one
        assert outcome == "ok" and usage["completion_tokens"] == 300 and abs(tokens - 300) <= 3
        assert forwarded.endswith(b"data: [DONE]\n\n") and b'"usage":null' not in forwarded or not strip_usage
        assert (b'"usage":{' in forwarded) is not strip_usage  # the chunk we asked for is ours alone


# --- the disconnect watcher: the decision at the exchange's end ---------------------------------


class _Cycle:
    """A server's request cycle as uvicorn's: `receive` is its method, `transport` its attribute."""

    def __init__(self, transport: object | None) -> None:
        if transport is not None:
            self.transport = transport
        self.disconnect = asyncio.Event()

    async def receive(self) -> dict:
        await self.disconnect.wait()
        return {"type": "http.disconnect"}


class _Transport:
    def __init__(self, closing: bool) -> None:
        self.closing = closing

    def is_closing(self) -> bool:
        return self.closing


def _watched(cycle: _Cycle, exchange) -> Ending:
    proxy = CompletionsProxy(None, None, tenant_header="x-tenant")  # type: ignore[arg-type]
    proxy._exchange = exchange  # type: ignore[method-assign]
    client = ClientChannel(None)

    async def main() -> tuple[Ending, bool]:
        ending = await proxy._watched(None, None, {}, cycle.receive, client, 0.0)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the cancelled watcher ends
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not others, others  # the watcher never outlives the request
        return ending, client.gone

    ending, gone = asyncio.run(main())
    assert gone == (ending.outcome == "client_cancelled")
    return ending


def test_a_disconnect_woken_in_the_exchanges_last_step_is_client_cancelled():
    """The client's FIN and the upstream's last bytes in one poll: the watcher finishes a step
    after the relay ran to its end, before its done-callback ran; still client_cancelled."""
    cycle = _Cycle(None)  # a server that hides its transport

    async def exchange(*_: object) -> Ending:
        await asyncio.sleep(0)  # the watcher waits in receive() by now
        cycle.disconnect.set()
        return Ending("ok")

    assert _watched(cycle, exchange).outcome == "client_cancelled"


@pytest.mark.parametrize("closing", [True, False])
def test_a_closing_transport_decides_at_once(closing):
    """uvicorn's transport is closing as soon as the FIN is read, steps before `http.disconnect`."""
    cycle = _Cycle(_Transport(closing))

    async def exchange(*_: object) -> Ending:
        return Ending("ok")

    assert _watched(cycle, exchange).outcome == ("client_cancelled" if closing else "ok")


def test_a_disconnect_mid_exchange_cancels_it():
    cycle = _Cycle(_Transport(False))
    cancelled = []

    async def exchange(*_: object) -> Ending:
        cycle.disconnect.set()
        try:
            await asyncio.Event().wait()  # the upstream never answers
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return Ending("ok")

    assert _watched(cycle, exchange).outcome == "client_cancelled" and cancelled == [True]


def test_client_closing_reads_only_what_the_server_shows():
    assert client_closing(_Cycle(_Transport(True)).receive) is True
    assert client_closing(_Cycle(None).receive) is None

    async def plain_receive() -> dict:
        return {}

    assert client_closing(plain_receive) is None


def test_relayed_is_generated_and_spent_in_one_call():
    """The relay's one tracker call per read: a read without tokens stamps no TTFT; the first read
    with tokens stamps TTFT, the second the time to second token, and the longest gap between two
    such reads is the row's itl_max_s."""
    tracker = Tracker(CollectorRegistry(), instance="unit")
    request = _request(5)
    tracker.admit(request)
    t0 = request.admitted_mono
    tracker.relayed(request, 0, t0 + 0.010, t0 + 0.011)  # the role chunk's read: no token
    assert request.first_token_mono is None and request.generated_tokens == 0
    tracker.relayed(request, 3, t0 + 0.100, t0 + 0.102)
    assert request.first_token_mono == t0 + 0.102 and request.generated_tokens == 3
    tracker.relayed(request, 2, t0 + 0.150, t0 + 0.153)
    tracker.relayed(request, 1, t0 + 0.400, t0 + 0.401)  # a 0.248 s stall
    tracker.relayed(request, 1, t0 + 0.450, t0 + 0.451)
    assert request.first_token_mono == t0 + 0.102 and request.generated_tokens == 7
    assert request.overhead_s == pytest.approx(0.001 + 0.002 + 0.003 + 0.001 + 0.001)
    assert tracker.load.tokens == 5 + 7  # the prompt's and the generated, in the live load
    row = tracker.finish(request, "ok")
    assert row.completion_tokens == 7 and row.ttft_s == pytest.approx(0.102)
    assert row.ttst_s == pytest.approx(0.153) and row.itl_max_s == pytest.approx(0.248)


def test_the_fast_path_normalises_like_the_segment_loop():
    """normalise_path returns a path unchanged when no empty, `.` or `..` segment can hide in it;
    over random spellings that answer always equals the segment-by-segment one."""
    from collector.sidecar.paths import _segment_by_segment, normalise_path  # noqa: PLC0415 - its own test

    pieces = ["/", "/", "v1", "chat", ".", "..", "%2e", "%2E", "%2F", "%5c", "\\", "a", "completions", "%"]
    rng = random.Random(7)
    fast = 0
    for _ in range(20_000):
        raw = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))).encode()
        assert normalise_path(raw) == _segment_by_segment(raw), raw
        fast += normalise_path(raw) is raw
    assert fast > 300  # the fast path was taken (588 of these spellings), and agreed


def _cancels_left_after_a_shutdown(receive, exchange) -> int:
    """Run `_watched` over `exchange`, which must end cancelled; the cancel requests still pending
    on the request's task after it (the shutdown's own stays, the watch's is taken back)."""
    proxy = CompletionsProxy(None, None, tenant_header="x-tenant")  # type: ignore[arg-type]
    proxy._exchange = exchange  # type: ignore[method-assign]

    async def main() -> int:
        with pytest.raises(asyncio.CancelledError):
            await proxy._watched(None, None, {}, receive, ClientChannel(None), 0.0)  # type: ignore[arg-type]
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    return asyncio.run(main())


def test_a_shutdown_beside_a_disconnect_still_ends_the_request_as_a_shutdown():
    """uvicorn's shutdown cancel landing in the step the watcher cancels: the watcher takes back
    only its own cancel request, and the request ends as a shutdown."""
    cycle = _Cycle(_Transport(False))

    async def exchange(*_: object) -> Ending:
        task = asyncio.current_task()
        assert task is not None
        watcher = next(t for t in asyncio.all_tasks() if t.get_coro().__name__ == "wait_disconnect")
        watcher.add_done_callback(lambda _: task.cancel())  # runs right after the watcher's own
        cycle.disconnect.set()
        await asyncio.Event().wait()
        return Ending("ok")

    assert _cancels_left_after_a_shutdown(cycle.receive, exchange) == 1  # the shutdown's, still pending


class _UvicornTransport(_Transport):
    def __init__(self) -> None:
        super().__init__(False)
        self.resumed = 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        self.resumed += 1


def _uvicorn_cycle() -> tuple[Any, _UvicornTransport]:
    """A real uvicorn request cycle whose request was read, on a transport that records."""
    transport = _UvicornTransport()
    flow = FlowControl(transport)  # type: ignore[arg-type]
    flow.pause_reading()  # a large body's last piece paused reading
    quiet = logging.getLogger("test.uvicorn")
    cycle = RequestResponseCycle(
        {"type": "http", "method": "POST"},  # type: ignore[arg-type]
        transport,  # type: ignore[arg-type]
        flow,
        quiet,
        quiet,
        False,
        [],
        asyncio.Event(),
        False,
        True,
        lambda: None,
    )
    cycle.more_body = False
    return cycle, transport


def _lost(cycle: Any) -> None:
    """What uvicorn's protocol does when the client's connection is lost (connection_lost)."""
    cycle.disconnected = True
    cycle.message_event.set()


def _watched_on_cycle(cycle: Any, exchange) -> tuple[Ending, int]:
    proxy = CompletionsProxy(None, None, tenant_header="x-tenant")  # type: ignore[arg-type]
    proxy._exchange = exchange  # type: ignore[method-assign]
    client = ClientChannel(None)
    own = cycle.message_event

    async def main() -> tuple[Ending, int]:
        ending = await proxy._watched(None, None, {}, cycle.receive, client, 0.0)  # type: ignore[arg-type]
        assert cycle.message_event is own  # the cycle has its own event back
        return ending, len(asyncio.all_tasks())

    ending, tasks = asyncio.run(main())
    assert client.gone == (ending.outcome == "client_cancelled")
    return ending, tasks


def test_on_uvicorn_a_disconnect_mid_exchange_cancels_it_without_a_watcher_task():
    cycle, transport = _uvicorn_cycle()
    cancelled, tasks = [], []

    async def exchange(*_: object) -> Ending:
        tasks.append(len(asyncio.all_tasks()))
        assert transport.resumed == 1  # reading resumed, as uvicorn's receive would: a FIN is seen
        asyncio.get_running_loop().call_soon(_lost, cycle)
        try:
            await asyncio.Event().wait()  # the upstream never answers
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return Ending("ok")

    ending, _ = _watched_on_cycle(cycle, exchange)
    assert ending.outcome == "client_cancelled" and cancelled == [True]
    assert tasks == [1]  # the request's own task alone: nothing runs beside it
    assert cycle.message_event.is_set()  # uvicorn's own receive still hears the disconnect


@pytest.mark.parametrize("closing", [True, False])
def test_on_uvicorn_a_closing_transport_decides_at_once(closing):
    """The FIN was read with the upstream's last bytes: the transport says so before uvicorn's
    connection_lost runs."""
    cycle, transport = _uvicorn_cycle()

    async def exchange(*_: object) -> Ending:
        transport.closing = closing
        return Ending("ok")

    ending, _ = _watched_on_cycle(cycle, exchange)
    assert ending.outcome == ("client_cancelled" if closing else "ok")
    assert not cycle.message_event.is_set()  # nothing happened to the cycle: its event untouched


def test_on_uvicorn_a_disconnect_after_the_exchange_changes_nothing():
    cycle, _ = _uvicorn_cycle()

    async def exchange(*_: object) -> Ending:
        return Ending("ok")

    ending, _ = _watched_on_cycle(cycle, exchange)
    _lost(cycle)  # on the cycle's own event again: the ended watch hears nothing
    assert ending.outcome == "ok"


def test_on_uvicorn_a_shutdown_beside_a_disconnect_still_ends_the_request_as_a_shutdown():
    cycle, _ = _uvicorn_cycle()

    async def exchange(*_: object) -> Ending:
        task = asyncio.current_task()
        assert task is not None

        def lost_and_shut_down() -> None:
            _lost(cycle)  # the watch's cancel
            task.cancel()  # uvicorn's shutdown, in the same step

        asyncio.get_running_loop().call_soon(lost_and_shut_down)
        await asyncio.Event().wait()
        return Ending("ok")

    own = cycle.message_event
    assert _cancels_left_after_a_shutdown(cycle.receive, exchange) == 1  # the shutdown's, still pending
    assert cycle.message_event is own  # put back on the cancelled path too


class _ProtocolTransport(_UvicornTransport):
    """What uvicorn's protocol needs of a transport: no socket, writes and a close recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closing = True


@pytest.mark.parametrize("then", ["more_body", "connection_lost"])
def test_on_uvicorns_own_protocol_only_a_lost_connection_cancels_the_exchange(then):
    """uvicorn's HttpToolsProtocol, fed bytes, sets the cycle's message_event for a body piece
    (the exchange goes on) and in connection_lost (the exchange is cancelled in that step)."""
    outcomes: list[str] = []
    steps: dict[str, asyncio.Event] = {}

    async def exchange(*_: object) -> Ending:
        assert len(asyncio.all_tasks()) == 2  # the test's and the request's: no watcher task
        steps["started"].set()
        await steps["release"].wait()  # the upstream answers only when the test says so
        return Ending("ok")

    proxy = CompletionsProxy(None, None, tenant_header="x-tenant")  # type: ignore[arg-type]
    proxy._exchange = exchange  # type: ignore[method-assign]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        ending = await proxy._watched(None, None, {}, receive, ClientChannel(None), 0.0)  # type: ignore[arg-type]
        outcomes.append(ending.outcome)
        if ending.outcome == "ok":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"done"})

    async def main() -> None:
        steps.update(started=asyncio.Event(), release=asyncio.Event())
        config = Config(app=app, lifespan="off", log_level="critical")
        state = ServerState()
        protocol = HttpToolsProtocol(config, state, {})
        transport = _ProtocolTransport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n{}"
        )
        await steps["started"].wait()  # the exchange runs; the body's last two bytes are still due
        if then == "more_body":
            protocol.data_received(b"  ")  # on_body, on_message_complete: message_event.set() twice
            steps["release"].set()
        else:
            protocol.connection_lost(None)
        (task,) = state.tasks
        async with asyncio.timeout(patient(10)):  # a watch that never cancels fails here, not by hanging
            await task
        assert (b"\r\ndone\r\n" in transport.written) == (then == "more_body")
        assert protocol.cycle.message_event.is_set()  # its own event, set as by the protocol

    asyncio.run(main())
    assert outcomes == (["ok"] if then == "more_body" else ["client_cancelled"])


@pytest.mark.parametrize("null", [b"", b',"usage":null'])
@pytest.mark.parametrize("strip", [True, False])
def test_the_read_that_ends_a_stream_forwards_what_the_event_by_event_reading_would(null, strip):
    """Plain chunks, the usage chunk and [DONE] in one read (each stream's last under a flood):
    the plain part is read and stripped in one pass, the last two events one by one; the bytes
    and counts must be those of reading every event and then replacing the field."""
    from collector.sidecar.relay import _Stream  # noqa: PLC0415 - beside its only user here

    chunk = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"abcdefgh"}}]%s}\n\n' % null
    usage = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":10}}\n\n'
    read = chunk * 5 + usage + b"data: [DONE]\n\n"
    results = {}
    for one_by_one in (False, True):
        tracker = Tracker(CollectorRegistry(), instance="unit")
        request = _request(3)
        stream = _Stream(tracker, request, strip, 200, ClientChannel(None), 2**20)
        tokens, body = (stream.each_event if one_by_one else stream.events)(stream.splitter.take(read))
        results[one_by_one] = (tokens, body, request.usage, stream.done)
    assert results[False] == results[True]
    tokens, body, usage, done = results[False]
    assert tokens == 10 and usage == {"prompt_tokens": 3, "completion_tokens": 10} and done
    # asked for by us: the usage chunk and every "usage":null go; asked for by the client: all kept
    assert body == (chunk.replace(null, b"") * 5 + b"data: [DONE]\n\n" if strip else read)


def test_the_task_watch_reports_a_disconnect_once_and_nothing_after_stop():
    """TaskWatch, the disconnect watch on ASGI servers other than uvicorn's httptools one."""
    import asyncio  # noqa: PLC0415 - only this test runs an event loop

    from collector.sidecar.client import TaskWatch  # noqa: PLC0415 - beside its only user here

    async def main() -> tuple[bool | None, bool | None, int, int]:
        messages: asyncio.Queue[dict[str, object]] = asyncio.Queue()
        calls: list[str] = []
        left = asyncio.Event()
        watch = TaskWatch(messages.get, lambda: (calls.append("gone"), left.set()))
        before = watch.seen()  # no transport to read: undecided, not gone
        await messages.put({"type": "http.request", "body": b"", "more_body": False})
        await messages.put({"type": "http.disconnect"})
        await asyncio.wait_for(left.wait(), patient(5))
        after = watch.seen()
        watch.stop()
        stopped_calls: list[str] = []
        stopped = TaskWatch(messages.get, lambda: stopped_calls.append("gone"))
        stopped.stop()
        await messages.put({"type": "http.disconnect"})
        await asyncio.sleep(0)  # a step in which a leftover watcher could still call
        return before, after, len(calls), len(stopped_calls)

    assert asyncio.run(main()) == (None, True, 1, 0)
