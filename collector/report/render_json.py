"""The review as JSON: the build_report dict, keys sorted, for machines and diffing."""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["render_json"]


def render_json(report: dict[str, Any]) -> str:
    """Stable JSON text (sorted keys, two-space indent, trailing newline)."""
    return orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n"
