"""A probe workload of task classes: the file format and its loader.

Output length decides how long a request holds a slot, so a deployment serving short and long
answers has one knee per kind (docs/domain.md §2). `headroom probe --workload FILE` measures the
gradient once per class and reports a knee and pool for each; the capacity gauges then carry the
class (`task_class`), and the alerts compare each class's concurrency with its own knee.

    # workload.yaml
    classes:
      - name: short          # the task_class label: lowercase letters, digits, '-' or '_'
        max_tokens: 64       # output length (locked with ignore_eos unless --no-ignore-eos)
        prompts: short       # optional: short | long | mixed | a file (as --prompts)
      - name: long
        max_tokens: 512

Prompt-length classes sit beside the output-length ones: an `inputs:` list measures every class
once per input class, with a filler prompt of exactly `prompt_tokens` tokens (scaled to the
engine's tokenizer by what it reports in `usage`, as from-log does), as class `<class>-<input>`.
Prompt length decides how much prefill a request costs, so the open-loop probe (`--rates`) then
gives one μ_slo and V_P per input class:

    classes:
      - name: chat
        max_tokens: 64
    inputs:                  # optional: prompt-length classes (then no class sets `prompts`)
      - name: short          # -> task_class chat-short
        prompt_tokens: 100
      - name: long           # -> task_class chat-long
        prompt_tokens: 1000

`--workload classes` uses the default classes of collector.tasks (short 128, medium 512 and
long 1200 output tokens).

`--workload from-log` measures one gradient with the traffic's own lengths: `log_lengths` draws
up to MAX_LOG_SAMPLES (prompt tokens, completion tokens) pairs of answered traffic requests from
the request log (the LOG_WINDOW before now, one model or all, a seeded sample), and each probe
request takes one pair at random: a filler prompt of that many tokens and that many output tokens
(locked with ignore_eos). Its request knee is then the traffic's, as its token capacity always is
(collector.analysis.token_knee).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import yaml

from collector.store.db import RequestStore

__all__ = [
    "WorkloadClass",
    "load_workload",
    "DEFAULT_WORKLOAD",
    "FROM_LOG",
    "LogLengths",
    "log_lengths",
    "MAX_LOG_SAMPLES",
    "MIN_LOG_REQUESTS",
    "LOG_WINDOW",
]

FROM_LOG = "from-log"
MAX_LOG_SAMPLES = 5000  # pairs drawn from the log: enough for a mean within a few percent
MIN_LOG_REQUESTS = 50  # fewer answered traffic requests are no mix to measure
LOG_WINDOW = timedelta(days=7)

_LENGTHS_SQL = """SELECT prompt_tokens, completion_tokens FROM requests
    WHERE source = 'traffic' AND outcome = 'ok' AND prompt_tokens > 0 AND completion_tokens > 0
      AND admitted_at >= ? AND admitted_at < ? AND (? IS NULL OR model = ?)
    ORDER BY hash(request_id, ?) LIMIT ?"""

_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


@dataclass(frozen=True)
class WorkloadClass:
    """One class of the workload: its name, output length and prompt set (or, for a class crossed
    with an input class, its fixed prompt length)."""

    name: str
    max_tokens: int
    prompts: str = "short"
    prompt_tokens: int | None = None  # a filler prompt of this many tokens instead of `prompts`


DEFAULT_WORKLOAD = (WorkloadClass("short", 128), WorkloadClass("medium", 512), WorkloadClass("long", 1200))


def _class(entry: object, index: int, where: str) -> WorkloadClass:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: classes[{index}] is not a mapping with name and max_tokens")
    unknown = set(entry) - {"name", "max_tokens", "prompts"}
    if unknown:
        raise ValueError(
            f"{where}: classes[{index}] has unknown keys {sorted(unknown)}; use name, max_tokens, prompts"
        )
    name, max_tokens = entry.get("name"), entry.get("max_tokens")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"{where}: classes[{index}].name {name!r} must be lowercase letters, "
            "digits, '-' or '_' (it becomes the task_class label)"
        )
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"{where}: classes[{index}].max_tokens {max_tokens!r} must be a positive integer")
    prompts = entry.get("prompts", "short")
    if not isinstance(prompts, str):
        raise ValueError(f"{where}: classes[{index}].prompts must be short, long, mixed or a file")
    return WorkloadClass(name, max_tokens, prompts)


def _crossed(
    classes: tuple[WorkloadClass, ...], entries: list[object], inputs: object, where: str
) -> tuple[WorkloadClass, ...]:
    """Each class once per input class (`inputs:`, module docstring)."""
    if not isinstance(inputs, list) or not inputs:
        raise ValueError(f"{where}: inputs must be a list of {{name, prompt_tokens}}")
    if any(isinstance(entry, dict) and "prompts" in entry for entry in entries):
        raise ValueError(f"{where}: with inputs, the prompt is the input class's: drop the classes' prompts")
    crossed = []
    for index, entry in enumerate(inputs):
        if not isinstance(entry, dict) or set(entry) != {"name", "prompt_tokens"}:
            raise ValueError(f"{where}: inputs[{index}] must be a mapping of exactly name and prompt_tokens")
        name, tokens = entry["name"], entry["prompt_tokens"]
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"{where}: inputs[{index}].name {name!r} must be lowercase letters, digits, '-' or '_'"
            )
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise ValueError(f"{where}: inputs[{index}].prompt_tokens {tokens!r} must be a positive integer")
        for task in classes:
            label = f"{task.name}-{name}"
            if not _NAME.fullmatch(label):
                raise ValueError(f"{where}: class {label!r} is longer than 32 characters; shorten the names")
            crossed.append(WorkloadClass(label, task.max_tokens, prompt_tokens=tokens))
    return tuple(crossed)


def load_workload(spec: str) -> tuple[WorkloadClass, ...]:
    """The classes of `spec`: 'classes' (the defaults) or a YAML file; ValueError naming the fault."""
    if spec == "classes":
        return DEFAULT_WORKLOAD
    path = Path(spec)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--workload {spec}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"--workload {spec}: not YAML ({exc})") from None
    entries = data.get("classes") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(
            f"--workload {spec}: expected a 'classes:' list (format in "
            "docs/capacity.md, 'Capacity per task type')"
        )
    classes = tuple(_class(entry, i, f"--workload {spec}") for i, entry in enumerate(entries))
    inputs = data.get("inputs")
    if inputs is not None:
        classes = _crossed(classes, entries, inputs, f"--workload {spec}")
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise ValueError(f"--workload {spec}: class names repeat: {names}")
    return classes


@dataclass(frozen=True)
class LogLengths:
    """(prompt tokens, completion tokens) pairs drawn from the request log, and their mix."""

    pairs: tuple[tuple[int, int], ...]
    since: datetime
    until: datetime
    model: str | None

    @property
    def mean_prompt_tokens(self) -> float:
        """The sample's mean prompt tokens."""
        return sum(p for p, _ in self.pairs) / len(self.pairs)

    @property
    def mean_completion_tokens(self) -> float:
        """The sample's mean completion tokens."""
        return sum(c for _, c in self.pairs) / len(self.pairs)


def log_lengths(
    store: RequestStore,
    *,
    model: str | None,
    until: datetime,
    window: timedelta = LOG_WINDOW,
    seed: int = 0,
    limit: int = MAX_LOG_SAMPLES,
) -> LogLengths:
    """A seeded sample of the answered traffic's lengths in [until - window, until).

    Raises ValueError naming the window and the model when fewer than MIN_LOG_REQUESTS are there.
    """
    since = until - window
    rows = store.query(_LENGTHS_SQL, [since, until, model, model, seed, limit])
    if len(rows) < MIN_LOG_REQUESTS:
        which = f" of model {model!r}" if model else ""
        raise ValueError(
            f"--workload {FROM_LOG}: the request log has {len(rows)} answered traffic requests{which} "
            f"between {since:%Y-%m-%d %H:%M} and {until:%Y-%m-%d %H:%M} UTC ({MIN_LOG_REQUESTS} "
            "needed); send traffic through the sidecar first, or pass --model or a --workload file"
        )
    return LogLengths(tuple((int(p), int(c)) for p, c in rows), since, until, model)
