"""Where the traffic's TTFT went, by the engine's own account, per model and replica class: the
passive prefill rate V_P, the prefix-cache hit rate, the TTFT split and goodput (docs/capacity.md,
"Passive V_P and where TTFT went").

Client traffic (source 'traffic') admitted in [since, until), read with passive.rows_sql and
grouped by model and the replica class each row names (none: the default class), in one DuckDB
query with parameters:

- **V_P** = Σ engine_prompt_computed / Σ engine_prefill_s over the rows that carry both: the
  prefill rate the engine measured on production traffic, with no load of its own (DOMAIN §16).
  A ratio of sums, never a mean of per-request rates: 100 tokens in 0.1 s beside 3,000 in 1.0 s
  is 3,100 / 1.1 = 2,818 tokens/s, where the mean of the two rates would say 2,000.
- **cache hit rate** = Σ engine_prompt_cached / Σ (cached + computed) over the same rows (a
  missing cached count is 0): the sidecar's headroom_engine_prompt_tokens_total{cache} from the log.
- **the split** of TTFT over the streamed ok rows that carry TTFT, the sidecar's hop, the engine's
  queue and its prefill: the rest is TTFT less the three (the first token's way back, and what the
  engine did before queueing). The parts' means sum to the mean TTFT; p50 and p95 are per part.
  llama.cpp reports no queue: the sidecar derives it as TTFT less the hop and the prefill (never
  below 0), so its rest is 0, or negative where the engine's prefill outlasted the sidecar's TTFT.
- **goodput** (collector.goodput): the rows per verdict, the met ones per second of the window,
  attainment = met / every verdict but invalid. Rows the sidecar did not judge are `unjudged`.

Rows without engine timings (vLLM without --enable-per-request-metrics, an engine that says
nothing) count in the rows and the goodput and in nothing else; NO_TIMINGS says why.

Past 300 lines: the result's frozen dataclasses (each with its JSON) live beside the one query
that fills them, so a column and the field it lands in are read together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from collector.analysis.passive import rows_sql
from collector.analysis.stats import seconds
from collector.capacity import DEFAULT_REPLICA_CLASS
from collector.goodput import VERDICTS

__all__ = [
    "Reads",
    "Spread",
    "TtftSplit",
    "PrefillRate",
    "Goodput",
    "EngineSplit",
    "EngineSplitReport",
    "engine_split",
    "prefill_rate",
    "NO_TIMINGS",
    "PARTS",
]

NO_TIMINGS = (
    "the engine reported no per-request timings: llama.cpp always does; "
    "vLLM needs --enable-per-request-metrics"
)
# the split's parts in the order TTFT spends them: (name, column of g below)
PARTS = (("hop", "sidecar_hop_s"), ("queue", "engine_queue_s"), ("prefill", "engine_prefill_s"))

# every row of the window, with its group and what it counts in; `?`: the default class
_GROUPED = """WITH r AS ({rows}),
g AS (SELECT *, coalesce(model, 'unknown') AS model_name, coalesce(replica_class, ?) AS class_name,
        engine_prompt_computed IS NOT NULL AND engine_prefill_s IS NOT NULL AS rated,
        coalesce(outcome = 'ok' AND stream AND ttft_s IS NOT NULL AND sidecar_hop_s IS NOT NULL
                 AND engine_queue_s IS NOT NULL AND engine_prefill_s IS NOT NULL, false) AS split,
        ttft_s - sidecar_hop_s - engine_queue_s - engine_prefill_s AS rest_s
      FROM r WHERE ? IS NULL OR coalesce(replica_class, ?) = ?)"""
_PREFILL = """count(*), count(engine_timings), count(*) FILTER (rated),
    coalesce(sum(engine_prompt_computed) FILTER (rated), 0),
    coalesce(sum(engine_prefill_s) FILTER (rated), 0),
    coalesce(sum(coalesce(engine_prompt_cached, 0)) FILTER (rated), 0),
    list(DISTINCT engine_timings) FILTER (engine_timings IS NOT NULL)"""
_SPLIT = ", ".join(
    f"avg({column}) FILTER (split), quantile_cont({column}, [0.5, 0.95]) FILTER (split)"
    for column in ("ttft_s", *(c for _, c in PARTS), "rest_s")
)
_GOODPUT = ", ".join(
    [f"count(*) FILTER (verdict = '{v}')" for v in VERDICTS]  # our constants, no text from outside
    + ["coalesce(sum(completion_tokens) FILTER (verdict = 'met'), 0)", "min(a)", "max(e)"]
)
_BY_CLASS = f"""{_GROUPED}
SELECT model_name, class_name, {_PREFILL}, count(*) FILTER (split), {_SPLIT}, {_GOODPUT}
FROM g GROUP BY model_name, class_name ORDER BY model_name, class_name"""
_POOLED = f"{_GROUPED}\nSELECT {_PREFILL} FROM g"
_PREFILL_COLUMNS = 7  # the values _PREFILL selects
_SPLIT_COLUMNS = 1 + 2 * (len(PARTS) + 2)  # the split's count, then (mean, [p50, p95]) per part


class Reads(Protocol):
    """What the analysis reads through: a RequestStore, one snapshot of it, or passive.RowSource."""

    def query(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        """All rows of a parameterised query."""


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


@dataclass(frozen=True, slots=True)
class Spread:
    """One part of TTFT over the split's requests, in seconds (None: no request to measure)."""

    mean_s: float | None
    p50_s: float | None
    p95_s: float | None

    def to_dict(self) -> dict[str, float | None]:
        """{'mean_s': .., 'p50_s': .., 'p95_s': ..}."""
        return {"mean_s": self.mean_s, "p50_s": self.p50_s, "p95_s": self.p95_s}


