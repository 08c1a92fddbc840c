"""Goodput: each finished request judged against the SLO that applied to it (docs/capacity.md §Goodput).

Goodput is the requests per second that completed and met every SLO that applies to them
(DistServe); token goodput their generated tokens per second; attainment the met share. Everything
that did not meet the SLO counts against it, whatever the reason: a latency miss, a request shed
(429, 503), one the client aborted, an upstream error or timeout. Otherwise shedding load would
*raise* goodput (arXiv 2410.14257). Only a request the client got wrong (400, 404, ...) is left
out, as `invalid`: no capacity could have served it.

The SLO of a request is the sidecar's (`--goodput-slo` and its overrides), tightened by the
request's own headers (`x-llm-d-slo-ttft-ms`, `x-llm-d-slo-tpot-ms`, or the older `x-slo-ttft-ms`,
`x-slo-tpot-ms`): a header can only narrow a configured bound unless `--goodput-headers trust`,
and a malformed or out-of-range one is ignored. The bounds that applied are stored on the row
(slo_ttft_s, slo_tpot_s, slo_e2e_s) beside its verdict, so goodput recomputed from the request log
equals the exported counters exactly (`verdict()` is the one rule both use).

    >>> slo = RequestSlo(ttft_s=2.0, tpot_s=0.1)
    >>> verdict("ok", True, ttft_s=0.4, tpot_s=0.02, e2e_s=3.0, slo=slo)
    'met'
    >>> verdict("ok", True, ttft_s=2.5, tpot_s=0.02, e2e_s=3.0, slo=slo)
    'missed'
    >>> verdict("overloaded", True, ttft_s=None, tpot_s=None, e2e_s=0.01, slo=slo)
    'shed'
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "HeaderMode",
    "RequestSlo",
    "PRESETS",
    "VERDICTS",
    "HEADER_MODES",
    "SLO_HEADERS",
    "MAX_HEADER_MS",
    "verdict",
    "request_slo",
    "slo_header_values",
]

# verdicts, in the order dashboards stack them; attainment = met / (everything but invalid)
VERDICTS = ("met", "missed", "shed", "aborted", "error", "invalid")
_BY_OUTCOME = {
    "rate_limited": "shed",
    "overloaded": "shed",
    "client_cancelled": "aborted",
    "upstream_error": "error",
    "timeout": "error",
    "bad_request": "invalid",
}
HeaderMode = Literal["tighten", "trust", "ignore"]
HEADER_MODES: tuple[HeaderMode, ...] = ("tighten", "trust", "ignore")
# (ttft header, tpot header), the newer spelling first: it wins when a client sends both
SLO_HEADERS = (
    (b"x-llm-d-slo-ttft-ms", b"x-llm-d-slo-tpot-ms"),
    (b"x-slo-ttft-ms", b"x-slo-tpot-ms"),
)
MAX_HEADER_MS = 3_600_000.0  # an hour: past it a header is not an SLO, and it is ignored


@dataclass(frozen=True, slots=True)
class RequestSlo:
    """Bounds one request must meet; None leaves that bound out. TTFT and TPOT judge streamed
    requests; e2e judges every request (a non-streamed one has no TTFT a client sees)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"SLO bound {name}={value} must be a positive number of seconds")


# Named SLOs. `default` is the generated rules' defaults (collector.rules.config: TTFT 2 s, TPOT
# 100 ms, e2e 60 s). The MLPerf ones are its Server scenario's per-request bounds
# (mlcommons/inference loadgen/mlperf.conf: llama3.1-8b 2,000 / 100 ms, its interactive 500 / 30;
# llama2-70b 2,000 / 200, interactive 450 / 40), which MLPerf holds at p99 over >= 600 s.
PRESETS: dict[str, RequestSlo] = {
    "default": RequestSlo(ttft_s=2.0, tpot_s=0.1, e2e_s=60.0),
    "mlperf-server": RequestSlo(ttft_s=2.0, tpot_s=0.1),
    "mlperf-interactive": RequestSlo(ttft_s=0.5, tpot_s=0.03),
    "mlperf-70b-server": RequestSlo(ttft_s=2.0, tpot_s=0.2),
    "mlperf-70b-interactive": RequestSlo(ttft_s=0.45, tpot_s=0.04),
    "none": RequestSlo(),
}


def verdict(
    outcome: str,
    stream: bool | None,
    *,
    ttft_s: float | None,
    tpot_s: float | None,
    e2e_s: float | None,
    slo: RequestSlo,
) -> str:
    """One of VERDICTS for a finished request. An `ok` request meets its SLO when every bound that
    applies holds: TTFT (streamed, when measured), TPOT (when measured: more than one token) and
    e2e; a streamed `ok` answer without a first token misses a TTFT bound."""
    if outcome != "ok":
        return _BY_OUTCOME.get(outcome, "error")
    if slo.ttft_s is not None and stream:
        if ttft_s is None or ttft_s > slo.ttft_s:
            return "missed"
    if slo.tpot_s is not None and tpot_s is not None and tpot_s > slo.tpot_s:
        return "missed"
    if slo.e2e_s is not None and e2e_s is not None and e2e_s > slo.e2e_s:
        return "missed"
    return "met"


def _milliseconds(value: bytes | None) -> float | None:
    """A header's positive, finite number of milliseconds up to MAX_HEADER_MS, in seconds; else None."""
    if value is None or len(value) > 32:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    if not (math.isfinite(number) and 0 < number <= MAX_HEADER_MS):
        return None
    return number / 1000


def _narrowed(configured: float | None, asked: float | None, mode: HeaderMode) -> float | None:
    if asked is None or mode == "ignore":
        return configured
    if configured is None or mode == "trust":
        return asked
    return min(configured, asked)


def request_slo(
    configured: RequestSlo, ttft_header: bytes | None, tpot_header: bytes | None, mode: HeaderMode
) -> tuple[RequestSlo, bool]:
    """(the SLO this request is judged by, whether a header it sent was malformed and ignored).

    >>> request_slo(RequestSlo(2.0, 0.1), b"500", b"junk", "tighten")
    (RequestSlo(ttft_s=0.5, tpot_s=0.1, e2e_s=None), True)
    >>> request_slo(RequestSlo(2.0, 0.1), b"5000", None, "tighten")[0].ttft_s  # never widened
    2.0
    """
    if ttft_header is None and tpot_header is None:
        return configured, False
    ttft, tpot = _milliseconds(ttft_header), _milliseconds(tpot_header)
    malformed = (ttft_header is not None and ttft is None) or (tpot_header is not None and tpot is None)
    slo = RequestSlo(
        _narrowed(configured.ttft_s, ttft, mode), _narrowed(configured.tpot_s, tpot, mode), configured.e2e_s
    )
    return slo, malformed and mode != "ignore"


def slo_header_values(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes | None, bytes | None]:
    """(TTFT, TPOT) SLO header values of a request (ASGI headers: lower-case names), in one pass;
    the llm-d spelling wins over the older one when a client sends both.

    >>> slo_header_values([(b"x-slo-ttft-ms", b"900"), (b"x-llm-d-slo-ttft-ms", b"500")])
    (b'500', None)
    """
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        if name.startswith(b"x-") and b"slo-" in name:  # one cheap test per header
            found.setdefault(name, value)
    if not found:
        return None, None
    ttft = found.get(SLO_HEADERS[0][0], found.get(SLO_HEADERS[1][0]))
    tpot = found.get(SLO_HEADERS[0][1], found.get(SLO_HEADERS[1][1]))
    return ttft, tpot
