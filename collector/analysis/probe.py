"""The concurrency-gradient probe: closed-loop load at 1, 2, 4, ... concurrent requests.

Per level: `level` workers each send a request, and a new one as soon as theirs ends. Workers
start staggered over one request duration (the previous level's median e2e), so arrivals are
spread as in real traffic instead of arriving in lockstep, where every prompt would be prefilled
in the same engine step and TTFT would grow with the level for that reason alone. The first
`warmup_per_worker x level` completions are warm-up (caches, batch ramp) and are not measured.
Then the probe measures until p95 TTFT stops drifting: every window of max(level, 4) completions
it recomputes p95 TTFT over all measured requests, and stops when it moved less than 5 % since
the last window; or a per-level cap (samples, seconds) is hit. A 429 is a failure and is never
retried. After each level the probe stops early, with the reason, once the level is clearly
saturated (error ratio, or p95 TTFT far beyond the SLO or the low-load value), and inside a level
it gives up as soon as half the answers are failures, so it never hammers a service that is down.
An unreachable URL fails before any load with a message naming it.

Each level keeps its outcome mix and the text of its first failure (LevelStats.outcomes,
first_error): a probe whose requests fail for reasons other than capacity (a 400 for a prompt the
engine cannot take, a malformed answer) measures nothing, and says so (collector.analysis.estimate).

With `lengths` (`--workload from-log`) each request takes one (prompt tokens, completion tokens)
pair drawn from the request log: a filler prompt of that length and that many output tokens.
The filler's characters per token follow what the engine reports in `usage`, so the prompt
tokens sent match the log's on any tokenizer. Its text is new to the engine on every run (the
run's numbers start at a point drawn per run): an engine caching prefixes (vLLM's prefix cache,
llama-server's slot cache) would otherwise prefill a second run's prompts from the first's.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from collector.analysis.knee import KneeRule, detect_knee, judge_level
from collector.analysis.levels import summarize_level
from collector.analysis.openloop import (
    RateResult,
    RateSettings,
    bracket_rates,
    little_check,
    run_rates,
)
from collector.analysis.probe_request import RequestSpec, send_one
from collector.analysis.prompts import PromptPicker, load_prompts, prompt_of_tokens
from collector.analysis.stats import percentile, seconds
from collector.capacity import LevelStats, Slo
from collector.inflight import Inflight
from collector.sources import EngineSource, build_engine_source, default_metrics_url
from collector.tokens import estimate_tokens
from collector.upstream import UpstreamClient

__all__ = [
    "ProbeSettings",
    "LevelRun",
    "ProbeResult",
    "ProbeError",
    "run_probe",
    "DEFAULT_LEVELS",
    "new_run_id",
    "saturation_reason",
]

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64)


class ProbeError(RuntimeError):
    """The probe cannot run (unreachable URL, bad settings); the message says what to do."""


@dataclass(frozen=True)
class ProbeSettings:
    """Everything a probe run needs; defaults suit a real engine, tests shrink the caps."""

    url: str
    model: str | None = None
    levels: tuple[int, ...] = DEFAULT_LEVELS
    max_tokens: int = 128
    ignore_eos: bool = True
    prompts: str = "short"
    endpoint: str = "/v1/chat/completions"
    slo: Slo = field(default_factory=Slo)
    warmup_per_worker: int = 1
    min_samples: int = 16
    max_samples: int = 400
    max_level_s: float = 120.0
    drift_tolerance: float = 0.05
    drift_window: int = 4  # completions per drift check at least (at least `level` too)
    request_timeout_s: float = 300.0
    connect_timeout_s: float = 5.0
    saturation_error_ratio: float = 0.25  # of capacity errors (429/503/timeouts) at one level
    saturation_ttft_factor: float = 10.0  # x SLO / 3, when an SLO is set
    engine_metrics: str = "auto"  # "auto": URL/metrics if it names an engine; "none"; or a URL
    task_class: str = "all"  # the workload class measured (collector.tasks); all = one workload
    seed: int = 0
    run_id: str | None = None
    api_key: str | None = field(default=None, repr=False)  # sent as a bearer token, never stored
    # the sidecar's token (X-Headroom-Probe-Token): what makes the sidecar log this load as the probe's
    sidecar_token: str | None = field(default=None, repr=False)
    # (prompt tokens, completion tokens) pairs to draw each request from (--workload from-log);
    # empty: `prompts` and `max_tokens`
    lengths: tuple[tuple[int, int], ...] = field(default=(), repr=False)
    # the open-loop ladder after the gradient (collector.analysis.openloop): offered requests/s,
    # or rates_auto to bracket the knee's rate (knee / mean e2e at the knee); empty: none
    rates: tuple[float, ...] = ()
    rates_auto: bool = False
    rate_level_s: float = 30.0
    rate_warmup_s: float = 5.0
    # LoRA adapters of the model to name in the requests' `model`, in turn per request (round-robin
    # over the run's requests, so concurrent requests name different adapters); empty: the model
    adapters: tuple[str, ...] = ()


@dataclass
class LevelRun:
    """One measured level: its rows (warm-up included), window, stats and why it ended."""

    concurrency: int
    rows: list[dict[str, Any]]
    stats: LevelStats
    ended_by: str


@dataclass
class ProbeResult:
    """A whole run: the levels measured and, when it stopped before the last, why."""

    run_id: str
    model: str
    url: str
    levels: list[LevelRun]
    stopped_early: str | None = None
    task_class: str = "all"
    engine_max_concurrency: int | None = None  # the engine's own ceiling, when it tells it
    queue_evidence: str = "TTFT growth (the engine's queue was not read)"
    engine_kv_capacity_tokens: int | None = None  # the engine's KV cache, when it publishes it
    rates: RateResult | None = None  # the open-loop ladder, when one ran
    adapters: tuple[str, ...] = ()  # the LoRA adapters in the mix (ProbeSettings.adapters)


def new_run_id() -> str:
    """probe-20261130T120000Z-3f2a: sortable by time, unique by suffix."""
    return f"probe-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(2)}"


def _base_url(url: str) -> str:
    base = url.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


async def _resolve_model(
    session: aiohttp.ClientSession, base: str, model: str | None, timeout_s: float
) -> str:
    """Fail fast on a dead URL; ask /v1/models for the model when none was given."""
    try:
        async with session.get(
            f"{base}/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s * 2, sock_connect=timeout_s)
        ) as resp:
            listing = await resp.json(content_type=None) if resp.status == 200 else {}
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise ProbeError(
            f"cannot reach {base} ({type(exc).__name__}: {exc or 'timed out'}); "
            "check --url and that the server is running"
        ) from None
    except ValueError:
        listing = {}
    if model:
        return model
    data = listing.get("data") if isinstance(listing, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict) and data[0].get("id"):
        return str(data[0]["id"])
    raise ProbeError(f"{base}/v1/models did not name a model; pass --model")


def saturation_reason(levels: Sequence[LevelStats], settings: ProbeSettings) -> str | None:
    """Why the last of `levels` (measured so far, in order) is clearly saturated, or None.

    Saturated: capacity errors (429/503/timeouts) at saturation_error_ratio or more, or the knee
    rule finds the knee below this level and this level queues (more load only waits), or p95
    TTFT is far beyond the SLO. Latency growth alone is not saturation: a compute-bound engine
    slows down with every request it batches and still gains throughput.
    """
    current = levels[-1]
    errors = current.capacity_errors
    if (
        errors >= KneeRule().min_capacity_errors
        and errors / max(current.samples, 1) >= settings.saturation_error_ratio
    ):
        return (
            f"{errors} capacity errors (429/503/timeouts) in {current.samples} requests at "
            f"concurrency {current.concurrency}"
        )
    knee = detect_knee(levels)
    verdict = judge_level(current, min(levels, key=lambda s: s.concurrency))
    if knee.reached and knee.requests < current.concurrency and verdict.queueing:
        return f"throughput stopped rising at {knee.requests} and {verdict.queueing}"
    ttft = current.ttft_p95_s if current.ttft_p95_persistent_s is None else current.ttft_p95_persistent_s
    if settings.slo.ttft_p95_s is not None and ttft is not None:
        limit = settings.slo.ttft_p95_s * settings.saturation_ttft_factor / 3
        if ttft > limit:
            return (
                f"p95 TTFT {ttft:.3f} s at concurrency {current.concurrency} is far beyond "
                f"the SLO (limit {limit:.3f} s)"
            )
    return None


class _Level:
    """State of one level while it runs; `check()` decides when measuring may stop."""

    def __init__(
        self, concurrency: int, settings: ProbeSettings, meter: Inflight, engine: EngineSource | None = None
    ) -> None:
        self.concurrency, self.settings, self.meter, self.engine = concurrency, settings, meter, engine
        self.rows: list[dict[str, Any]] = []
        self.measuring_since: float | None = None
        self.area_at_start = 0.0
        self.started = time.time()
        self.next_check = max(settings.min_samples, concurrency)
        self.last_p95: float | None = None
        self.done = asyncio.Event()
        self.ended_by = ""
        self.stop_time = self.area_at_stop = 0.0
        self.first_error: str | None = None  # the first failure's text, as the client saw it

    def waiting(self) -> int | None:
        """The engine's queue as last polled, if that poll was sent during this level.

        None without a source, when it is down, or when the latest poll predates the level: a
        queue read at the level below says nothing about this one, and on a busy host a late
        poll would otherwise put the last level's empty queue into this level's mean.
        """
        if self.engine is None or self.engine.latest.polled_at < self.started:
            return None
        return self.engine.latest.waiting

    def measured(self) -> list[dict[str, Any]]:
        start = self.measuring_since
        return [] if start is None else [r for r in self.rows if (seconds(r["admitted_at"]) or 0.0) >= start]

    def _stop(self, why: str) -> None:
        if not self.done.is_set():
            self.ended_by, self.stop_time, self.area_at_stop = why, time.time(), self.meter.area()
            self.done.set()

    def check(self) -> None:
        """After each completion: start measuring once warm, stop when a reason appears."""
        why = self._reason_to_stop()
        if why:
            self._stop(why)

    def _reason_to_stop(self) -> str | None:
        settings, n_all = self.settings, len(self.rows)
        failed = [r for r in self.rows if r["outcome"] != "ok"]
        if n_all >= max(self.concurrency, settings.drift_window) and len(failed) / n_all >= 0.5:
            errors = Counter(r["error"] or r["outcome"] for r in failed).most_common(1)[0][0]
            return f"failing: {len(failed)} of {n_all} requests failed (most often: {errors})"
        if self.measuring_since is None:
            if n_all >= settings.warmup_per_worker * self.concurrency:
                self.measuring_since, self.area_at_start = time.time(), self.meter.area()
            return None
        measured = self.measured()
        if len(measured) >= settings.max_samples:
            return f"sample cap {settings.max_samples}"
        # the cap counts measuring time: a slow level's warm-up must not eat its window
        if time.time() - self.measuring_since >= settings.max_level_s:
            return f"time cap {settings.max_level_s:g} s"
        if len(measured) < self.next_check:
            return None
        p95 = percentile([r["ttft_s"] for r in measured], 0.95)
        previous, self.last_p95 = self.last_p95, p95
        self.next_check = len(measured) + max(self.concurrency, settings.drift_window)
        if previous and p95 is not None and abs(p95 - previous) / previous < settings.drift_tolerance:
            return f"p95 TTFT stable (moved {abs(p95 - previous) / previous:.1%} over the last window)"
        return None


ProgressFn = Callable[[int, int, int], None]


class _Runner:
    def __init__(
        self,
        settings: ProbeSettings,
        client: UpstreamClient,
        model: str,
        run_id: str,
        progress: ProgressFn | None,
        engine: EngineSource | None,
    ) -> None:
        self.settings, self.client, self.model, self.run_id = settings, client, model, run_id
        self.engine = engine
        self.progress = progress or (lambda level, done, cap: None)
        self.picker = (
            None if settings.lengths else PromptPicker(load_prompts(settings.prompts), settings.seed)
        )
        self.draw = random.Random(settings.seed)
        # the filler's numbering starts anew per run: the same prompts twice would be cached
        self.filler_base = secrets.randbelow(10**6) * 10**4
        self.meter = Inflight()
        self.url = _base_url(settings.url) + settings.endpoint
        self.sequence = 0
        # --workload from-log: prompt tokens asked for vs reported by the engine, of answered
        # requests, to scale the filler's characters per token to the engine's tokenizer
        self.asked: dict[str, int] = {}
        self.asked_total = self.reported_total = 0

    def _chars_per_token(self) -> float:
        if self.reported_total < 1:
            return 4.0
        return min(16.0, max(1.0, 4.0 * self.asked_total / self.reported_total))

    def _shape(self, request_id: str) -> tuple[str, int]:
        """The prompt and max_tokens of the next request."""
        if self.picker is not None:
            return self.picker.next(), self.settings.max_tokens
        prompt_tokens, completion_tokens = self.draw.choice(self.settings.lengths)
        self.asked[request_id] = prompt_tokens
        text = prompt_of_tokens(prompt_tokens, self.filler_base + self.sequence, self._chars_per_token())
        return text, completion_tokens

    def _calibrate(self, row: dict[str, Any]) -> None:
        asked = self.asked.pop(row["request_id"], None)
        if asked is not None and row["outcome"] == "ok" and row["usage_source"] == "upstream":
            self.asked_total += asked
            self.reported_total += row["prompt_tokens"] or 0

    def _spec(self, level: _Level) -> RequestSpec:
        return self._spec_for(level.measuring_since is None, level=level.concurrency)

    def rate_spec(self, rate_per_s: float, warm: bool) -> RequestSpec:
        """The next request of an open-loop level (collector.analysis.openloop)."""
        return self._spec_for(warm, rate_per_s=rate_per_s)

    def calibrate(self, row: dict[str, Any]) -> None:
        """Learn the engine's characters per token from an answered from-log request."""
        self._calibrate(row)

    def _spec_for(
        self, warm: bool, *, level: int | None = None, rate_per_s: float | None = None
    ) -> RequestSpec:
        self.sequence += 1
        request_id = f"{self.run_id}-{self.sequence:06d}"
        prompt, max_tokens = self._shape(request_id)
        adapters = self.settings.adapters
        adapter = adapters[(self.sequence - 1) % len(adapters)] if adapters else None
        payload: dict[str, Any] = {
            "model": adapter or self.model,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        }
        if self.settings.endpoint.endswith("/chat/completions"):
            payload["messages"] = [{"role": "user", "content": prompt}]
        else:
            payload["prompt"] = prompt
        if self.settings.ignore_eos:
            payload["ignore_eos"] = True
        return RequestSpec(
            request_id,
            self.run_id,
            self.url,
            self.settings.endpoint,
            self.model,
            max_tokens,
            payload,
            estimate_tokens(prompt),
            self.settings.task_class,
            prompt,
            adapter,
            level,
            rate_per_s,
            warm,
        )

    async def _worker(self, level: _Level, delay_s: float) -> None:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        while not level.done.is_set():
            answer = await send_one(self.client, self._spec(level), self.meter, level.waiting)
            row = answer.record.as_row()
            self._calibrate(row)
            if answer.error_text is not None and level.first_error is None:
                level.first_error = answer.error_text
            level.rows.append(row)
            level.check()
            self.progress(level.concurrency, len(level.measured()), self.settings.max_samples)

    async def run_level(self, concurrency: int, stagger_s: float = 0.0) -> LevelRun:
        level = _Level(concurrency, self.settings, self.meter, self.engine)
        workers = [
            asyncio.create_task(self._worker(level, i * stagger_s / concurrency)) for i in range(concurrency)
        ]
        try:
            # warm-up and measuring together; a level that never warms up ends here
            await asyncio.wait_for(level.done.wait(), 2 * self.settings.max_level_s + 5)
        except TimeoutError:
            level._stop(f"time cap {2 * self.settings.max_level_s:g} s (warm-up included)")
        await asyncio.gather(*workers)  # drain: in-flight requests finish (bounded by timeout)
        return self._finish(level)

    def _finish(self, level: _Level) -> LevelRun:
        window, inflight = None, None
        start = level.measuring_since
        if start is not None and level.stop_time > start:
            window = (start, level.stop_time)
            inflight = (level.area_at_stop - level.area_at_start) / (level.stop_time - start)
        stats = summarize_level(
            level.rows,
            level.concurrency,
            window=window,
            mean_inflight=inflight,
            first_error=level.first_error,
        )
        return LevelRun(level.concurrency, level.rows, stats, level.ended_by)