@dataclass(frozen=True, slots=True)
class TtftSplit:
    """TTFT and its parts over `requests` streamed ok requests that carry every part."""

    requests: int
    ttft: Spread
    hop: Spread
    queue: Spread
    prefill: Spread
    rest: Spread

    def to_dict(self) -> dict[str, object]:
        """The requests and each part's spread, keyed by the part's name."""
        parts = {"ttft": self.ttft, "hop": self.hop, "queue": self.queue, "prefill": self.prefill}
        return {"requests": self.requests} | {
            k: v.to_dict() for k, v in (parts | {"rest": self.rest}).items()
        }


@dataclass(frozen=True, slots=True)
class PrefillRate:
    """The passive V_P and its evidence: sums, so that groups pool exactly (`pooled`)."""

    rows: int  # client traffic rows in the window
    timed_rows: int  # of them, the rows with the engine's timings
    requests: int  # the rows V_P is read from: prompt tokens computed and prefill seconds both told
    computed_tokens: int
    prefill_s: float
    cached_tokens: int

    @property
    def tokens_per_s(self) -> float | None:
        """V_P = Σ computed tokens / Σ prefill seconds; None without prefill time."""
        return _ratio(self.computed_tokens, self.prefill_s)

    @property
    def cache_hit_rate(self) -> float | None:
        """Σ cached / Σ (cached + computed) prompt tokens; None without a prompt token."""
        return _ratio(self.cached_tokens, self.cached_tokens + self.computed_tokens)

    @property
    def timed_share(self) -> float | None:
        """The share of the rows that carry the engine's timings."""
        return _ratio(self.timed_rows, self.rows)

    @classmethod
    def pooled(cls, parts: Iterable[PrefillRate]) -> PrefillRate:
        """The groups' evidence added up: V_P of the whole is Σ / Σ again, never a mean of rates."""
        found = list(parts)
        return cls(
            sum(p.rows for p in found),
            sum(p.timed_rows for p in found),
            sum(p.requests for p in found),
            sum(p.computed_tokens for p in found),
            sum(p.prefill_s for p in found),
            sum(p.cached_tokens for p in found),
        )

    def to_dict(self) -> dict[str, object]:
        """V_P, the cache hit rate and the evidence, for JSON."""
        return {
            "prefill_tokens_per_s": self.tokens_per_s,
            "cache_hit_rate": self.cache_hit_rate,
            "requests": self.requests,
            "computed_tokens": self.computed_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_s": self.prefill_s,
            "rows": self.rows,
            "timed_rows": self.timed_rows,
            "timed_share": self.timed_share,
        }


@dataclass(frozen=True, slots=True)
class Goodput:
    """The rows per verdict over a window of `window_s` seconds (collector.goodput)."""

    counts: Mapping[str, int]  # every one of VERDICTS, in its order
    unjudged: int  # rows without a verdict (written before goodput, or not judged)
    good_tokens: int  # completion tokens of the met rows
    window_s: float

    @property
    def attainment(self) -> float | None:
        """met / every verdict but invalid (a request the client got wrong is no capacity's fault)."""
        return _ratio(self.counts["met"], sum(n for v, n in self.counts.items() if v != "invalid"))

    @property
    def met_per_s(self) -> float | None:
        """Goodput: met requests per second of the window."""
        return _ratio(self.counts["met"], self.window_s)

    @property
    def good_tokens_per_s(self) -> float | None:
        """Token goodput: the met requests' completion tokens per second of the window."""
        return _ratio(self.good_tokens, self.window_s)

    def to_dict(self) -> dict[str, object]:
        """Goodput, attainment and the counts, for JSON."""
        return {
            "met_per_s": self.met_per_s,
            "good_tokens_per_s": self.good_tokens_per_s,
            "attainment": self.attainment,
            "verdicts": dict(self.counts),
            "unjudged": self.unjudged,
            "window_s": self.window_s,
        }


