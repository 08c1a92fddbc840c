"""μ_slo on a real engine (#38): llama.cpp's llama-server (Gemma 3 270M on the CPU) at `--parallel
4` and `2`, the probe's open-loop ladder straight at the engine (the README's single-box flow)
against a plain open-loop client written here; at `--parallel 2` for two input-length classes
(the prompts a workload's `inputs:` send), whose μ and V_P must stand in the plain client's ratio.
No request may fail for a reason other than capacity.

The plain client shares no code with the probe: httpx instead of aiohttp, its own Poisson clock,
its own SSE reading and its own analysis. Per offered rate it sends Poisson arrivals for a warm-up
and a measuring window and reads the p95 TTFT of the requests admitted in the window and its
backlog (sent, not answered) sampled 100 times across it; the rate fails when the p95 TTFT misses
the SLO or the backlog's least-squares line rises by more than max(3, 10 % of the requests sent).
Its μ is the highest rate of the run of passing rates from the lowest, or the saturation
throughput of the failing rate above it when that one drifted and completed fewer (no more is
sustainable): the rate where p95 TTFT crosses the SLO or the queue drifts. It reads that
throughput off every request the failing rate sent after its window opened, until fewer than the
slot count were left, rather than the window alone: an 8-16 s window at a shared CPU's changing
speed holds too few completions to say it within 15 %.

Both measure the same ladder (LADDER: steps of ~10 % around the engine's throughput in a closed
loop at its slot count, measured right before, after a warm-up) with the same Poisson arrivals
(one seeded generator drawn in the probe's order), prompts as long as the probe's, and the same
p95 TTFT SLO: SLO_FACTOR x the mean e2e of that closed loop (at `--parallel 2` the long class's,
for both), whatever this shared CPU's speed at the time. A p95 of the 20-40 requests a level holds
here is nearly their maximum, so the SLO is set where it binds only near saturation and the
queue's drift, a count, mostly decides. Output is 2 tokens: the prompt's prefill is the work,
and a level holds enough requests.

This host's two cores are shared: other work took half to two thirds of the engine's core while
this was written, and its speed moved 2-3x within a minute. So the two clients take turns rung
by rung (the plain client measures a rate right after the probe did, from run_probe's per-level
hook, in the probe's process), and the engine and both clients run at nice PRIORITY where the OS
allows (raised_priority). With 4-8 s levels (~35 requests) a rung one side measured in a slower
second than the other, or a ladder that no longer bracketed μ (the host slowed or sped up since
the closed loop), failed 4 of 9 and 6 of 9 runs; so a level holds LEVEL_REQUESTS requests (8-16 s)
and a ladder that did not bracket μ is calibrated and walked again (`bracketing`, once: it
measured a bound, not μ). The closed loop prints the share of a core the engine got.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support.real_engine import llama_server

from collector.analysis.estimate import estimate_from_probe
from collector.analysis.probe import ProbeSettings, run_probe
from collector.capacity import Slo

# Not in make test: on this shared 2-core host the host's speed moves under a level, and an
# earlier build passed 5 of 9 runs at --parallel 4 and 3 of 9 for the two classes (the prompts it
# repeated were cached by the engine; the probe's saturation cap read a window an overload stop
# cut short). Since both were fixed it passed both runs (docs/capacity.md); `make measure` runs it.
pytestmark = [
    pytest.mark.real_engine,
    pytest.mark.slow,
    pytest.mark.serial,
    pytest.mark.measurement,
    pytest.mark.timeout(900),
]

MAX_TOKENS = 2
WARMUP_S = 1.0
SEED = 11
WARMUP_LOOP_S = 2.0  # a fresh llama-server's first seconds run slower (measured: 20-50 %): not calibration
SLO_FACTOR = 6.0  # the p95 TTFT SLO, in mean e2e of a full batch (closed loop at the slot count)
LADDER = (0.5, 0.55, 0.6, 0.66, 0.73, 0.8, 0.88, 0.97, 1.07, 1.18, 1.3)  # x the closed loop's requests/s
TOLERANCE = 0.15
LEVEL_REQUESTS = 70  # requests at the rate where μ lies, per level: 35 left a rung to chance here
BRACKET_TRIES = 2
PRIORITY = -10  # nice value of the engine and the clients while they measure (raised_priority)
# Every prompt of a run is new to the engine: llama-server reuses a slot's cached prefix, so a
# closed loop that repeated an earlier loop's prompts measured a faster engine than the ladder met
# (4.7, 6.0, then 7.6 requests/s for three loops of the same prompts), and its ladder missed μ.
_CLOSED_LOOP = itertools.count(5_000_000)
_PLAIN_BLOCKS = itertools.count(100_000, 10_000)  # a block per plain-client rate (at most 2,000 sent)
WORDS = ("capacity", "queue", "batch", "latency", "prefill", "decode", "slot", "rate")


def prompt(index: int, words: int) -> str:
    """A prompt unique from its first token on: nothing cached beyond the chat template."""
    return f"Request {index}: " + " ".join(WORDS[(index + i) % len(WORDS)] for i in range(words))


@dataclass
class Answer:
    admitted: float
    first: float | None
    done: float
    status: int
    prompt_tokens: int = 0
    uncached_prompt_tokens: int = 0


async def _one(client: httpx.AsyncClient, url: str, text: str) -> Answer:
    """One streamed chat completion: admission, first content, end (monotonic), status."""
    body = {
        "model": "gemma",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    admitted, first, tokens, uncached = time.monotonic(), None, 0, 0
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                return Answer(admitted, None, time.monotonic(), response.status_code)
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if usage := chunk.get("usage"):
                    tokens = usage["prompt_tokens"]
                    uncached = tokens - ((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                elif first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    first = time.monotonic()
    except httpx.HTTPError:
        return Answer(admitted, None, time.monotonic(), 0)
    return Answer(admitted, first, time.monotonic(), 200, tokens, uncached)


@dataclass
class PlainRate:
    offered: float
    sent: int
    ttft_p95_s: float | None
    completed_per_s: float  # answered in the window / its length
    full_batch_per_s: float  # answered per second from the window's start while the slots stayed full
    backlog_growth: float
    failed: int  # neither answered nor refused for capacity (429, 503)
    uncached_prompt_tokens: float  # per answered request

    @property
    def drifting(self) -> bool:
        return self.backlog_growth > max(3.0, 0.1 * self.sent)

    def passes(self, slo_s: float) -> bool:
        return not self.drifting and self.ttft_p95_s is not None and self.ttft_p95_s <= slo_s


def _p95(values: list[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    position = 0.95 * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _full_batch_rate(answers: list[tuple[bool, Answer]], start: float, slots: int) -> float:
    """Completions per second from `start` until fewer than `slots` requests were left (the
    drain's tail, when the batch empties): past capacity, the engine's saturation throughput,
    read off every request the rate sent after the window opened rather than its window alone."""
    done = sorted(a.done for _, a in answers if a.status == 200 and a.done >= start)
    full = done[: max(1, len(done) - slots + 1)]
    return len(full) / max(full[-1] - start, 1e-9)


def _summarise(rate: float, answers: list[tuple[bool, Answer]], lost: int, slots: int) -> PlainRate:
    window = [a for measured, a in answers if measured]
    start, end = min(a.admitted for a in window), max(a.admitted for a in window)
    times = [start + (end - start) * i / 99 for i in range(100)]
    backlog = [sum(1 for _, a in answers if a.admitted <= t < a.done) for t in times]
    slope = statistics.linear_regression(times, backlog).slope if len(set(backlog)) > 1 else 0.0
    ok = [a for a in window if a.first is not None]
    return PlainRate(
        offered=rate,
        sent=len(window),
        ttft_p95_s=_p95([a.first - a.admitted for a in ok if a.first is not None]),
        completed_per_s=sum(1 for _, a in answers if a.status == 200 and start <= a.done <= end)
        / (end - start),
        full_batch_per_s=_full_batch_rate(answers, start, slots),
        backlog_growth=slope * (end - start),
        failed=lost + sum(1 for _, a in answers if a.status not in (200, 429, 503)),
        uncached_prompt_tokens=statistics.fmean(a.uncached_prompt_tokens for a in ok) if ok else 0.0,
    )


async def plain_rate(
    client: httpx.AsyncClient,
    url: str,
    rate: float,
    level_s: float,
    rng: random.Random,
    words: int,
    first: int,
    slots: int,
) -> PlainRate:
    """Poisson arrivals at `rate` for WARMUP_S + level_s (at most 2,000) at an engine of `slots`;
    answers awaited at most 60 s after the last."""
    tasks: list[tuple[bool, asyncio.Task[Answer]]] = []
    begin = time.monotonic()
    measure_from, stop_at = begin + WARMUP_S, begin + WARMUP_S + level_s
    due = begin + rng.expovariate(rate)
    while due < stop_at and len(tasks) < 2000:
        await asyncio.sleep(max(0.0, due - time.monotonic()))  # the arrival clock, not a wait for an event
        tasks.append(
            (due >= measure_from, asyncio.create_task(_one(client, url, prompt(first + len(tasks), words))))
        )
        due += rng.expovariate(rate)
    await asyncio.wait([task for _, task in tasks], timeout=60)
    for _, task in tasks:
        task.cancel()
    answers = [(measured, task.result()) for measured, task in tasks if task.done() and not task.cancelled()]
    return _summarise(rate, answers, len(tasks) - len(answers), slots)


class PairedLadder:
    """The plain client's ladder, one rung right after each of the probe's (run_probe's
    `write_rows` hook: the probe's loop waits while the plain client measures the same rate in a
    thread of its own), then on alone while its rungs pass. Its prompts are as long as the
    probe's were on that rung (their median prompt tokens, in words by `scale`)."""

    def __init__(
        self,
        url: str,
        rates: list[float],
        level_s: float,
        slo_s: float,
        scale: tuple[float, float],
        slots: int,
    ) -> None:
        self.url, self.rates, self.level_s, self.slo_s, self.scale = url, rates, level_s, slo_s, scale
        self.slots = slots
        self.rng = random.Random(SEED)  # drawn in the probe's order: the same arrival times per rung
        self.levels: list[PlainRate] = []
        self.words = 1

    def _measure(self, rate: float) -> None:
        async def measure() -> PlainRate:
            limits = httpx.Limits(max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                first = next(_PLAIN_BLOCKS)
                return await plain_rate(
                    client, self.url, rate, self.level_s, self.rng, self.words, first, self.slots
                )

        self.levels.append(asyncio.run(measure()))

    def done(self) -> bool:
        return bool(self.levels) and not self.levels[-1].passes(self.slo_s)

    def after_probe_level(self, rows: list[dict]) -> None:
        """write_rows: after each of the probe's open-loop levels, the plain client's same rate."""
        if not rows or rows[0].get("probe_rate_per_s") is None or self.done():
            return
        self.words = words_for(
            self.scale, statistics.median(r["prompt_tokens"] for r in rows if r["outcome"] == "ok")
        )
        worker = threading.Thread(target=self._measure, args=(self.rates[len(self.levels)],))
        worker.start()
        worker.join()

    def finish(self) -> list[PlainRate]:
        while not self.done() and len(self.levels) < len(self.rates):
            self._measure(self.rates[len(self.levels)])
        return self.levels


def plain_mu(levels: list[PlainRate], slo_s: float) -> float | None:
    """The highest passing rate of the run from the lowest, capped at the rate above's completions
    per second at a full batch when that one drifted (no more is sustainable); None when the
    lowest fails or none does (then μ is only bounded)."""
    for below, level in zip([None, *levels], levels):
        if not level.passes(slo_s):
            if below is None:
                return None
            return min(below.offered, level.full_batch_per_s) if level.drifting else below.offered
    return None


def engine_pid(url: str) -> int:
    """The llama-server process serving `url` (Linux /proc; its port names it)."""
    port = url.rsplit(":", 1)[1].encode()
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"llama-server") for arg in argv) and b"--port" in argv:
            if argv[argv.index(b"--port") + 1 :][:1] == [port]:
                return int(entry.name)
    raise AssertionError(f"no llama-server process listens on port {port.decode()}")