async def run_probe(
    settings: ProbeSettings,
    *,
    write_rows: Callable[[list[dict[str, Any]]], Any] | None = None,
    progress: ProgressFn | None = None,
    on_level: Callable[[LevelRun], None] | None = None,
) -> ProbeResult:
    """Run the gradient; each level's rows go to `write_rows` (e.g. RequestStore.insert_rows).

    Raises ProbeError when the URL is unreachable or the settings are wrong.
    """
    levels = sorted(set(settings.levels))
    if not levels or levels[0] < 1:
        raise ProbeError(f"levels {settings.levels!r} must be positive integers, e.g. 1,2,4,8")
    run_id = settings.run_id or new_run_id()
    timeout = aiohttp.ClientTimeout(total=settings.request_timeout_s, sock_connect=settings.connect_timeout_s)
    # Through a sidecar, these mark the load as the probe's: tenant label and (where the sidecar
    # reads them) the row's source and run id, so passive curves can leave probe load out.
    headers = {"X-Tenant-ID": "headroom-probe", "X-Headroom-Source": "probe", "X-Headroom-Run-Id": run_id}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    if settings.sidecar_token:
        headers["X-Headroom-Probe-Token"] = settings.sidecar_token
    client = UpstreamClient(max_connections=0, timeout=timeout, headers=headers)
    engine = _engine_source(settings)
    await client.open()
    try:
        base = _base_url(settings.url)
        assert client.session is not None
        model = await _resolve_model(client.session, base, settings.model, settings.connect_timeout_s)
        if engine is not None:
            await engine.start()
        runner = _Runner(settings, client, model, run_id, progress, engine)
        result = ProbeResult(
            run_id, model, settings.url, [], task_class=settings.task_class, adapters=settings.adapters
        )
        stagger_s = 0.0
        for concurrency in levels:
            level = await runner.run_level(concurrency, stagger_s)
            stagger_s = min(level.stats.e2e_p50_s or 0.0, settings.max_level_s / 4)
            result.levels.append(level)
            if write_rows is not None:
                write_rows(level.rows)
            if on_level:
                on_level(level)
            why = saturation_reason([lv.stats for lv in result.levels], settings)
            if why is not None:
                why = f"saturated, {why}"
            elif level.ended_by.startswith("failing"):  # down or refusing us: never hammer it
                why = level.ended_by
            if why and concurrency != levels[-1]:
                result.stopped_early = f"stopped after concurrency {concurrency}: {why}"
                break
        if settings.rates or settings.rates_auto:
            result.rates = await _open_loop(runner, settings, result, write_rows)
        result.queue_evidence = _queue_evidence(engine)
        result.engine_max_concurrency = engine.latest.max_concurrency if engine else None
        result.engine_kv_capacity_tokens = engine.latest.kv_capacity_tokens if engine else None
    finally:
        if engine is not None:
            await engine.stop()
        await client.close()
    return result