@dataclass(frozen=True, slots=True)
class EngineSplit:
    """One model and replica class: its V_P, cache hit rate, TTFT split and goodput."""

    model: str
    replica_class: str
    engines: tuple[str, ...]  # the timings' shapes its rows carry ('llamacpp', 'vllm')
    prefill: PrefillRate
    split: TtftSplit
    goodput: Goodput

    @property
    def no_timings(self) -> str | None:
        """Why there is no V_P, cache hit rate or split (NO_TIMINGS), or None when there is."""
        return NO_TIMINGS if self.prefill.timed_rows == 0 else None

    def to_dict(self) -> dict[str, object]:
        """The group for JSON (`headroom capacity split --json`, the review)."""
        return {
            "model": self.model,
            "replica_class": self.replica_class,
            "engines": list(self.engines),
            "prefill": self.prefill.to_dict(),
            "split": self.split.to_dict(),
            "goodput": self.goodput.to_dict(),
            "no_timings": self.no_timings,
        }


@dataclass(frozen=True, slots=True)
class EngineSplitReport:
    """Every group of the window [since, until) (None: the log's first row, its last)."""

    since: datetime | None
    until: datetime | None
    window_s: float  # until - since, or what the rows span where a bound is None
    groups: tuple[EngineSplit, ...]

    def to_dict(self) -> dict[str, object]:
        """The window and the groups, for JSON."""
        return {
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "window_s": self.window_s,
            "groups": [g.to_dict() for g in self.groups],
        }


def _params(
    since: datetime | None,
    until: datetime | None,
    model: str | None,
    task_class: str | None,
    replica_class: str | None,
) -> tuple[str, list[object]]:
    rows, params = rows_sql("traffic", since, until, model, task_class, column="admitted_at")
    default = DEFAULT_REPLICA_CLASS
    return rows, [*params, default, replica_class, default, replica_class]


def _prefill(values: Sequence[Any]) -> tuple[PrefillRate, tuple[str, ...]]:
    n, timed, rated, computed, prefill_s, cached, engines = values
    rate = PrefillRate(int(n), int(timed), int(rated), int(computed), float(prefill_s), int(cached))
    return rate, tuple(sorted(engines or ()))


def _spread(mean: float | None, quantiles: Sequence[float] | None) -> Spread:
    p50, p95 = quantiles or (None, None)
    return Spread(mean, p50, p95)


def _split(values: Sequence[Any]) -> TtftSplit:
    count, *pairs = values
    spreads = [_spread(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2)]
    return TtftSplit(int(count), *spreads)


def prefill_rate(
    store: Reads,
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    model: str | None = None,
    task_class: str | None = None,
    replica_class: str | None = None,
) -> PrefillRate:
    """The passive V_P of the traffic admitted in [since, until), every replica class pooled
    unless `replica_class` names one (the traffic estimate's evidence, passive_rate)."""
    rows, params = _params(since, until, model, task_class, replica_class)
    return _prefill(store.query(_POOLED.format(rows=rows), params)[0])[0]


def engine_split(
    store: Reads,
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    model: str | None = None,
    replica_class: str | None = None,
    task_class: str | None = None,
) -> EngineSplitReport:
    """V_P, cache hit rate, TTFT split and goodput per model and replica class of the client
    traffic admitted in [since, until) (module docstring); no group when there is no traffic."""
    rows, params = _params(since, until, model, task_class, replica_class)
    found = store.query(_BY_CLASS.format(rows=rows), params)
    first = min((row[-2] for row in found if row[-2] is not None), default=None)
    last = max((row[-1] for row in found if row[-1] is not None), default=None)
    start, end = seconds(since) or first, seconds(until) or last
    window_s = max(end - start, 0.0) if start is not None and end is not None else 0.0
    groups = []
    for row in found:
        at = 2 + _PREFILL_COLUMNS
        prefill, engines = _prefill(row[2:at])
        split = _split(row[at : at + _SPLIT_COLUMNS])
        counts = row[at + _SPLIT_COLUMNS : at + _SPLIT_COLUMNS + len(VERDICTS)]
        verdicts = dict(zip(VERDICTS, (int(n) for n in counts)))
        unjudged = prefill.rows - sum(verdicts.values())
        goodput = Goodput(verdicts, unjudged, int(row[-3]), window_s)
        groups.append(EngineSplit(str(row[0]), str(row[1]), engines, prefill, split, goodput))
    return EngineSplitReport(since, until, window_s, tuple(groups))
