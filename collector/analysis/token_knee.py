"""The token caliber's capacity, in the gauge's own units (docs/capacity.md "Token capacity").

**Active tokens** at time t = the sum over the requests in flight of the tokens each holds: its
prompt from admission, plus what it has generated so far (headroom_active_tokens; collector.inflight).
The gauge and every 5-minute average of it are *time-weighted*: a request counts for as long as
it is in flight, so long prompts, which live longer, count more than their share of admissions.

**Token capacity** = the time-weighted active tokens while one replica serves the traffic's own
length mix at the request knee, never more than the engine's KV cache holds. By Little's law the
time average of active tokens at k requests in flight is k x W, where W is the traffic's
*time-weighted tokens per in-flight request*:

    W = sum_i area_i / sum_i duration_i,  area_i = prompt_i x e2e_i + completion_i x (e2e_i - ttft_i) / 2

(the prompt held for the whole request, the completion growing linearly from the first token to
the end), with prompt and completion in the gauge's own count: what the sidecar added for the
request (`held_prompt_tokens`, `held_generated_tokens`), not the engine's usage, which can differ
by 25 % either way (a chars/4 estimate of English prose vs llama.cpp's tokenizer; a chat template
the estimate never sees). Rows without them (an import, a lake row from an older sidecar) use the
usage. An average per admission (sum_i tokens_i / n) is smaller whenever long requests live longer
than short ones, the inspection paradox: with one 600-token prompt in ten living 3x longer, the
admission average undercounts the gauge by 2x or more, and a knee in those units fires token
alerts at half load (the probe's old `knee.tokens`, kept in `admission_mean` to show the gap).

Anything that acts on an instantaneous value (an autoscaler's poll, a gateway's admission limit, a
review's peak) compares with the distribution of the instantaneous sum at the knee level, not the
mean: k in-flight requests drawn in proportion to how long each stays (length-biased, which is what
"time-weighted" means), each at a uniform moment of its life. Its p50/p95/max are sampled with a
fixed seed from up to SAMPLE_ROWS rows of the traffic. Every figure is capped at the KV capacity.

The mix comes from the answered traffic requests in the TRAFFIC_WINDOW (7 days) before the estimate,
one model (and task class) or all, at least MIN_TRAFFIC_REQUESTS of them; with fewer the token
capacity is withheld (every token-derived figure None) with the reason. The request knee comes from
whatever measured it: a probe with any prompts, or the passive curve. So the default probe beside
logged traffic publishes a token capacity; `--workload from-log` makes its request knee the
traffic's too.

    mix = token_mix_of(([Held(1.0, 20, 30, 0.1)] * 9 + [Held(3.0, 600, 40, 0.5)]) * 6)
    round(mix.per_inflight_tokens) -> 179; round(mix.per_request_tokens) -> 109
    token_capacity(4, mix, kv_capacity_tokens=4096).mean -> 717  (4 x 179.3; p95 1,852)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from collector.store.db import RequestStore

__all__ = [
    "Held",
    "TokenMix",
    "TokenCapacity",
    "MIN_TRAFFIC_REQUESTS",
    "TRAFFIC_WINDOW",
    "SAMPLE_ROWS",
    "token_mix_of",
    "traffic_token_mix",
    "token_capacity",
    "token_capacity_in_store",
]

MIN_TRAFFIC_REQUESTS = 50  # answered traffic requests before the traffic's mix is believed
TRAFFIC_WINDOW = timedelta(days=7)  # the traffic an estimate takes its mix from: the week before it
SAMPLE_ROWS = 5000  # rows of the traffic the instantaneous distribution is drawn from
_DRAWS = 200_000  # requests drawn for the distribution in all (samples x knee level)
_SEED = 20261207

# one answered traffic request as the gauge saw it (the tokens the sidecar counted for it, where the
# row has them; else the usage); the aggregates are exact over the window. The largest request is
# the larger of both counts: a limit must admit it in either
_HELD_PROMPT = "coalesce(held_prompt_tokens, prompt_tokens)"
_HELD_OUTPUT = "coalesce(held_generated_tokens, completion_tokens)"
_AGGREGATE_SQL = f"""SELECT count(*),
        sum({_HELD_PROMPT} * e2e_s + {_HELD_OUTPUT} * greatest(e2e_s - coalesce(ttft_s, 0), 0) / 2),
        sum(e2e_s), avg({_HELD_PROMPT} + {_HELD_OUTPUT}),
        max(greatest({_HELD_PROMPT} + {_HELD_OUTPUT}, prompt_tokens + completion_tokens))
    FROM requests
    WHERE source = 'traffic' AND outcome = 'ok' AND prompt_tokens IS NOT NULL
      AND completion_tokens IS NOT NULL AND e2e_s > 0 AND (? IS NULL OR admitted_at >= ?) AND (? IS NULL OR admitted_at < ?)
      AND (? IS NULL OR model = ?) AND (? IS NULL OR task_class = ?)"""
_SAMPLE_SQL = f"""SELECT e2e_s, {_HELD_PROMPT}, {_HELD_OUTPUT}, coalesce(ttft_s, 0) FROM requests
    WHERE source = 'traffic' AND outcome = 'ok' AND prompt_tokens IS NOT NULL
      AND completion_tokens IS NOT NULL AND e2e_s > 0 AND (? IS NULL OR admitted_at >= ?) AND (? IS NULL OR admitted_at < ?)
      AND (? IS NULL OR model = ?) AND (? IS NULL OR task_class = ?)
    ORDER BY hash(request_id, ?) LIMIT ?"""


@dataclass(frozen=True, slots=True)
class Held:
    """What one request held while in flight: for `duration_s`, its prompt from admission and its
    completion growing linearly from `ttft_s` to the end."""

    duration_s: float
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float = 0.0

    @property
    def generating_s(self) -> float:
        """Seconds from the first token to the end (0 for an answer in one piece)."""
        return max(self.duration_s - min(self.ttft_s, self.duration_s), 0.0)

    @property
    def area(self) -> float:
        """Token-seconds: the integral of the tokens it held over its life."""
        return self.prompt_tokens * self.duration_s + self.completion_tokens * self.generating_s / 2

    def at(self, seconds: float) -> float:
        """Tokens held `seconds` after admission."""
        into = seconds - (self.duration_s - self.generating_s)
        if into <= 0 or self.generating_s <= 0:
            return float(self.prompt_tokens)
        return self.prompt_tokens + self.completion_tokens * min(into / self.generating_s, 1.0)


@dataclass(frozen=True)
class TokenMix:
    """A workload's length mix in the gauge's units: the exact aggregates of its answered
    requests and a sample of them for the instantaneous distribution."""

    requests: int
    per_inflight_tokens: float  # W: time-weighted tokens per in-flight request
    per_request_tokens: float  # mean prompt + completion per request (per admission)
    max_request_tokens: int  # the largest prompt + completion one request held
    sample: tuple[Held, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON (the sample is not kept)."""
        return {
            "requests": self.requests,
            "per_inflight_tokens": round(self.per_inflight_tokens, 1),
            "per_request_tokens": round(self.per_request_tokens, 1),
            "max_request_tokens": self.max_request_tokens,
        }