def engine_cpu_s(pid: int) -> float:
    """CPU seconds process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def raised_priority(url: str) -> Iterator[str]:
    """The engine and this process (the probe's and the plain client's loops, and the threads
    started from it) at nice PRIORITY while they measure, where the OS allows it: other processes
    on a shared host then take less of the CPU that sets the rates. Restored after."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, engine_pid(url), PRIORITY)
        os.setpriority(os.PRIO_PROCESS, 0, PRIORITY)
        note = f"the engine and the clients at nice {PRIORITY}"
    except PermissionError:
        note = "priorities as they were (raising them needs CAP_SYS_NICE)"
    try:
        yield note
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, own)


async def closed_loop(url: str, concurrency: int, seconds: float, words: int) -> tuple[float, float]:
    """(requests/s, mean e2e) of `concurrency` back-to-back workers for `seconds`; prints the
    share of a core the engine got meanwhile (it wants all of its one thread's: the rest went to
    other processes on this shared host)."""
    answers: list[Answer] = []
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        end = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < end:
                answers.append(await _one(client, url, prompt(next(_CLOSED_LOOP), words)))

        pid = engine_pid(url)
        started, cpu = time.monotonic(), engine_cpu_s(pid)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    share = (engine_cpu_s(pid) - cpu) / elapsed
    print(
        f"closed loop of {concurrency}: {len(answers) / elapsed:.2f}/s; the engine got {share:.0%} of a core"
    )
    return len(answers) / elapsed, statistics.fmean(a.done - a.admitted for a in answers)


