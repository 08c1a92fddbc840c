"""The simulator answers with the engine's own per-request timings, in each flavor's shape:
llama.cpp's `timings` always (on the last chunk of a stream, the usage chunk when asked for), vLLM's
`metrics` only with --per-request-metrics (never on a stream without usage), SGLang nothing. The
numbers are the simulator's model of the request: prefill and decode add up, with the queue, to
the simulated time it took (in milliseconds of the client's clock: simulated / --speed), equal
the cost model's steps, and the queue is the wait for a slot.

Each simulator runs in this test's event loop behind httpx's ASGI transport, so requests sent
together with asyncio.gather all reach the engine before its first step ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from click.testing import CliRunner
from support.waiting import patient

from collector.cli import main
from collector.sim.app import create_sim_app
from collector.sim.config import SimConfig
from collector.sim.cost import COST_PROFILES

SPEED = 10.0
LLAMACPP_FIELDS = [  # llama.cpp's order (tests/fixtures/llamacpp/chat_stream_with_usage.sse)
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
]
VLLM_FIELDS = [
    "time_to_first_token_ms",
    "generation_time_ms",
    "queue_time_ms",
    "mean_itl_ms",
    "tokens_per_second",
]
GPU = COST_PROFILES["gpu"]


@asynccontextmanager
async def simulator(**settings: object) -> AsyncIterator[httpx.AsyncClient]:
    app = create_sim_app(SimConfig(speed=SPEED, **settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        timeout = patient(30)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim", timeout=timeout) as client:
            yield client


def _chat(content: str, tokens: int, **extra: object) -> dict:
    body = {"model": "sim", "messages": [{"role": "user", "content": content}]}
    return body | {"max_tokens": tokens, "ignore_eos": True} | extra


async def _answer(client: httpx.AsyncClient, body: dict, path: str = "/v1/chat/completions") -> dict:
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def _events(client: httpx.AsyncClient, body: dict, path: str = "/v1/chat/completions") -> list[dict]:
    response = await client.post(path, json=body | {"stream": True})
    assert response.status_code == 200, response.text
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(event) for event in data[:-1]]


async def _sim_time_ms(client: httpx.AsyncClient) -> float:
    """The simulator's clock in milliseconds of the client's clock (what the timings count in)."""
    state = (await client.get("/sim/state")).json()
    return state["sim_time_s"] / SPEED * 1000


def _prefill_ms(prompt_tokens: int) -> float:
    """One prefill step of a lone prompt within the token budget, per the gpu cost model."""
    return GPU.step_seconds(0, prompt_tokens, ((prompt_tokens, 0),)) / SPEED * 1000


def _decode_ms(prompt_tokens: int, generated: int) -> float:
    """The decode steps of a lone request: step g samples token g over prompt + g - 1 KV tokens."""
    steps = (GPU.step_seconds(1, prompt_tokens + g - 1) for g in range(2, generated + 1))
    return sum(steps) / SPEED * 1000


async def test_llamacpp_answer_times_the_prefill_and_decode_steps_of_the_model():
    async with simulator(flavor="llamacpp") as client:
        before = await _sim_time_ms(client)
        body = {"prompt": "x" * 400, "max_tokens": 12, "ignore_eos": True}
        answer = await _answer(client, body, "/v1/completions")
        elapsed_ms = await _sim_time_ms(client) - before
    timings, usage = answer["timings"], answer["usage"]
    assert list(timings) == LLAMACPP_FIELDS and "metrics" not in answer
    assert timings["cache_n"] == 0  # no prefix cache is modelled
    assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"] == 100
    assert timings["predicted_n"] == usage["completion_tokens"] == 12
    assert timings["prompt_ms"] == pytest.approx(_prefill_ms(100), abs=0.001)
    assert timings["predicted_ms"] == pytest.approx(_decode_ms(100, 12), abs=0.001)
    # alone, nothing waited: prefill and decode are the whole simulated time
    assert timings["prompt_ms"] + timings["predicted_ms"] == pytest.approx(elapsed_ms, abs=0.002)
    assert timings["prompt_per_token_ms"] == pytest.approx(timings["prompt_ms"] / 100)
    assert timings["prompt_per_second"] == pytest.approx(100_000 / timings["prompt_ms"])
    assert timings["predicted_per_token_ms"] == pytest.approx(timings["predicted_ms"] / 12)
    assert timings["predicted_per_second"] == pytest.approx(12_000 / timings["predicted_ms"])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("include_usage", [True, False])
async def test_llamacpp_stream_carries_timings_on_its_last_chunk(path, include_usage):
    body = _chat("hello", 9) if path.endswith("chat/completions") else {"prompt": "hello", "max_tokens": 9}
    body |= {"ignore_eos": True, "stream_options": {"include_usage": include_usage}}
    async with simulator(flavor="llamacpp") as client:
        events = await _events(client, body, path)
    carrying = [i for i, event in enumerate(events) if "timings" in event]
    assert carrying == [len(events) - 1]  # the last chunk only
    last = events[-1]
    if include_usage:
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 9
        assert last["timings"]["prompt_n"] == last["usage"]["prompt_tokens"]
    else:
        assert last["choices"][0]["finish_reason"] == "length" and "usage" not in last
    assert last["timings"]["predicted_n"] == 9 and last["timings"]["predicted_ms"] > 0
    assert all("metrics" not in event for event in events)


@pytest.mark.parametrize("settings", [{"flavor": "vllm"}, {"flavor": "sglang"}])
async def test_no_engine_timings_where_the_engine_sends_none(settings):
    async with simulator(**settings) as client:
        answer = await _answer(client, _chat("hello", 4))
        with_usage = await _events(client, _chat("hello", 4, stream_options={"include_usage": True}))
        without_usage = await _events(client, _chat("hello", 4))
    for message in [answer, *with_usage, *without_usage]:
        assert "metrics" not in message and "timings" not in message
    assert with_usage[-1]["usage"]["completion_tokens"] == 4  # the chunk they would ride is there


async def test_vllm_metrics_with_the_flag_split_a_lone_request_into_its_phases():
    async with simulator(flavor="vllm", per_request_metrics=True) as client:
        before = await _sim_time_ms(client)
        answer = await _answer(client, _chat("x" * 400, 12))
        elapsed_ms = await _sim_time_ms(client) - before
    metrics, prompt_tokens = answer["metrics"], answer["usage"]["prompt_tokens"]
    assert list(metrics) == VLLM_FIELDS and "timings" not in answer
    assert metrics["queue_time_ms"] == 0  # alone, it was scheduled at the step it arrived for
    assert metrics["time_to_first_token_ms"] == pytest.approx(_prefill_ms(prompt_tokens), abs=0.001)
    assert metrics["generation_time_ms"] == pytest.approx(_decode_ms(prompt_tokens, 12), abs=0.001)
    phases_ms = metrics["queue_time_ms"] + metrics["time_to_first_token_ms"] + metrics["generation_time_ms"]
    assert phases_ms == pytest.approx(elapsed_ms, abs=0.002)
    assert metrics["mean_itl_ms"] == pytest.approx(metrics["generation_time_ms"] / 11, abs=0.001)
    inference_ms = metrics["time_to_first_token_ms"] + metrics["generation_time_ms"]
    assert metrics["tokens_per_second"] == pytest.approx(12_000 / inference_ms)


async def test_vllm_metrics_ride_the_usage_chunk_only():
    async with simulator(flavor="vllm", per_request_metrics=True) as client:
        with_usage = await _events(client, _chat("hello", 5, stream_options={"include_usage": True}))
        without_usage = await _events(client, _chat("hello", 5))
        single = await _answer(client, _chat("hello", 1))
    assert [i for i, event in enumerate(with_usage) if "metrics" in event] == [len(with_usage) - 1]
    assert with_usage[-1]["choices"] == [] and list(with_usage[-1]["metrics"]) == VLLM_FIELDS
    assert all("metrics" not in event and "timings" not in event for event in without_usage)
    assert single["metrics"]["mean_itl_ms"] is None  # one token has no inter-token gap
    assert single["metrics"]["generation_time_ms"] == 0


@pytest.mark.parametrize(
    ("settings", "prefill_of"),
    [
        ({"flavor": "llamacpp"}, lambda answer: answer["timings"]["prompt_ms"]),
        ({"flavor": "vllm", "per_request_metrics": True}, lambda a: a["metrics"]["time_to_first_token_ms"]),
    ],
)
async def test_prefill_time_grows_with_the_prompt(settings, prefill_of):
    async with simulator(**settings) as client:
        short = await _answer(client, _chat("hi", 2))
        long = await _answer(client, _chat("x" * 4000, 2))
    assert (short["usage"]["prompt_tokens"], long["usage"]["prompt_tokens"]) == (4, 1003)
    assert prefill_of(short) == pytest.approx(_prefill_ms(4), abs=0.001)
    assert prefill_of(long) == pytest.approx(_prefill_ms(1003), abs=0.001)
    assert prefill_of(long) > 3 * prefill_of(short)  # compute-bound past ~150 tokens on the gpu profile


async def test_vllm_queue_time_is_the_wait_for_a_slot():
    async with simulator(flavor="vllm", per_request_metrics=True, max_num_seqs=1) as client:
        before = await _sim_time_ms(client)
        answers = await asyncio.gather(*(_answer(client, _chat("same question", 16)) for _ in range(3)))
        elapsed_ms = await _sim_time_ms(client) - before
    metrics = sorted((answer["metrics"] for answer in answers), key=lambda m: m["queue_time_ms"])
    service_ms = [m["time_to_first_token_ms"] + m["generation_time_ms"] for m in metrics]
    step_ms = metrics[0]["time_to_first_token_ms"]  # one prefill step, the most an arrival lags
    assert service_ms[0] == pytest.approx(service_ms[1]) == pytest.approx(service_ms[2])
    assert metrics[0]["queue_time_ms"] == 0  # the first one found the slot free
    # one slot: the second waits for the first to finish, the third for both
    assert metrics[1]["queue_time_ms"] == pytest.approx(service_ms[0], abs=step_ms)
    assert metrics[2]["queue_time_ms"] == pytest.approx(2 * service_ms[0], abs=step_ms)
    assert sum(service_ms) == pytest.approx(elapsed_ms, abs=0.01)  # the slot never idled
    assert metrics[2]["queue_time_ms"] + service_ms[2] == pytest.approx(elapsed_ms, abs=step_ms)


async def test_llamacpp_prefill_leaves_out_the_wait_for_a_slot():
    async with simulator(flavor="llamacpp", max_num_seqs=1) as client:
        before = await _sim_time_ms(client)
        answers = await asyncio.gather(*(_answer(client, _chat("same question", 16)) for _ in range(3)))
        elapsed_ms = await _sim_time_ms(client) - before
    timings = [answer["timings"] for answer in answers]
    prompt_tokens = answers[0]["usage"]["prompt_tokens"]
    assert [t["prompt_ms"] for t in timings] == pytest.approx([_prefill_ms(prompt_tokens)] * 3, abs=0.001)
    service_ms = [t["prompt_ms"] + t["predicted_ms"] for t in timings]
    assert sum(service_ms) == pytest.approx(elapsed_ms, abs=0.01)  # served one after the other
    assert max(service_ms) < elapsed_ms / 2  # so two of them waited: what llama.cpp leaves unreported


def test_per_request_metrics_is_vllms_option():
    with pytest.raises(ValueError, match="per_request_metrics is vLLM's --enable-per-request-metrics"):
        SimConfig(flavor="llamacpp", per_request_metrics=True)
    refused = CliRunner().invoke(main, ["sim", "--flavor", "sglang", "--per-request-metrics"])
    assert refused.exit_code == 2 and "not sglang's" in refused.output
    help_text = CliRunner().invoke(main, ["sim", "--help"]).output
    assert "--per-request-metrics" in help_text and "--enable-per-request-metrics" in help_text
