"""The simulator's capacity behaviour, measured over loopback HTTP with a closed-loop ladder:
the knee sits at --max-num-seqs for short prompts (tokens/s rises to it and stays within 5 % past
it while p95 TTFT jumps), falls below it where the documented KV model predicts for long prompts,
and a full queue answers 429.

The simulator runs as `headroom sim` in its own process, so the load client and the engine loop do
not share a GIL. Throughput is the engine's own output: the slope of generated tokens over
simulated seconds, sampled from /sim/state every 50 ms through each level's window. Simulated time
advances by the cost model's step times whatever the host's load (idle time does not count), so a
busy CPU cannot bend the plateau; TTFT is what the client saw, in real seconds, and the engine's
queue at the knee holds the requests that arrived while a late step ran. Those two measure this
machine's time: where the CPU is shared with other tests or hogs, the simulator's steps run late,
clients wait in real seconds that are no part of the model, and a queue shows below the knee. So
the short-prompt ladder, which asserts both, runs alone (marker `serial`); the long-prompt ladder
asserts in simulated time and the engine's own counts only, and the 429 test counts answers.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import pytest
from support.processes import sim_process

from collector.sim.config import SimConfig
from collector.sim.cost import CostModel, predicted_knee
from collector.sim.load import run_level, summarize
from collector.sim.output import count_chat_tokens

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]
SPEED = 4.0
# 128 output tokens (~0.4 s of real time at SPEED): long next to the few steps a batch runs short
# while a closed-loop client's next requests arrive, so at concurrency == max_num_seqs that gap
# costs ~1-3 % of throughput, not the 5 % the plateau allows.
SHORT_OUTPUT = 128
LONG_OUTPUT = 64  # the KV knee below is computed for 1000 prompt + 64 output tokens
WARMUP_S, WINDOW_S = 0.4, 1.2


def _payload(content: str, output_tokens: int):
    def make(worker: int, index: int) -> dict:
        return {
            "model": "sim",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": output_tokens,
            "ignore_eos": True,
        }

    return make


async def _level(url: str, concurrency: int, payload) -> tuple[dict, list[dict]]:
    """One closed-loop level: the client's summary plus the engine's tokens/s in simulated time,
    and the /sim/state samples (every 50 ms) of its measurement window."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def sample() -> list[dict]:
            await asyncio.sleep(WARMUP_S)
            states = [(await client.get("/sim/state")).json()]
            end = time.monotonic() + WINDOW_S
            while (left := end - time.monotonic()) > 0:
                await asyncio.sleep(min(0.05, left))
                states.append((await client.get("/sim/state")).json())
            return states

        level, states = await asyncio.gather(
            run_level(url, concurrency, WINDOW_S, payload, warmup_s=WARMUP_S), sample()
        )
    return summarize(level) | {"sim_tokens_per_s": _slope(states)}, states


def _slope(states: list[dict]) -> float:
    """Least-squares slope of generated tokens over simulated seconds. Tokens arrive in bursts
    (a batch admitted together prefills for a step or two without decoding), so the two ends of
    a window alone would swing by a burst; a fit over every sample averages the phase out."""
    points = [(s["sim_time_s"], s["generation_tokens_total"]) for s in states]
    mean_t = sum(t for t, _ in points) / len(points)
    mean_n = sum(n for _, n in points) / len(points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (n - mean_n) for t, n in points) / var if var > 0 else 0.0


def _ladder(levels: list[int], payload, **flags) -> tuple[dict, dict[int, list[dict]]]:
    """Run the ladder against a fresh `headroom sim`: each level's summary and its /sim/state
    samples (ground truth)."""
    summaries, seen = {}, {}
    with sim_process(speed=SPEED, max_waiting=1000, stream_interval=8, **flags) as url:
        for concurrency in levels:
            summaries[concurrency], seen[concurrency] = asyncio.run(_level(url, concurrency, payload))
    return summaries, seen


def _occupancy(states: list[dict]) -> float:
    """Mean running sequences over a level's samples."""
    return sum(s["running"] for s in states) / len(states)


def _assert_plateau(tput: dict, seen: dict, knee: int, beyond: list[int]) -> None:
    """Past the knee the batch stays capped at `knee` and tokens/s stays on a plateau: the levels
    past the knee agree within 5 % (the batch is full in each, so the rate is the engine's own),
    none falls more than 5 % under the knee's (no thrashing), and none rises past it by anything
    like the 1.5x a doubling gives below the knee.

    The knee's own level runs a little under the plateau, by how much depends on the host: a
    closed-loop client leaves a slot empty while it turns a finished request around (a parallel
    suite once measured 13 of 16 slots busy and the knee 19 % under the plateau), and a step run
    with part of a batch, while a wave of clients sends its next requests, takes nearly a full
    step's time for fewer tokens; the 50 ms samples of /sim/state see those stretches only in
    part (CI measured the knee 12 % under the plateau with 15.6 of 16 slots busy on average).
    Past the knee the queue refills a slot in the same step. So the rise allowed is 20 % over the
    knee's rate scaled by the ratio of mean running sequences; a knee one doubling later would
    rise ~2x."""
    occupied = {c: _occupancy(seen[c]) for c in [knee, *beyond]}
    detail = f"{tput}, mean running {occupied}"
    for level in beyond:
        assert max(s["running"] for s in seen[level]) == knee, f"the batch is capped at {knee}: {detail}"
        assert tput[level] >= 0.95 * tput[knee], f"no fall past the knee: {detail}"
        bound = 1.2 * tput[knee] * max(1.0, occupied[level] / occupied[knee])
        assert tput[level] <= bound, f"no rise past the knee beyond busier slots ({bound:.1f}): {detail}"
    plateau = tput[beyond[0]]
    for level in beyond[1:]:
        assert abs(tput[level] / plateau - 1) <= 0.05, f"the plateau is flat within 5 %: {detail}"