def _knee_e2e(result: ProbeResult) -> tuple[int, bool, float | None]:
    """The closed loop's knee, whether it was reached, and the mean e2e of its measured requests."""
    knee = detect_knee([level.stats for level in result.levels])
    at = next((level for level in result.levels if level.concurrency == knee.requests), None)
    e2e = [
        r["e2e_s"]
        for r in (at.rows if at else [])
        if r["outcome"] == "ok" and r["e2e_s"] is not None and not r["probe_warmup"]
    ]
    return knee.requests, knee.reached, (sum(e2e) / len(e2e) if e2e else None)


async def _open_loop(
    runner: _Runner,
    settings: ProbeSettings,
    result: ProbeResult,
    write_rows: Callable[[list[dict[str, Any]]], Any] | None,
) -> RateResult:
    """The open-loop ladder after the gradient, checked against its knee by Little's law."""
    knee, reached, e2e = _knee_e2e(result)
    rates = settings.rates
    if settings.rates_auto:
        if e2e is None:
            return RateResult([], None, None, "no answered request at the knee to bracket rates from")
        rates = tuple(sorted(set(rates) | set(bracket_rates(knee, e2e))))
    ladder = RateSettings(
        rates,
        level_s=settings.rate_level_s,
        warmup_s=settings.rate_warmup_s,
        seed=settings.seed,
        slo=settings.slo,
        batch=knee,
    )

    def written(_level: Any, rows: list[dict[str, Any]]) -> None:
        if write_rows is not None:
            write_rows(rows)

    rated = await run_rates(runner, ladder, on_level=written)
    rated.run_id = runner.run_id
    if rated.mu_slo_per_s is not None and e2e is not None:
        failing = next((lv for lv in rated.levels if lv.offered_per_s > rated.mu_slo_per_s), None)
        rated.little = little_check(
            knee,
            e2e,
            rated.mu_slo_per_s,
            knee_reached=reached,
            slo_bound=failing is not None and not failing.meets_slo,
        )
    return rated


def _queue_evidence(engine: EngineSource | None) -> str:
    """Where the knee's queueing evidence came from, for the people reading the result."""
    if engine is None:
        return "TTFT growth (--engine-metrics none)"
    if engine.latest.up and engine.latest.waiting is not None:
        return f"the engine's waiting count ({engine.engine} metrics)"
    return f"TTFT growth (no engine queue readable: {engine.latest.error or 'no waiting count'})"


def _engine_source(settings: ProbeSettings) -> EngineSource | None:
    """A poller of the engine's queue for the knee's evidence (also through a sidecar)."""
    choice = settings.engine_metrics
    if choice == "none":
        return None
    url = default_metrics_url(_base_url(settings.url)) if choice == "auto" else choice
    return build_engine_source("auto", url, 0.2)  # levels are short: sample the queue often
