"""The simulator's capacity behaviour, measured over loopback HTTP with a closed-loop ladder:
the knee sits at --max-num-seqs for short prompts (tokens/s rises to it and stays within 5 % past
it while p95 TTFT jumps), falls below it where the documented KV model predicts for long prompts,
and a full queue answers 429."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import httpx
import pytest

from collector.serving import serve_in_thread
from collector.sim.app import create_sim_app
from collector.sim.config import SimConfig
from collector.sim.cost import CostModel, predicted_knee
from collector.sim.load import run_level, summarize
from collector.sim.output import count_chat_tokens

pytestmark = pytest.mark.slow
SPEED = 4.0          # 64 output tokens take ~0.25 s of real time: ladders run in seconds
OUTPUT_TOKENS = 64


def _payload(content: str):
    def make(worker: int, index: int) -> dict:
        return {"model": "sim", "messages": [{"role": "user", "content": content}],
                "max_tokens": OUTPUT_TOKENS, "ignore_eos": True}
    return make


def _ladder(config: SimConfig, levels: list[int], content: str, watch_level: int | None = None):
    """Run the ladder; optionally sample /sim/state while `watch_level` runs (ground truth)."""
    handle = serve_in_thread(create_sim_app(config))
    seen: list[dict] = []
    try:
        summaries = {}
        for concurrency in levels:
            stop = threading.Event()
            watcher = None
            if concurrency == watch_level:
                watcher = threading.Thread(target=_watch, args=(handle.url, stop, seen))
                watcher.start()
            level = asyncio.run(run_level(handle.url, concurrency, 1.2, _payload(content),
                                          warmup_s=0.3))
            stop.set()
            if watcher:
                watcher.join()
            summaries[concurrency] = summarize(level)
        return summaries, seen
    finally:
        handle.stop()


def _watch(url: str, stop: threading.Event, seen: list) -> None:
    with httpx.Client() as client:
        while not stop.wait(0.05):
            seen.append(client.get(f"{url}/sim/state").json())


def _throughput(summaries: dict) -> dict[int, float]:
    return {c: s["output_tokens_per_s"] for c, s in summaries.items()}


@pytest.mark.parametrize("max_num_seqs", [8, 16])
def test_short_prompt_ladder_knees_at_max_num_seqs(max_num_seqs):
    levels = [1, 2, 4, 8, 16, 32] if max_num_seqs == 8 else [2, 4, 8, 16, 32, 64]
    config = SimConfig(max_num_seqs=max_num_seqs, speed=SPEED, max_waiting=1000, stream_interval=8)
    summaries, _ = _ladder(config, levels, "a short question")
    tput = _throughput(summaries)
    below = [c for c in levels if c <= max_num_seqs]
    for low, high in zip(below, below[1:]):
        assert tput[high] > 1.5 * tput[low], f"tokens/s should rise to the knee: {tput}"
    for beyond in (c for c in levels if c > max_num_seqs):
        assert abs(tput[beyond] / tput[max_num_seqs] - 1) <= 0.05, f"plateau within 5 %: {tput}"
    ttft = {c: s["ttft_p95_s"] for c, s in summaries.items()}
    # past the knee a request waits for a slot: about one request duration per batch-full queued
    duration_s = OUTPUT_TOKENS * CostModel().step_seconds(max_num_seqs, max_num_seqs * 40) / SPEED
    jump = ttft[2 * max_num_seqs] - ttft[max_num_seqs]
    assert jump > 0.5 * duration_s and ttft[2 * max_num_seqs] > 3 * ttft[max_num_seqs], \
        f"p95 TTFT jumps past the knee (request duration {duration_s:.3f} s): {ttft}"
    assert ttft[max_num_seqs] < 3 * ttft[below[0]] + 0.05, f"p95 TTFT flat before the knee: {ttft}"


def test_long_prompts_knee_where_the_kv_model_predicts():
    content = "x" * 3988                        # 1000 prompt tokens with the chat template
    prompt_tokens = count_chat_tokens([{"role": "user", "content": content}])
    config = SimConfig(max_num_seqs=8, kv_cache_tokens=4400, speed=SPEED, max_waiting=1000,
                       stream_interval=8)
    knee = predicted_knee(config.max_num_seqs, config.kv_cache_tokens, config.block_size,
                          prompt_tokens, OUTPUT_TOKENS)
    assert knee == 4 < config.max_num_seqs
    summaries, seen = _ladder(config, [1, 2, 4, 8, 16], content, watch_level=8)
    tput = _throughput(summaries)
    assert tput[2] > 1.4 * tput[1] and tput[4] > 1.4 * tput[2], f"rises to the KV knee: {tput}"
    for beyond in (8, 16):
        assert abs(tput[beyond] / tput[knee] - 1) <= 0.05, f"flat past the KV knee: {tput}"
    busy = [s for s in seen if s["waiting"] > 0]
    running = Counter(s["running"] for s in busy)            # KV, not max_num_seqs, binds
    assert max(running) == knee and running.most_common(1)[0][0] == knee, running
    assert max(s["kv_usage_ratio"] for s in busy) > 0.9


def test_full_queue_answers_429():
    config = SimConfig(max_num_seqs=4, max_waiting=4, speed=SPEED)
    handle = serve_in_thread(create_sim_app(config))
    try:
        level = asyncio.run(run_level(handle.url, 16, 1.0, _payload("q"), warmup_s=0.2))
    finally:
        handle.stop()
    summary = summarize(level)
    statuses = {r.status for r in level.results}
    assert statuses == {200, 429}
    assert summary["rate_limited"] > 0 and summary["output_tokens_per_s"] > 0