async def prompt_scale(url: str) -> tuple[float, float]:
    """(tokens of a prompt of no words, tokens per word) as the engine counts a prompt (its chat
    template included, as in the probe's rows), from two requests."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        short = await _one(client, url, prompt(800_000, 10))
        long = await _one(client, url, prompt(800_001, 110))
    assert short.status == long.status == 200 and long.prompt_tokens > short.prompt_tokens, (short, long)
    per_word = (long.prompt_tokens - short.prompt_tokens) / 100
    return short.prompt_tokens - 10 * per_word, per_word


def words_for(scale: tuple[float, float], tokens: float) -> int:
    """Words for a prompt of about `tokens` tokens."""
    return max(1, round((tokens - scale[0]) / scale[1]))


Paired = tuple[dict, list["PlainRate"]]  # the probe's estimate (as --json), the plain client's rates


def paired(
    url: str, rates: list[float], level_s: float, slo_s: float, scale: tuple[float, float], **probe: object
) -> Paired:
    """The probe's ladder after a one-level gradient, the plain client's taking turns with it;
    (the probe's estimate as `headroom probe --json` writes it, the plain client's rates)."""
    settings = ProbeSettings(
        url=url,
        max_samples=16,
        max_level_s=3.0,
        slo=Slo(ttft_p95_s=slo_s),
        rates=tuple(rates),
        rate_level_s=level_s,
        rate_warmup_s=WARMUP_S,
        seed=SEED,
        **probe,
    )
    plain = PairedLadder(url, rates, level_s, slo_s, scale, settings.levels[0])
    result = asyncio.run(run_probe(settings, write_rows=plain.after_probe_level))
    return estimate_from_probe(result, slo=settings.slo).to_dict(), plain.finish()


def _ladder(capacity: float) -> tuple[list[float], float]:
    """The offered rates around a closed loop's `capacity`, and seconds per rate: about
    LEVEL_REQUESTS requests at the rate where μ lies, 8 to 16 s."""
    return [round(capacity * m, 3) for m in LADDER], min(16.0, max(8.0, LEVEL_REQUESTS / (0.9 * capacity)))


def bracketing(
    url: str,
    concurrency: int,
    words: int,
    slo_s: float | None,
    run: Callable[[list[float], float, float], Paired],
) -> tuple[Paired, float, float, int]:
    """A closed loop at the slot count right before the ladder it calibrates, then the paired
    ladder; again (at most BRACKET_TRIES) when the plain client's ladder did not bracket μ: its
    lowest rung failed or none did, because the host's speed moved since the closed loop (then
    the rates are not a measurement of μ, only a bound). Returns the paired result, the closed
    loop's requests/s and mean e2e, and the tries."""
    for attempt in range(1, BRACKET_TRIES + 1):
        capacity, e2e = asyncio.run(closed_loop(url, concurrency, 3.0, words))
        slo = slo_s or round(SLO_FACTOR * e2e, 2)
        rates, level_s = _ladder(capacity)
        result = run(rates, level_s, slo)
        if plain_mu(result[1], slo) is not None or attempt == BRACKET_TRIES:
            return result, capacity, e2e, attempt
        print(f"the ladder {rates} did not bracket μ (the host's speed moved): calibrating again")
    raise AssertionError("unreachable")


