"""The tokenizer-free token estimate, one rule for the sidecar, the stream reader and the probe.

No tokenizer, by design: the sidecar must work for any model. "About four characters per token"
is OpenAI's published rule of thumb for English with BPE tokenizers. It rounds *down*, with at
least one token for any non-empty text: engines stream about one token per chunk, mostly of 1-7
characters, so rounding up would count two for most of them (on the llama.cpp capture in
tests/fixtures, floor gives 302 for a true 300, ceil 375). Prompts use the same rule
per text part. Every estimate is replaced by the upstream's `usage` when the engine sends one
(the row's usage_source says which).
"""

from __future__ import annotations

__all__ = ["CHARS_PER_TOKEN", "estimate_tokens", "tokens_for_characters"]

CHARS_PER_TOKEN = 4


def tokens_for_characters(characters: int) -> int:
    """Tokens in `characters` characters of text: 0 -> 0, 1..7 -> 1, 8 -> 2, 12 -> 3."""
    return max(1, characters // CHARS_PER_TOKEN) if characters > 0 else 0


def estimate_tokens(text: str) -> int:
    """Tokens in `text`, e.g. 'hello world!' -> 3; 'hi' -> 1; '' -> 0."""
    return tokens_for_characters(len(text))
