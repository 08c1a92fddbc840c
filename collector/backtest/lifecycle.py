"""Lifecycle: one request as the backtest sees it, from the simulator or from a request log.

(collector.record.RequestRecord is the sidecar's row, with datetimes; this is its replay form.)

Times are POSIX seconds. It holds exactly what the sidecar's series are rebuilt from (both
calibers from the admit/first-token/complete times and the token counts, the histograms from the
latencies), and converts to and from a request-log row (docs/design.md §4.5):

    record.ttft_s  -> first_token - admitted, or None (non-streamed, or no token)
    record.to_row() -> {"request_id": ..., "admitted_at": datetime(...), "ttft_s": 0.31, ...}
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from collector.tasks import UNSPECIFIED, classify_finished

__all__ = ["Lifecycle"]


@dataclass(slots=True)
class Lifecycle:
    """A request's lifecycle in POSIX seconds; `completed` is None while it is still in flight."""

    request_id: str
    instance: str
    model: str
    tenant: str
    stream: bool
    admitted: float
    prompt_tokens: int
    target_tokens: int = 0  # the output length it will reach (simulator only)
    first_token: float | None = None
    completed: float | None = None
    completion_tokens: int = 0
    outcome: str | None = None
    status_code: int | None = None
    inflight_at_admit: int = 0
    active_tokens_at_admit: int = 0
    engine_waiting_at_admit: int | None = None
    kv_usage_at_admit: float | None = None
    task_class: str = UNSPECIFIED  # collector.tasks: by the declared output budget
    cluster: str = ""  # the replica's cluster label (simulator only; "" : none)
    adapter: str | None = None  # the LoRA adapter it named (`model` is its base model); None: none

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.admitted

    @property
    def e2e_s(self) -> float | None:
        return None if self.completed is None else self.completed - self.admitted

    @property
    def tpot_s(self) -> float | None:
        """(e2e - TTFT) / (completion tokens - 1), only above one token (the tracker's rule)."""
        ttft, e2e = self.ttft_s, self.e2e_s
        if ttft is None or e2e is None or self.completion_tokens <= 1:
            return None
        return (e2e - ttft) / (self.completion_tokens - 1)

    def to_row(self) -> dict[str, Any]:
        """The request-log row of a finished request (what the sidecar would have written)."""
        if self.completed is None:
            raise ValueError(
                f"request {self.request_id} is still in flight; only finished requests have a row"
            )
        return {
            "request_id": self.request_id,
            "source": "traffic",
            "run_id": None,
            "instance": self.instance,
            "model": self.model,
            "tenant": self.tenant,
            "endpoint": "/v1/chat/completions",
            "stream": self.stream,
            "admitted_at": _datetime(self.admitted),
            "first_byte_at": _datetime(self.first_token if self.first_token is not None else self.completed),
            "first_token_at": _datetime(self.first_token),
            "completed_at": _datetime(self.completed),
            "status_code": self.status_code,
            "outcome": self.outcome,
            "error": None,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": None,
            "completion_tokens": self.completion_tokens,
            "max_tokens": self.target_tokens or None,
            "usage_source": "upstream",
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "e2e_s": self.e2e_s,
            "inflight_at_admit": self.inflight_at_admit,
            "active_tokens_at_admit": self.active_tokens_at_admit,
            "engine_waiting_at_admit": self.engine_waiting_at_admit,
            "kv_usage_at_admit": self.kv_usage_at_admit,
            "upstream_retries": 0,
            "task_class": self.task_class,
            "adapter": self.adapter,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Lifecycle:
        """A record from a request-log row (datetimes or POSIX seconds); in flight when completed_at is NULL."""
        return cls(
            request_id=str(row["request_id"]),
            instance=row.get("instance") or "unknown",
            model=row.get("model") or "unknown",
            tenant=row.get("tenant") or "anonymous",
            stream=bool(row.get("stream")),
            admitted=_required_seconds(row["admitted_at"]),
            prompt_tokens=int(row.get("prompt_tokens") or 0),
            first_token=_seconds(row.get("first_token_at")),
            completed=_seconds(row.get("completed_at")),
            completion_tokens=int(row.get("completion_tokens") or 0),
            outcome=row.get("outcome"),
            status_code=row.get("status_code"),
            task_class=row.get("task_class")
            or classify_finished(row.get("max_tokens"), row.get("completion_tokens")),
            adapter=row.get("adapter"),
        )


def _datetime(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def _required_seconds(value: Any) -> float:
    seconds = _seconds(value)
    if seconds is None:
        raise ValueError("a request-log row without admitted_at cannot be replayed")
    return seconds


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):  # ISO-8601, as the store's query API sends times
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    return float(value)
