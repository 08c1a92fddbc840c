"""The probe's prompt sets: short, long, mixed (seeded 4:1 short:long), or one prompt per line
of a file; and `prompt_of_tokens(n)`, a filler prompt of about n tokens, for a workload whose
lengths come from the request log (collector.analysis.workload). Only the text is sent; it is
never stored (the request log keeps token counts only).
"""

from __future__ import annotations

import random
from pathlib import Path

__all__ = ["load_prompts", "PromptPicker", "PROMPT_SETS", "prompt_of_tokens"]

PROMPT_SETS = ("short", "long", "mixed")

_SHORT = (
    "Say hello in one short sentence.",
    "Name a prime number larger than ten.",
    "What colour is a clear sky at noon?",
    "Give one synonym for the word quick.",
    "Count from one to five.",
)
_TOPICS = (
    "capacity planning",
    "queueing theory",
    "GPU memory",
    "batch scheduling",
    "latency budgets",
    "token quotas",
    "prefix caching",
    "load testing",
)


def _long_prompt(index: int, words: int = 900) -> str:
    """About `words` words (~1 200 tokens) of plain filler about one topic."""
    topic = _TOPICS[index % len(_TOPICS)]
    sentence = f"This paragraph number {index} discusses {topic} in careful technical detail. "
    text = sentence * (words // len(sentence.split()) + 1)
    return text + "Summarise the text above in three sentences."


def prompt_of_tokens(tokens: int, index: int = 0, chars_per_token: float = 4.0) -> str:
    """Filler text of about `tokens` tokens at `chars_per_token` (collector.tokens' 4 by default).

    The probe scales `chars_per_token` by what the engine reports in `usage`, so the prompts it
    sends reach the lengths asked for on any tokenizer. Example: prompt_of_tokens(3) ->
    'This paragra' (12 characters, 3 tokens at 4 characters each).
    """
    if tokens < 1:
        raise ValueError(f"a prompt needs at least one token, got {tokens}")
    chars = max(1, round(tokens * chars_per_token))
    return _long_prompt(index, words=chars // 4 + 20)[:chars]


def load_prompts(spec: str) -> list[str]:
    """Prompts for `spec`: short|long|mixed, or a path to a file with one prompt per line."""
    if spec == "short":
        return list(_SHORT)
    if spec == "long":
        return [_long_prompt(i) for i in range(4)]
    if spec == "mixed":
        return list(_SHORT) * 4 + [_long_prompt(i) for i in range(5)]  # 20 short : 5 long
    path = Path(spec)
    if not path.is_file():
        raise ValueError(
            f"--prompts {spec!r} is neither short, long, mixed nor a readable file; "
            "pass one of those or a file with one prompt per line"
        )
    prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"prompt file {spec} has no non-empty lines; put one prompt per line")
    return prompts


class PromptPicker:
    """Seeded, shuffled round-robin over a prompt list, so every run sends the same sequence."""

    def __init__(self, prompts: list[str], seed: int = 0) -> None:
        if not prompts:
            raise ValueError("no prompts to send")
        self._prompts = list(prompts)
        random.Random(seed).shuffle(self._prompts)
        self._next = 0

    def next(self) -> str:
        """The next prompt of the sequence."""
        prompt = self._prompts[self._next % len(self._prompts)]
        self._next += 1
        return prompt
