"""What the simulator 'generates': prompt token counts and seeded, deterministic outputs.

No tokenizer: a prompt's token count is ceil(characters / 4) per message (OpenAI's rule of thumb
for English) plus 3 tokens of chat template per message; a completion prompt has no template.
An output is a sequence of words drawn from a fixed vocabulary, one word per token, by a
generator seeded with (--seed, prompt text, the request's own `seed`): the same seed and settings
give the same token counts and text, whatever the arrival order.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["count_text_tokens", "count_chat_tokens", "plan_output", "OutputPlan", "CHAT_TEMPLATE_TOKENS"]

CHAT_TEMPLATE_TOKENS = 3
_VOCAB = tuple(
    f" {w}"
    for w in (
        "the capacity of a serving engine is the largest concurrency that meets its latency target "
        "while tokens flow through prefill and decode steps and the cache holds every active sequence "
        "so queues stay short and throughput keeps rising until the batch is full"
    ).split()
)


def count_text_tokens(text: str) -> int:
    """Tokens of a text: ceil(len / 4), at least 1. Example: 'hello world' (11 chars) -> 3."""
    return max(1, math.ceil(len(text) / 4))


def count_chat_tokens(messages: Sequence[Mapping[str, object]]) -> int:
    """Tokens of a chat: per message, its text tokens plus CHAT_TEMPLATE_TOKENS."""
    return sum(count_text_tokens(message_text(m)) + CHAT_TEMPLATE_TOKENS for m in messages)


def message_text(message: Mapping[str, object]) -> str:
    """Text of one chat message; content may be a string or a list of {type: text} parts."""
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


@dataclass(frozen=True)
class OutputPlan:
    """The tokens a request will stream and why it stops ('length' or 'stop')."""

    tokens: tuple[str, ...]
    finish_reason: str


def _rng(seed: int, prompt_text: str, request_seed: int | None) -> random.Random:
    digest = hashlib.sha256(f"{seed}\x00{request_seed}\x00{prompt_text}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def plan_output(
    seed: int,
    prompt_text: str,
    request_seed: int | None,
    max_tokens: int,
    ignore_eos: bool,
    mean_output_tokens: int,
    stop: tuple[str, ...] = (),
) -> OutputPlan:
    """Seeded output: max_tokens with ignore_eos, else 1 + Exp(mean) capped; cut at a stop string."""
    rng = _rng(seed, prompt_text, request_seed)
    eos_length = 1 + int(rng.expovariate(1.0 / mean_output_tokens))
    length = max_tokens if ignore_eos else min(max_tokens, eos_length)
    reason = "length" if length == max_tokens else "stop"
    tokens = tuple(rng.choice(_VOCAB) for _ in range(length))
    if stop:
        tokens, cut = _cut_at_stop(tokens, stop)
        reason = "stop" if cut else reason
    return OutputPlan(tokens, reason)


def _cut_at_stop(tokens: tuple[str, ...], stop: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """Truncate before the first stop string (excluded from the output, as OpenAI does)."""
    text = "".join(tokens)
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    if not hits:
        return tokens, False
    cut, kept, offset = min(hits), [], 0
    for token in tokens:
        if offset >= cut:
            break
        kept.append(token[: cut - offset])
        offset += len(token)
    return tuple(kept), True
