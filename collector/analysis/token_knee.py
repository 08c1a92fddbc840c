"""Whether a probe's token knee means something for this traffic (docs/capacity.md, "Token capacity").

A closed-loop probe with one prompt length measures the request knee and, as a by-product, the
active tokens at that knee *for its own prompts*: "request knee x the probe's tokens per
request", not a token capacity (docs/domain.md §12). Traffic with longer prompts reaches that
number at half the request knee with the engine healthy, and every token-caliber alert and
autoscaler that divides by it then acts on an artefact. So the token caliber's capacity is defined
as **the active tokens at the request knee, measured with the traffic's own length mix, and never
more than the engine's KV cache holds**, and a probe's token knee is published only when:

1. the probe's mean tokens per request (prompt + completion of its answered requests) is within
   MAX_MIX_RATIO (2x) of the traffic's over the TRAFFIC_WINDOW (7 days) before the probe, from
   at least MIN_TRAFFIC_REQUESTS answered traffic requests. No traffic to compare with is no
   evidence either: the knee is withheld until the probe is re-run with `--workload from-log`
   or beside logged traffic;
2. the passive token curve of the same traffic does not contradict it by more than
   MAX_PASSIVE_RATIO (2x): a passive knee that was reached at medium confidence or better and
   differs by more, or a passive curve that stayed healthy (no knee reached) at more than twice
   the probe's token knee, withholds it;
3. it is capped at the engine's KV capacity (`headroom_engine_kv_cache_capacity_tokens`) where
   the engine publishes one: no more tokens can be active than the cache holds.

A withheld knee is exported nowhere (the estimate's flat `knee_tokens` is None) and the
estimate says why in `token_knee_withheld`; `token_check` keeps the numbers compared.

    check = check_token_knee(900, probe=TokenMix(40.0, 32.0, 300), traffic=TokenMix(600, 100, 5000),
                             kv_capacity_tokens=4096)
    check.knee_tokens -> None; check.withheld -> "the probe's mean tokens per request (72) is 9.7x ..."
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from collector.store.db import RequestStore

__all__ = [
    "TokenMix",
    "TokenCheck",
    "PassiveTokenKnee",
    "MAX_MIX_RATIO",
    "MAX_PASSIVE_RATIO",
    "MIN_TRAFFIC_REQUESTS",
    "TRAFFIC_WINDOW",
    "mix_of_rows",
    "traffic_mix",
    "mix_ratio",
    "passive_token_knee",
    "check_token_knee",
    "token_check_in_store",
]

MAX_MIX_RATIO = 2.0  # probe vs traffic mean tokens per request, either way
MAX_PASSIVE_RATIO = 2.0  # probe's token knee vs the passive token curve's, either way
MIN_TRAFFIC_REQUESTS = 50  # answered traffic requests before the traffic's mix is believed
TRAFFIC_WINDOW = timedelta(days=7)  # the traffic a probe is compared with: the week before it
_TRUSTED = ("medium", "high")  # passive confidences that can contradict a probe

_MIX_SQL = """SELECT count(*), avg(prompt_tokens), avg(completion_tokens) FROM requests
    WHERE source = 'traffic' AND outcome = 'ok' AND prompt_tokens IS NOT NULL
      AND completion_tokens IS NOT NULL AND admitted_at >= ? AND admitted_at < ?
      AND (? IS NULL OR model = ?)"""
_SAVED_TABLE = "SELECT count(*) FROM information_schema.tables WHERE table_name = 'capacity_estimates'"
_SAVED_TRAFFIC = """SELECT estimate_json FROM capacity_estimates
    WHERE source = 'traffic' AND created_at <= ? AND (? IS NULL OR model = ?)
      AND coalesce(task_class, 'all') = 'all'
    ORDER BY created_at DESC LIMIT 1"""


@dataclass(frozen=True)
class TokenMix:
    """Mean prompt and completion tokens of the answered requests of a workload, and how many."""

    mean_prompt_tokens: float
    mean_completion_tokens: float
    requests: int

    @property
    def mean_tokens(self) -> float:
        """Mean tokens per request, prompt + completion: what a request holds in the KV cache."""
        return self.mean_prompt_tokens + self.mean_completion_tokens

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON, with the mean tokens per request."""
        return {
            "mean_prompt_tokens": round(self.mean_prompt_tokens, 1),
            "mean_completion_tokens": round(self.mean_completion_tokens, 1),
            "mean_tokens": round(self.mean_tokens, 1),
            "requests": self.requests,
        }


