"""The engine's own per-request timings (collector.engine_timings): llama.cpp's `timings` and vLLM's
`metrics`, read where they are (the usage chunk, the finish chunk, a JSON answer), stored on the
row beside the sidecar's hop, and exported as the engine's split and prompt-token counters."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from support.sidecar import CHAT, Rig, sidecar_rig
from support.upstream import prompt_tokens
from support.waiting import patient, wait_until

from collector.engine_timings import engine_timings
from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar, sidecar_state
from collector.sim.app import create_sim_app
from collector.sim.config import SimConfig
from collector.sse import inspect_event, plain_read

FIXTURE = Path(__file__).parent / "fixtures" / "llamacpp" / "chat_stream_with_usage.sse"


def _usage_chunk() -> dict:
    events = [e for e in FIXTURE.read_text().split("\n\n") if e.startswith("data: {")]
    return json.loads(events[-1][6:])


def test_a_real_llama_cpp_usage_chunk_reads_as_its_split():
    chunk = _usage_chunk()
    said = engine_timings(chunk.get("timings"), chunk.get("metrics"))
    assert said is not None and said.shape == "llamacpp"
    assert (said.prompt_cached, said.prompt_computed, said.generated) == (1, 34, 300)
    assert said.prefill_s == pytest.approx(0.088501) and said.decode_s == pytest.approx(10.653879)
    assert said.queue_s is None  # llama.cpp does not report it
    # its counts agree with the usage beside it: computed + cached = prompt, predicted = completion
    assert said.prompt_computed + said.prompt_cached == chunk["usage"]["prompt_tokens"]


def test_vllm_metrics_give_queue_and_prefill_its_ttft_counted_from_scheduling():
    """vLLM's own test: queued 1.0, scheduled 1.5, first token 2.0, last 3.0 -> queue 500 ms,
    TTFT 500 ms (from scheduling: the prefill), generation 1,000 ms."""
    metrics = {"time_to_first_token_ms": 500.0, "queue_time_ms": 500, "generation_time_ms": 1000}
    said = engine_timings(None, metrics | {"mean_itl_ms": 10})
    assert said is not None and said.shape == "vllm"
    assert (said.queue_s, said.prefill_s, said.decode_s) == (0.5, 0.5, 1.0)
    assert said.prompt_computed is None  # vLLM sends no counts: the row takes them from usage


@pytest.mark.parametrize(
    "bad",
    [-1, float("nan"), float("inf"), 1e12, "88", True, None, [1], {"ms": 1}],
)
def test_a_value_that_is_not_a_duration_or_a_count_is_dropped_not_trusted(bad):
    said = engine_timings({"prompt_ms": bad, "prompt_n": bad, "cache_n": 3, "predicted_ms": 5.0}, None)
    assert said is not None and said.prefill_s is None and said.prompt_computed is None
    assert said.prompt_cached == 3 and said.decode_s == 0.005  # the good ones kept
    if not isinstance(bad, dict):  # not an object: no timings at all
        assert engine_timings(bad, bad) is None
    vllm = engine_timings(None, {"time_to_first_token_ms": bad, "queue_time_ms": 20})
    assert vllm is not None and vllm.prefill_s is None and vllm.queue_s == 0.02


def test_a_finish_chunk_with_timings_is_not_plain_and_keeps_them():
    """Without usage, llama.cpp puts `timings` on the finish chunk: the one-parse fast path must
    leave such a read to the event-by-event reading, which returns the chunk with them."""
    chunk = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "timings": {"prompt_ms": 5.0}}
    event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    assert plain_read(event) is None
    info = inspect_event(event[:-2], keep_chunk=False)
    assert info is not None and info.chunk is not None and info.chunk["timings"] == {"prompt_ms": 5.0}
    # a chunk whose timings field is null stays plain (the fast path)
    assert plain_read(b'data: {"choices":[{"delta":{"content":"abcd"}}],"timings":null}\n\n') is not None


def _chat(rig: Rig, client: httpx.Client, shape: str, stream: bool = True, **more: object) -> httpx.Response:
    body = {**CHAT, "stream": stream, **more}
    headers = {
        "x-fake-timings": shape,
        "x-fake-prefill-ms": "12.5",
        "x-fake-queue-ms": "3",
        "x-fake-delay": "0.01",
    }
    response = client.post(rig.url + "/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200
    return response


@pytest.mark.slow
def test_every_row_carries_the_engines_account_and_the_split_sums_to_ttft(tmp_path):
    """Through a real sidecar: llama.cpp's timings streamed (on the usage chunk the sidecar asked
    for, and on the finish chunk when the client declined usage) and not streamed, and vLLM's
    metrics; each row holds the engine's counts and times, the hop, and llama.cpp's derived queue
    so that hop + queue + prefill is the TTFT the sidecar measured. The exported prefill rate is
    the rows' Σ computed / Σ prefill, exactly."""
    with sidecar_rig(tmp_path) as rig, httpx.Client(timeout=patient(10)) as client:
        _chat(rig, client, "llamacpp")
        _chat(rig, client, "llamacpp", stream_options={"include_usage": False})
        _chat(rig, client, "llamacpp", stream=False)
        _chat(rig, client, "vllm")
        _chat(rig, client, "")  # an engine that says nothing
        wait_until(lambda: len(rig.rows()) == 5, what="five rows")
        rows = rig.rows()
        metrics = rig.metrics()
    llama, declined, whole, vllm, silent = rows
    for row in (llama, declined, whole):
        assert row["engine_timings"] == "llamacpp" and row["engine_prefill_s"] == 0.0125
        assert row["engine_prompt_cached"] == 1 and row["engine_prompt_computed"] == prompt_tokens(CHAT) - 1
        assert row["engine_generated"] == 5 and row["sidecar_hop_s"] > 0
    for row in (llama, declined):
        assert row["engine_decode_s"] == pytest.approx(0.05)
        # llama.cpp reports no queue: the rest of TTFT (never below 0), so the parts sum to it
        parts = row["sidecar_hop_s"] + row["engine_queue_s"] + row["engine_prefill_s"]
        assert row["engine_queue_s"] >= 0 and (parts == pytest.approx(row["ttft_s"]) or parts > row["ttft_s"])
        assert row["ttst_s"] > row["ttft_s"] and row["itl_max_s"] >= 0.005
    assert declined["usage_source"] == "estimated"  # no usage asked: the timings came on the finish chunk
    assert whole["ttft_s"] is None and whole["engine_queue_s"] is None  # nothing to derive it from
    assert vllm["engine_timings"] == "vllm" and (vllm["engine_queue_s"], vllm["engine_prefill_s"]) == (
        0.003,
        0.0125,
    )
    assert vllm["engine_prompt_computed"] == vllm["prompt_tokens"] - vllm["cached_prompt_tokens"]
    assert (
        silent["engine_timings"] is None
        and silent["engine_prefill_s"] is None
        and silent["sidecar_hop_s"] > 0
    )
    timed = [r for r in rows if r["engine_prefill_s"] is not None and r["engine_prompt_computed"] is not None]
    computed = metrics[("headroom_engine_prompt_tokens_total", (("cache", "computed"), ("model", "m1")))]
    cached = metrics[("headroom_engine_prompt_tokens_total", (("cache", "cached"), ("model", "m1")))]
    prefill = metrics[("headroom_engine_prefill_seconds_sum", (("model", "m1"),))]
    assert computed == sum(r["engine_prompt_computed"] for r in timed) and cached == len(timed)
    assert prefill == pytest.approx(sum(r["engine_prefill_s"] for r in timed))
    assert (
        metrics[("headroom_engine_queue_seconds_count", (("model", "m1"),))] == 3
    )  # two derived, one reported
    assert metrics[("headroom_sidecar_hop_seconds_count", ())] == 5


