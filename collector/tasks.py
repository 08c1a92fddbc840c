"""Task classes: what kind of work a request is, by how long its answer may be (docs/domain.md §2).

Output length decides how long a request holds a slot, so pools differ by task type: short
classification or extraction (< 200 output tokens) runs at higher concurrency than long
generation (> 1000). A request's class is read from the output budget its client declared
(`max_tokens` / `max_completion_tokens`); a finished request that declared none is classed by
what it generated, and a live one is `unspecified` until then.

    classify(64)                 -> "short"
    classify(None)               -> "unspecified"
    classify_finished(None, 480) -> "medium"

The request log stores the class of every row (`task_class`), the sidecar exports in-flight
requests and active tokens per class, the probe measures a workload of classes, and each class
gets its own knee and pool where one was measured (`task_class="all"` is every request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["TaskClass", "DEFAULT_CLASSES", "ALL", "UNSPECIFIED", "classify", "classify_finished"]

ALL = "all"                  # an estimate over every request, whatever its class
UNSPECIFIED = "unspecified"  # a live request that declared no output budget


@dataclass(frozen=True)
class TaskClass:
    """A named class: requests whose output budget is at most `max_output_tokens` (None: any)."""

    name: str
    max_output_tokens: int | None


DEFAULT_CLASSES: tuple[TaskClass, ...] = (
    TaskClass("short", 199), TaskClass("medium", 1000), TaskClass("long", None))


def classify(max_tokens: int | None, classes: Sequence[TaskClass] = DEFAULT_CLASSES) -> str:
    """The class of a request that declared `max_tokens` (None: unspecified)."""
    if max_tokens is None:
        return UNSPECIFIED
    for task in classes:
        if task.max_output_tokens is None or max_tokens <= task.max_output_tokens:
            return task.name
    return classes[-1].name


def classify_finished(max_tokens: int | None, completion_tokens: int | None,
                      classes: Sequence[TaskClass] = DEFAULT_CLASSES) -> str:
    """The class of a finished request: its declared budget, else what it generated."""
    if max_tokens is not None:
        return classify(max_tokens, classes)
    return classify(completion_tokens, classes) if completion_tokens is not None else UNSPECIFIED