def token_mix_of(held: Sequence[Held]) -> TokenMix | None:
    """The mix of these requests (all of them the sample too); None when there are none."""
    if not held:
        return None
    duration = sum(h.duration_s for h in held)
    return TokenMix(
        len(held),
        sum(h.area for h in held) / duration,
        sum(h.prompt_tokens + h.completion_tokens for h in held) / len(held),
        max(h.prompt_tokens + h.completion_tokens for h in held),
        tuple(held),
    )


def traffic_token_mix(
    store: RequestStore,
    model: str | None,
    since: datetime | None,
    until: datetime | None,
    task_class: str | None = None,
) -> TokenMix | None:
    """The mix of the answered traffic in [since, until) (None: unbounded): aggregates over every
    row, a seeded sample of SAMPLE_ROWS for the distribution. None without any answered traffic."""
    task = None if task_class in (None, "all") else task_class
    window = [since, since, until, until, model, model, task, task]
    n, area, duration, mean_tokens, largest = store.query(_AGGREGATE_SQL, window)[0]
    if not n or not duration:
        return None
    rows = store.query(_SAMPLE_SQL, [*window, _SEED, SAMPLE_ROWS])
    sample = tuple(Held(float(e2e), int(p), int(c), float(t)) for e2e, p, c, t in rows)
    return TokenMix(int(n), float(area) / float(duration), float(mean_tokens), int(largest), sample)


