"""The simulator's OpenAI-compatible surface over real loopback HTTP: SSE shape like real engines,
usage on request, non-streaming usage, 429 with Retry-After, 400s that name the field, slot release
on client disconnect, and seeded token counts."""

from __future__ import annotations

import json
from contextlib import contextmanager

import httpx
import pytest
from support.waiting import patient, wait_until

from collector.serving import serve_in_thread
from collector.sim.app import create_sim_app
from collector.sim.config import SimConfig


@contextmanager
def running_sim(**settings):
    handle = serve_in_thread(create_sim_app(SimConfig(**settings)))
    try:
        yield handle.url
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def fast_sim():
    with running_sim(speed=50.0, seed=3) as url:
        yield url


def _events(url: str, body: dict) -> list:
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=patient(30)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def _chat(content: str, **extra) -> dict:
    return {"model": "sim", "messages": [{"role": "user", "content": content}]} | extra


def test_stream_with_usage_matches_real_engines(fast_sim):
    raw = _events(
        fast_sim,
        _chat("hello", stream=True, max_tokens=7, ignore_eos=True, stream_options={"include_usage": True}),
    )
    assert raw[-1] == "[DONE]"
    events = [json.loads(e) for e in raw[:-1]]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    content = [e["choices"][0]["delta"]["content"] for e in events[1:-2]]
    assert content and all(content)
    assert len("".join(content).split()) == 7  # one word per token
    final, usage = events[-2], events[-1]
    assert final["choices"][0]["finish_reason"] == "length" and final["choices"][0]["delta"] == {}
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    assert {e["id"] for e in events} == {events[0]["id"]} and events[0]["object"] == "chat.completion.chunk"


def test_stream_without_include_usage_has_no_usage_chunk(fast_sim):
    raw = _events(fast_sim, _chat("hello", stream=True, max_tokens=3, ignore_eos=True))
    events = [json.loads(e) for e in raw[:-1]]
    assert all("usage" not in e for e in events) and events[-1]["choices"][0]["finish_reason"]


def test_non_streaming_completion_carries_usage(fast_sim):
    response = httpx.post(
        f"{fast_sim}/v1/completions",
        timeout=patient(30),
        json={"model": "sim", "prompt": "x" * 40, "max_tokens": 9, "ignore_eos": True},
    )
    body = response.json()
    assert body["object"] == "text_completion" and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 9, "total_tokens": 19}
    assert len(body["choices"][0]["text"].split()) == 9


def test_models_lists_the_served_model(fast_sim):
    assert httpx.get(f"{fast_sim}/v1/models").json()["data"][0]["id"] == "headroom-sim"


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"model": "sim"}, "messages"),
        (_chat("hi", max_tokens=0), "max_tokens"),
        (_chat("hi", max_tokens=10**6), "maximum context length"),
    ],
)
def test_bad_requests_get_400_naming_the_field(fast_sim, body, needle):
    response = httpx.post(f"{fast_sim}/v1/chat/completions", json=body)
    assert response.status_code == 400 and needle in response.json()["error"]["message"]


def _token_counts(url: str) -> list[int]:
    counts = []
    for i in range(12):
        body = httpx.post(
            f"{url}/v1/chat/completions", timeout=patient(30), json=_chat(f"question {i}", max_tokens=400)
        ).json()
        counts.append(body["usage"]["completion_tokens"])
    return counts


def test_same_seed_and_settings_give_the_same_token_counts():
    with running_sim(speed=200.0, seed=11, mean_output_tokens=20) as url:
        first = _token_counts(url)
    with running_sim(speed=200.0, seed=11, mean_output_tokens=20) as url:
        again = _token_counts(url)
    with running_sim(speed=200.0, seed=12, mean_output_tokens=20) as url:
        other = _token_counts(url)
    assert first == again
    assert first != other
    assert len(set(first)) > 3  # lengths vary from request to request


def _wait_for(url: str, predicate, timeout_s: float = 10.0) -> dict:
    def state() -> dict | None:
        current = httpx.get(f"{url}/sim/state").json()
        return current if predicate(current) else None

    return wait_until(state, timeout_s, what="the simulator state")


def test_full_queue_gives_429_with_retry_after_and_disconnect_frees_the_slot():
    slow = _chat("hold", stream=True, max_tokens=2000, ignore_eos=True)
    with (
        running_sim(speed=0.2, max_num_seqs=1, max_waiting=1) as url,
        httpx.Client(timeout=patient(30)) as client,
    ):
        with client.stream("POST", f"{url}/v1/chat/completions", json=slow) as running:
            _wait_for(url, lambda s: s["running"] == 1)
            with client.stream("POST", f"{url}/v1/chat/completions", json=slow) as queued:
                _wait_for(url, lambda s: s["waiting"] == 1)
                rejected = client.post(f"{url}/v1/chat/completions", json=slow)
                assert rejected.status_code == 429
                assert rejected.headers["retry-after"] == "1"
                assert "queue is full" in rejected.json()["error"]["message"]
                assert queued.status_code == 200 and running.status_code == 200
        state = _wait_for(url, lambda s: s["running"] == 0 and s["waiting"] == 0)
        assert state["kv_used_blocks"] == 0  # aborted requests gave their KV blocks back


def test_non_streaming_client_that_leaves_frees_its_slot():
    with running_sim(speed=0.2) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{url}/v1/chat/completions",
                timeout=httpx.Timeout(patient(10), read=0.3),  # the client leaves after 0.3 s
                json=_chat("wait", max_tokens=2000, ignore_eos=True),
            )
        state = _wait_for(url, lambda s: s["running"] == 0 and s["waiting"] == 0)
        assert state["kv_used_blocks"] == 0 and state["generation_tokens_total"] < 2000


def test_stop_sequence_ends_the_output_before_it(fast_sim):
    body = {"model": "sim", "prompt": "tell me", "max_tokens": 30, "ignore_eos": True}
    full = httpx.post(f"{fast_sim}/v1/completions", json=body, timeout=patient(30)).json()["choices"][0][
        "text"
    ]
    stop = full.split(" ")[6]
    cut = httpx.post(f"{fast_sim}/v1/completions", json=body | {"stop": [stop]}, timeout=patient(30)).json()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["text"] == full[: full.index(stop)]
    assert cut["usage"]["completion_tokens"] < 30