@dataclass(frozen=True)
class PassiveTokenKnee:
    """The passive token curve's knee (in tokens), whether traffic crossed it, and its confidence."""

    tokens: int
    reached: bool
    confidence: str


@dataclass(frozen=True)
class TokenCheck:
    """The token knee as measured, as published (None when withheld), and the numbers compared."""

    measured_tokens: int | None
    knee_tokens: int | None
    withheld: str | None
    probe: TokenMix | None = None
    traffic: TokenMix | None = None
    kv_capacity_tokens: int | None = None
    passive: PassiveTokenKnee | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        """Probe vs traffic mean tokens per request (>= 1 either way); None without both."""
        return None if self.probe is None or self.traffic is None else mix_ratio(self.probe, self.traffic)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON (the estimate's `token_check`)."""
        ratio = self.ratio
        return {
            "measured_tokens": self.measured_tokens,
            "knee_tokens": self.knee_tokens,
            "withheld": self.withheld,
            "probe_mix": self.probe.to_dict() if self.probe else None,
            "traffic_mix": self.traffic.to_dict() if self.traffic else None,
            "mix_ratio": None if ratio is None else round(ratio, 3),
            "max_mix_ratio": MAX_MIX_RATIO,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "passive": asdict(self.passive) if self.passive else None,
            "notes": list(self.notes),
        }


def mix_of_rows(rows: Sequence[Mapping[str, Any]]) -> TokenMix | None:
    """The mix of the answered (`ok`) rows; None when none was answered."""
    ok = [r for r in rows if r.get("outcome") == "ok"]
    if not ok:
        return None
    prompt = sum(r.get("prompt_tokens") or 0 for r in ok) / len(ok)
    completion = sum(r.get("completion_tokens") or 0 for r in ok) / len(ok)
    return TokenMix(prompt, completion, len(ok))


def traffic_mix(store: RequestStore, model: str | None, since: datetime, until: datetime) -> TokenMix | None:
    """The mix of the answered traffic in [since, until) (one model, or all); None without any."""
    n, prompt, completion = store.query(_MIX_SQL, [since, until, model, model])[0]
    if not n:
        return None
    return TokenMix(float(prompt or 0.0), float(completion or 0.0), int(n))


def mix_ratio(a: TokenMix, b: TokenMix) -> float:
    """How far apart two mixes are in mean tokens per request: max(a/b, b/a); inf when one is 0."""
    low, high = sorted((a.mean_tokens, b.mean_tokens))
    return high / low if low > 0 else float("inf")


def _saved_token_curve(store: RequestStore, model: str | None, until: datetime) -> dict[str, Any] | None:
    if not store.query(_SAVED_TABLE)[0][0]:
        return None
    found = store.query(_SAVED_TRAFFIC, [until, model, model])
    if not found:
        return None
    curve = orjson.loads(found[0][0]).get("token_curve")
    return curve if isinstance(curve, dict) else None


def passive_token_knee(
    store: RequestStore,
    model: str | None,
    since: datetime,
    until: datetime,
    *,
    compute: bool = False,
) -> PassiveTokenKnee | None:
    """The passive token curve's knee for this traffic: from the newest saved traffic estimate
    (its `token_curve`, computed by the traffic refresh), or, with `compute`, computed now
    (collector.analysis.passive; the command line does, a serving sidecar never does in its own
    process). None when there is none."""
    curve = _saved_token_curve(store, model, until)
    if curve is None and compute:
        from collector.analysis.passive import passive_curve  # only the command line computes

        try:
            computed = passive_curve(store, "tokens", since, until, model)
        except ValueError:
            return None
        curve = computed.to_dict()
    knee = curve.get("knee") if curve is not None else None
    if curve is None or not isinstance(knee, dict) or not knee.get("requests"):
        return None
    return PassiveTokenKnee(int(knee["requests"]), bool(knee.get("reached")), str(curve.get("confidence")))


def _times(value: float) -> str:
    return f"{value:.1f}x"


def check_token_knee(
    measured_tokens: int | None,
    *,
    probe: TokenMix | None,
    traffic: TokenMix | None,
    kv_capacity_tokens: int | None = None,
    passive: PassiveTokenKnee | None = None,
) -> TokenCheck:
    """Decide whether the measured token knee is published, capped, or withheld (module docstring).

    `measured_tokens` is the mean active tokens at the request knee, None when the knee was not
    reached. Examples: 900 measured, probe 72 and traffic 700 tokens per request -> withheld
    (9.7x apart); 2800 measured, both ~700 per request, KV 2048 -> 2048 (capped).
    """
    notes: list[str] = []

    def result(knee: int | None, withheld: str | None) -> TokenCheck:
        return TokenCheck(measured_tokens, knee, withheld, probe, traffic, kv_capacity_tokens, passive, notes)

    if measured_tokens is None:
        return result(None, "the knee was not reached (a lower bound)")
    if probe is None:
        return result(None, "no request of the probe was answered")
    if traffic is None or traffic.requests < MIN_TRAFFIC_REQUESTS:
        seen = 0 if traffic is None else traffic.requests
        return result(
            None,
            f"no traffic to compare the probe's token mix with ({seen} answered traffic requests in "
            f"the {TRAFFIC_WINDOW.days} days before it, {MIN_TRAFFIC_REQUESTS} needed): the knee in "
            "tokens is the probe's prompts' artefact until measured with the traffic's lengths "
            "(--workload from-log)",
        )
    ratio = mix_ratio(probe, traffic)
    if ratio > MAX_MIX_RATIO:
        return result(
            None,
            f"the probe's mean tokens per request ({probe.mean_tokens:.0f}) is {_times(ratio)} away from "
            f"the traffic's ({traffic.mean_tokens:.0f}; more than {MAX_MIX_RATIO:g}x): its knee in "
            "tokens measures its own prompts, not this traffic; re-run with --workload from-log",
        )
    if passive is not None:
        apart = max(measured_tokens, passive.tokens) / max(min(measured_tokens, passive.tokens), 1)
        if passive.reached and passive.confidence in _TRUSTED and apart > MAX_PASSIVE_RATIO:
            return result(
                None,
                f"the passive token curve puts the knee at {passive.tokens} tokens "
                f"({passive.confidence} confidence), {_times(apart)} away from the probe's "
                f"{measured_tokens} (more than {MAX_PASSIVE_RATIO:g}x)",
            )
        if not passive.reached and passive.tokens > MAX_PASSIVE_RATIO * measured_tokens:
            return result(
                None,
                f"traffic ran without a knee up to {passive.tokens} active tokens, "
                f"{_times(passive.tokens / max(measured_tokens, 1))} the probe's token knee "
                f"({measured_tokens})",
            )
        notes.append(
            f"passive token curve: knee {passive.tokens} tokens "
            f"({'reached' if passive.reached else 'a lower bound'}, {passive.confidence} confidence)"
        )
    knee = measured_tokens
    if kv_capacity_tokens is not None and 0 < kv_capacity_tokens < knee:
        notes.append(f"capped at the engine's KV capacity ({kv_capacity_tokens} tokens; measured {knee})")
        knee = kv_capacity_tokens
    return result(knee, None)


def token_check_in_store(
    store: RequestStore | None,
    measured_tokens: int | None,
    probe: TokenMix | None,
    *,
    model: str | None,
    at: datetime,
    kv_capacity_tokens: int | None = None,
    compute_passive: bool = False,
) -> TokenCheck:
    """check_token_knee against the traffic of `store` in the TRAFFIC_WINDOW before `at`
    (no store: nothing to compare with, the knee is withheld)."""
    traffic = passive = None
    if store is not None:
        since = at - TRAFFIC_WINDOW
        traffic = traffic_mix(store, model, since, at)
        passive = passive_token_knee(store, model, since, at, compute=compute_passive)
    return check_token_knee(
        measured_tokens, probe=probe, traffic=traffic, kv_capacity_tokens=kv_capacity_tokens, passive=passive
    )