def _compare(name: str, plain: list[PlainRate], section: dict, slo_s: float) -> tuple[float, float]:
    """Print both ladders; assert no request failed for a reason other than capacity, both sent
    the same prompt lengths, and μ_slo is within TOLERANCE of the plain client's μ; returns the
    plain client's μ and V_P (μ x its uncached prompt tokens per request)."""
    print(f"{name}: plain client")
    for level in plain:
        print(
            f"  {level.offered:.3f}/s: sent {level.sent}, done {level.completed_per_s:.2f}/s "
            f"({level.full_batch_per_s:.2f}/s at a full batch), p95 TTFT "
            f"{level.ttft_p95_s:.3f} s, growth {level.backlog_growth:+.1f}, passes {level.passes(slo_s)}"
        )
    mu = plain_mu(plain, slo_s)
    print(
        f"{name}: plain client's μ {mu}; probe's μ_slo {section['mu_slo_requests_per_s']} ({section['reason']})"
    )
    assert all(level.failed == 0 for level in plain), plain
    errors = [
        level["outcomes"]
        for level in section["levels"]
        if set(level["outcomes"]) - {"ok", "http 429", "http 503"}
    ]
    assert not errors, errors  # 0 failed requests that are not capacity errors
    tokens = statistics.fmean(level.uncached_prompt_tokens for level in plain)
    probed = statistics.fmean(level["prefill_tokens_per_request"] for level in section["levels"])
    assert probed == pytest.approx(tokens, rel=0.1)  # the premise: the same work per request
    assert mu is not None, plain
    assert section["mu_slo_requests_per_s"] == pytest.approx(mu, rel=TOLERANCE), (plain, section["levels"])
    return mu, mu * tokens


