"""Deterministic synthetic request-log rows: for tests, the docs' examples and local trials.

Rows follow the request-log contract (collector.store.schema) and are plausible: TTFT grows with
the in-flight count, a few requests are rate-limited or fail, tenants are skewed.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

__all__ = ["synthetic_rows", "synthetic_probe_run"]

_OUTCOMES = (("ok", 200), ("ok", 200), ("ok", 200), ("ok", 200), ("ok", 200), ("ok", 200),
             ("ok", 200), ("ok", 200), ("rate_limited", 429), ("upstream_error", 502))


def _row(rng: random.Random, index: int, admitted: datetime, model: str, prefix: str,
         ttft_scale: float) -> dict[str, Any]:
    inflight = rng.choice((1, 2, 3, 4, 6, 8, 12, 16))
    prompt, completion = rng.randint(20, 2000), rng.randint(2, 400)
    ttft = ttft_scale * (0.05 + 0.02 * inflight) * (0.5 + rng.random())
    tpot = 0.01 + 0.002 * inflight * rng.random()
    e2e = ttft + tpot * (completion - 1)
    outcome, status = _OUTCOMES[rng.randrange(len(_OUTCOMES))]
    ok = outcome == "ok"
    return {
        "request_id": f"{prefix}-{index:08d}", "source": "traffic", "run_id": None,
        "instance": f"sidecar-{index % 3}", "model": model,
        "tenant": rng.choice(("team-a", "team-a", "team-a", "team-b", "team-b", "team-c")),
        "endpoint": "/v1/chat/completions", "stream": True,
        "admitted_at": admitted, "first_byte_at": admitted + timedelta(seconds=ttft * 0.9),
        "first_token_at": admitted + timedelta(seconds=ttft) if ok else None,
        "completed_at": admitted + timedelta(seconds=e2e if ok else ttft),
        "status_code": status, "outcome": outcome, "error": None if ok else outcome,
        "prompt_tokens": prompt, "cached_prompt_tokens": prompt // 4,
        "completion_tokens": completion if ok else 0, "max_tokens": 512, "usage_source": "upstream",
        "ttft_s": ttft if ok else None, "tpot_s": tpot if ok else None, "e2e_s": e2e if ok else ttft,
        "inflight_at_admit": inflight, "active_tokens_at_admit": inflight * (prompt + completion // 2),
        "engine_waiting_at_admit": max(0, inflight - 8), "kv_usage_at_admit": min(1.0, inflight / 16),
    }


def synthetic_rows(n: int, start: datetime, *, span: timedelta = timedelta(hours=1),
                   models: tuple[str, ...] = ("model-a",), seed: int = 7, prefix: str = "req",
                   ttft_scale: float = 1.0) -> list[dict[str, Any]]:
    """`n` rows admitted evenly over [start, start + span), models in turn; same seed, same rows.

    Example: synthetic_rows(2, t0, models=("a", "b")) -> rows req-00000000 (model a) and req-00000001 (b).
    """
    rng = random.Random(seed)
    step = span / max(n, 1)
    return [_row(rng, i, start + step * i, models[i % len(models)], prefix, ttft_scale) for i in range(n)]


def synthetic_probe_run(start: datetime, *, model: str = "model-a", run_id: str = "run-1",
                        knee: int = 8, levels: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
                        rounds: int = 8) -> list[dict[str, Any]]:
    """A closed-loop probe whose throughput stops rising at concurrency `knee` (source='probe').

    Each level runs `rounds` rounds of c requests of 200 + 100 tokens; a request takes 1 s up to
    the knee and c/knee s above it, so tokens/s plateaus there and TTFT stretches.
    """
    rows, level_start = [], start
    for c in levels:
        duration = 1.0 if c <= knee else c / knee
        ttft = 0.1 * max(1.0, c / knee)
        for r in range(rounds):
            for i in range(c):
                admitted = level_start + timedelta(seconds=r * duration + i * 1e-3)
                rows.append({
                    "request_id": f"probe-{run_id}-c{c}-{r * c + i}", "source": "probe", "run_id": run_id,
                    "model": model, "tenant": "probe", "admitted_at": admitted,
                    "first_token_at": admitted + timedelta(seconds=ttft),
                    "completed_at": admitted + timedelta(seconds=duration), "status_code": 200,
                    "outcome": "ok", "prompt_tokens": 200, "completion_tokens": 100, "ttft_s": ttft,
                    "tpot_s": (duration - ttft) / 99, "e2e_s": duration, "inflight_at_admit": c,
                    "active_tokens_at_admit": c * 250})
        level_start += timedelta(seconds=rounds * duration + 1)
    return rows