@dataclass(frozen=True)
class TokenCapacity:
    """The token caliber's published figures at the request knee (None when withheld) and the
    evidence: the traffic's mix, the admission average the old definition published, the KV cap."""

    knee_requests: int | None
    mean: int | None  # headroom_capacity_knee_tokens: time-weighted, for 5-minute averages
    p50: int | None
    p95: int | None  # headroom_capacity_knee_tokens_p95: for anything instantaneous
    max: int | None
    withheld: str | None
    mix: TokenMix | None = None
    admission_mean: int | None = None  # the knee level's mean active tokens at admissions
    kv_capacity_tokens: int | None = None
    notes: list[str] = field(default_factory=list)
    pool_requests: int | None = None  # the recommended pool the pool's figure is for
    pool_tokens: int | None = None  # headroom_capacity_recommended_pool_tokens: p99.9 at the pool

    @property
    def max_request_tokens(self) -> int | None:
        """The largest request the traffic sent (prompt + completion): a floor for any admission limit."""
        return self.mix.max_request_tokens if self.mix else None

    def per_request(self, requests: int | None) -> int | None:
        """The time-weighted active tokens at `requests` in flight (e.g. the SLO maximum), capped."""
        if self.withheld is not None or self.mix is None or not requests:
            return None
        return _capped(requests * self.mix.per_inflight_tokens, self.kv_capacity_tokens)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON (the estimate's `token_capacity`)."""
        return {
            "definition": "time-weighted active tokens (prompt + generated so far) at the request knee, "
            "with the traffic's length mix, capped at the KV capacity",
            "knee_requests": self.knee_requests,
            "mean": self.mean,
            "p50": self.p50,
            "p95": self.p95,
            "max": self.max,
            "pool_requests": self.pool_requests,
            "pool_tokens": self.pool_tokens,
            "withheld": self.withheld,
            "traffic_mix": self.mix.to_dict() if self.mix else None,
            "max_request_tokens": self.max_request_tokens,
            "admission_mean": self.admission_mean,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "notes": list(self.notes),
        }


def _capped(value: float, kv: int | None) -> int:
    return int(round(min(value, kv) if kv and kv > 0 else value))


def _quantiles(mix: TokenMix, level: int) -> tuple[float, float, float, float]:
    """p50, p95, p99.9 and max of the instantaneous sum of `level` length-biased draws from the sample."""
    sample = mix.sample
    cumulative, total = [], 0.0
    for held in sample:
        total += held.duration_s
        cumulative.append(total)
    rng = random.Random(_SEED)
    sums = []
    for _ in range(max(200, min(2000, _DRAWS // level))):
        drawn = rng.choices(sample, cum_weights=cumulative, k=level)
        sums.append(sum(h.at(rng.random() * h.duration_s) for h in drawn))
    sums.sort()

    def at(q: float) -> float:
        return sums[min(len(sums) - 1, int(q * len(sums)))]

    return at(0.5), at(0.95), at(0.999), sums[-1]


def token_capacity(
    knee_requests: int | None,
    mix: TokenMix | None,
    *,
    kv_capacity_tokens: int | None = None,
    admission_mean: int | None = None,
    reached: bool = True,
    pool: int | None = None,
) -> TokenCapacity:
    """The token capacity at a request knee with a traffic mix (module docstring), or withheld;
    with `pool` (the recommended pool in requests) also the pool in tokens: the p99.9 of the
    instantaneous sum with `pool` requests in flight, what a replica at its pool plausibly holds
    at any moment (KEDA's token budget, a gateway's token limit, the review's peak), capped.

    Examples: knee 4, W 179.3 -> mean 717; knee 64, W 240, KV 8192 -> 8192 (capped, with a note);
    no traffic mix or fewer than MIN_TRAFFIC_REQUESTS requests -> withheld with the reason.
    """
    kv = kv_capacity_tokens if kv_capacity_tokens and kv_capacity_tokens > 0 else None

    def withheld(why: str) -> TokenCapacity:
        return TokenCapacity(
            knee_requests, None, None, None, None, why, mix, admission_mean, kv_capacity_tokens
        )

    if not reached or not knee_requests:
        return withheld("the request knee was not reached (a lower bound): no token capacity at it")
    if mix is None or mix.requests < MIN_TRAFFIC_REQUESTS:
        seen = 0 if mix is None else mix.requests
        return withheld(
            f"too little traffic for its length mix ({seen} answered traffic requests in the "
            f"{TRAFFIC_WINDOW.days} days before, {MIN_TRAFFIC_REQUESTS} needed): the token capacity is "
            "the traffic's time-weighted tokens per in-flight request at the request knee"
        )
    mean = knee_requests * mix.per_inflight_tokens
    p50, p95, _, top = _quantiles(mix, knee_requests) if mix.sample else (mean, mean, mean, mean)
    at_pool = None
    if pool:
        at_pool = _quantiles(mix, pool)[2] if mix.sample else pool * mix.per_inflight_tokens
    notes = [
        f"{mix.per_inflight_tokens:.0f} tokens per in-flight request, time-weighted, over "
        f"{mix.requests} answered traffic requests ({mix.per_request_tokens:.0f} per request at "
        "admission: long requests stay in flight longer)"
    ]
    if admission_mean is not None and mean > 0:
        notes.append(
            f"the admission average at the knee was {admission_mean} tokens, "
            f"{admission_mean / mean:.2f}x the time-weighted {mean:.0f}: not in the gauge's units"
        )
    if kv is not None and kv < top:
        notes.append(f"capped at the engine's KV capacity ({kv} tokens)")
    return TokenCapacity(
        knee_requests,
        _capped(mean, kv),
        _capped(p50, kv),
        _capped(p95, kv),
        _capped(top, kv),
        None,
        mix,
        admission_mean,
        kv_capacity_tokens,
        notes,
        pool or None,
        _capped(at_pool, kv) if at_pool is not None else None,
    )


def token_capacity_in_store(
    store: RequestStore | None,
    knee_requests: int | None,
    *,
    model: str | None,
    at: datetime | None,
    since: datetime | None = None,
    reached: bool = True,
    task_class: str | None = None,
    kv_capacity_tokens: int | None = None,
    admission_mean: int | None = None,
    pool: int | None = None,
) -> TokenCapacity:
    """token_capacity with the mix of the traffic in `store` from `since` (default: the
    TRAFFIC_WINDOW before `at`) to `at` (None: unbounded); no store: no traffic, withheld."""
    mix = None
    if store is not None:
        start = since if since is not None or at is None else at - TRAFFIC_WINDOW
        mix = traffic_token_mix(store, model, start, at, task_class)
    return token_capacity(
        knee_requests,
        mix,
        kv_capacity_tokens=kv_capacity_tokens,
        admission_mean=admission_mean,
        reached=reached,
        pool=pool,
    )