def test_mu_slo_at_parallel_4_is_the_plain_clients(tmp_path):
    words = 14  # ~40 prompt tokens with the chat template
    started = time.monotonic()
    with llama_server(4) as engine, raised_priority(engine) as priority:
        scale = asyncio.run(prompt_scale(engine))
        asyncio.run(closed_loop(engine, 4, WARMUP_LOOP_S, words))
        found: dict[str, float] = {}

        def run(rates: list[float], level_s: float, slo_s: float) -> Paired:
            found.update(slo_s=slo_s, level_s=level_s)
            lines = tmp_path / f"prompts-{len(found)}.txt"  # new prompts for every ladder walked
            first = next(_PLAIN_BLOCKS) * 10
            lines.write_text("".join(prompt(first + i, words) + "\n" for i in range(6000)))
            return paired(
                engine, rates, level_s, slo_s, scale, levels=(4,), max_tokens=MAX_TOKENS, prompts=str(lines)
            )

        (estimate, plain), capacity, e2e, tries = bracketing(engine, 4, words, None, run)
        after, _ = asyncio.run(closed_loop(engine, 4, 3.0, words))
    print(
        f"\nclosed loop {capacity:.2f}/s before, {after:.2f}/s after; e2e {e2e:.3f} s; SLO {found['slo_s']} s; "
        f"{found['level_s']:.1f} s a rate; ladders {tries}; {priority}; {time.monotonic() - started:.0f} s"
    )
    _compare("parallel 4", plain, estimate["rates"], found["slo_s"])


@pytest.mark.timeout(1200)
def test_two_input_classes_at_parallel_2_stand_in_the_plain_clients_ratio():
    classes = {"long": 100, "short": 40}  # prompt tokens, the chat template's included
    started = time.monotonic()
    found = {}
    with llama_server(2) as engine, raised_priority(engine) as priority:
        scale = asyncio.run(prompt_scale(engine))
        words = {name: words_for(scale, tokens) for name, tokens in classes.items()}
        asyncio.run(closed_loop(engine, 2, WARMUP_LOOP_S, words["long"]))
        loops: dict[str, tuple[float, float, int]] = {}
        slo_s = 0.0
        for name, tokens in classes.items():

            def run(
                rates: list[float], level_s: float, slo: float, tokens: int = tokens, name: str = name
            ) -> Paired:
                return paired(
                    engine,
                    rates,
                    level_s,
                    slo,
                    scale,
                    levels=(2,),
                    lengths=((tokens, MAX_TOKENS),),  # what a workload's input class sends (`inputs:`)
                    task_class=f"chat-{name}",
                )

            # the long class's SLO, first, for both
            found[name], capacity, e2e, tries = bracketing(engine, 2, words[name], slo_s or None, run)
            slo_s = slo_s or round(SLO_FACTOR * e2e, 2)
            loops[name] = (round(capacity, 2), round(e2e, 3), tries)
    print(
        f"\nwords {words}; closed loops {loops}; SLO {slo_s} s; {priority}; {time.monotonic() - started:.0f} s"
    )
    plain = {
        name: _compare(f"parallel 2, {name} prompts", levels, estimate["rates"], slo_s)
        for name, (estimate, levels) in found.items()
    }
    probe = {name: estimate for name, (estimate, _) in found.items()}
    ratios = {
        "μ": (
            probe["short"]["rate_requests_per_s"] / probe["long"]["rate_requests_per_s"],
            plain["short"][0] / plain["long"][0],
        ),
        "V_P": (
            probe["short"]["prefill_tokens_per_s"] / probe["long"]["prefill_tokens_per_s"],
            plain["short"][1] / plain["long"][1],
        ),
    }
    print(f"short / long (probe, plain): {ratios}")
    assert ratios["μ"][1] > 1.3  # the premise: the classes differ
    for name, (probed, measured) in ratios.items():
        assert probed == pytest.approx(measured, rel=TOLERANCE), name