def test_an_exact_length_asked_for_and_not_delivered_is_flagged(tmp_path):
    """Load tools send `ignore_eos` with max_tokens to get exactly that many tokens: a row says
    whether it got them (output_short), and headroom_output_short_total counts the short ones."""
    asked = [(5, True, "3"), (3, True, "3"), (5, False, "3"), (5, True, "5")]
    with sidecar_rig(tmp_path) as rig, httpx.Client(timeout=patient(10)) as client:
        for max_tokens, ignore_eos, delivered in asked:
            body = {**CHAT, "max_tokens": max_tokens} | ({"ignore_eos": True} if ignore_eos else {})
            response = client.post(
                rig.url + "/v1/chat/completions", json=body, headers={"x-fake-tokens": delivered}
            )
            assert response.status_code == 200
        wait_until(lambda: len(rig.rows()) == len(asked), what="four rows")
        rows = rig.rows()
        metrics = rig.metrics()
    assert [row["output_short"] for row in rows] == [True, False, None, False]
    assert metrics[("headroom_output_short_total", ())] == 1


@pytest.mark.slow
@pytest.mark.parametrize(("flavor", "shape"), [("llamacpp", "llamacpp"), ("vllm", "vllm")])
def test_the_simulator_in_both_flavours_is_read_the_same_way(tmp_path, flavor, shape):
    """The built-in simulator through a real sidecar: llama.cpp's `timings` and vLLM's `metrics`
    (--per-request-metrics) land in the same columns, with the simulator's own prefill (a
    request alone: no queue) and its token counts."""
    sim = serve_in_thread(
        create_sim_app(
            SimConfig(flavor=flavor, per_request_metrics=flavor == "vllm", max_num_seqs=4, speed=4.0)
        )
    )
    try:
        app = build_sidecar(
            SidecarConfig(upstream=sim.url, db_path=str(tmp_path / "log.duckdb"), engine="none", jobs=False)
        )
        sidecar = serve_in_thread(app)
        try:
            with httpx.Client(timeout=patient(30)) as client:
                for stream in (True, False):
                    body = {**CHAT, "stream": stream, "max_tokens": 8}
                    assert client.post(sidecar.url + "/v1/chat/completions", json=body).status_code == 200
            state = sidecar_state(app)
            assert state.writer.flush(patient(30))
            rows = state.batch_sink.query_dicts("SELECT * FROM requests ORDER BY admitted_at")
        finally:
            sidecar.stop()
    finally:
        sim.stop()
    assert len(rows) == 2
    for row in rows:
        assert row["engine_timings"] == shape and row["engine_prefill_s"] > 0 and row["engine_decode_s"] > 0
        assert row["engine_prompt_computed"] + (row["engine_prompt_cached"] or 0) == row["prompt_tokens"]
        assert row["engine_generated"] in (row["completion_tokens"], None)  # vLLM sends no count
    streamed = rows[0]
    # alone, it waited for no slot: vLLM reports 0; llama.cpp's is derived (TTFT less hop and
    # prefill), so it holds the first token's way out too: milliseconds (8.7 beside two CPU hogs)
    assert streamed["engine_queue_s"] == 0 if shape == "vllm" else 0 <= streamed["engine_queue_s"] < 0.05
    assert streamed["engine_prefill_s"] <= streamed["ttft_s"]