def _throughput(summaries: dict) -> dict[int, float]:
    return {c: round(s["sim_tokens_per_s"], 1) for c, s in summaries.items()}


@pytest.mark.serial  # TTFT in real seconds and the queue at the knee: a real-time knee
@pytest.mark.parametrize("max_num_seqs", [8, 16])
def test_short_prompt_ladder_knees_at_max_num_seqs(max_num_seqs):
    levels = [1, 2, 4, 8, 16, 32] if max_num_seqs == 8 else [2, 4, 8, 16, 32, 64]
    payload = _payload("a short question", SHORT_OUTPUT)
    summaries, seen = _ladder(levels, payload, max_num_seqs=max_num_seqs)
    tput = _throughput(summaries)
    client = {c: round(s["output_tokens_per_s"]) for c, s in summaries.items()}
    below = [c for c in levels if c <= max_num_seqs]
    for low, high in zip(below, below[1:]):
        assert tput[high] > 1.5 * tput[low], f"tokens/s should rise to the knee: {tput} (client {client})"
    _assert_plateau(tput, seen, max_num_seqs, [c for c in levels if c > max_num_seqs])
    ttft = {c: s["ttft_p95_s"] for c, s in summaries.items()}
    typical = {c: s["ttft_p50_s"] for c, s in summaries.items()}
    # past the knee a request waits for a slot: about one request duration per batch-full queued.
    # The typical request shows it against the knee's, in its median: the knee's p95 also holds
    # the host's stalls (a busy CI host once put it at 0.19 s, against 0.008 s at half the knee;
    # a busier one at 0.41 s, a whole request duration, and the p95 past it was no higher)
    duration_s = SHORT_OUTPUT * CostModel().step_seconds(max_num_seqs, max_num_seqs * 80) / SPEED
    jump = typical[2 * max_num_seqs] - typical[max_num_seqs]
    assert jump > 0.5 * duration_s and typical[2 * max_num_seqs] > 3 * typical[max_num_seqs], (
        f"TTFT jumps past the knee (request duration {duration_s:.3f} s): p95 {ttft}, p50 {typical}"
    )
    # up to the knee nobody waits for a slot. The engine's own queue says so: at most the odd
    # request that arrived in the step before a slot freed (under one on average), against a
    # standing queue of (concurrency - knee) past it. A simulator starved of CPU runs its late
    # steps back to back and takes the arrivals in between in bursts, so its queue at the knee
    # (on a busy 2-core host, 2 and 3.5 at 16) is held to a quarter of that standing queue.
    waiting = {c: sum(s["waiting"] for s in seen[c]) / len(seen[c]) for c in levels}
    at_the_knee = max(1.0, 0.25 * waiting[2 * max_num_seqs])
    assert waiting[max_num_seqs] < at_the_knee, f"no queue at the knee; mean waiting by level: {waiting}"
    assert waiting[2 * max_num_seqs] > 0.5 * max_num_seqs, f"a queue past it; mean waiting: {waiting}"
    # and the client sees it: the typical request does not wait a slot's turn (which would cost
    # up to a whole request duration). The median, not p95: on a 2-core CI host running the
    # suite in parallel, one stalled scheduler tick (CI once saw 0.11 s) moves the p95 of a
    # window's ~50 requests but not their median.
    ttft_p50 = {c: s["ttft_p50_s"] for c, s in summaries.items()}
    assert ttft_p50[max_num_seqs] < ttft_p50[below[0]] + 0.25 * duration_s, (
        f"p50 TTFT flat before the knee (request duration {duration_s:.3f} s): {ttft_p50}"
    )


def test_long_prompts_knee_where_the_kv_model_predicts():
    content = "x" * 3988  # 1000 prompt tokens with the chat template
    prompt_tokens = count_chat_tokens([{"role": "user", "content": content}])
    config = SimConfig(max_num_seqs=8, kv_cache_tokens=4400)
    knee = predicted_knee(
        config.max_num_seqs, config.kv_cache_tokens, config.block_size, prompt_tokens, LONG_OUTPUT
    )
    assert knee == 4 < config.max_num_seqs
    summaries, seen = _ladder(
        [1, 2, 4, 8, 16],
        _payload(content, LONG_OUTPUT),
        max_num_seqs=config.max_num_seqs,
        kv_cache_tokens=config.kv_cache_tokens,
    )
    tput = _throughput(summaries)
    assert tput[2] > 1.4 * tput[1] and tput[4] > 1.4 * tput[2], f"rises to the KV knee: {tput}"
    _assert_plateau(tput, seen, knee, [8, 16])
    busy = [s for s in seen[8] if s["waiting"] > 0]
    running = Counter(s["running"] for s in busy)  # KV, not max_num_seqs, binds
    assert max(running) == knee and running.most_common(1)[0][0] == knee, running
    assert max(s["kv_usage_ratio"] for s in busy) > 0.9


def test_full_queue_answers_429():
    """16 closed-loop clients against 4 slots and a queue of 4: a request past the queue is
    answered 429 at once, and each admitted one gets its whole answer. Counted over every request
    the level sent, not its timed window: which requests and tokens fall inside a window of real
    seconds is the host's business (a starved host once left it none), a full queue's answer is
    not."""
    with sim_process(speed=SPEED, max_num_seqs=4, max_waiting=4) as url:
        level = asyncio.run(run_level(url, 16, 1.0, _payload("q", LONG_OUTPUT), warmup_s=0.2))
    statuses = Counter(r.status for r in level.results)
    assert set(statuses) == {200, 429}, statuses
    served = Counter(r.completion_tokens for r in level.results if r.status == 200)
    assert set(served) == {LONG_OUTPUT}, served
