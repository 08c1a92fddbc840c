"""Keep the cluster label through every aggregation and join, as `mimirtool rules prepare` does.

A fleet's rules are evaluated centrally (agent-mode Prometheus, Alloy, Thanos, Mimir,
VictoriaMetrics) over every cluster's series at once: `sum by (model)` over two clusters' pods
gives one series of 5 + 7. Every `by (...)` and `on (...)` therefore names the cluster label, and
an aggregation without `by` gets one; `ignoring (...)` and `without (...)` already keep it. Where
the series carry no cluster label (one Prometheus per cluster, rules at the edge), the label is
empty and the results are exactly today's.

    keep_cluster('sum by (model) (x) / on (model) group_left () y', "cluster")
        -> 'sum by (cluster, model) (x) / on (cluster, model) group_left () y'
    keep_cluster("count(up)", "cluster")  -> "count by (cluster) (up)"
    keep_cluster("sum by (model) (x)", "")  -> "sum by (model) (x)"  (one cluster: unchanged)
"""

from __future__ import annotations

import re

__all__ = ["keep_cluster", "label_lists"]

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_CLAUSE = re.compile(r"\b(by|on)(\s*)\(([^)]*)\)")
_BARE_AGGREGATION = re.compile(
    r"\b(sum|count|max|min|avg|group|stddev|stdvar|quantile|topk|bottomk|count_values)(\s*)\("
)


def _with_label(match: re.Match[str], label: str) -> str:
    keyword, space, inner = match.groups()
    names = [name.strip() for name in inner.split(",") if name.strip()]
    if label in names:
        return match.group(0)
    return f"{keyword}{space}({', '.join([label, *names])})"


def _code(text: str, label: str, bare: bool) -> str:
    text = _CLAUSE.sub(lambda m: _with_label(m, label), text)
    if not bare:
        return text
    return _BARE_AGGREGATION.sub(lambda m: f"{m.group(1)} by ({label}){m.group(2) or ' '}(", text)


def keep_cluster(expr: str, label: str, *, bare: bool = True) -> str:
    """`expr` with `label` in every by/on list and on every aggregation; unchanged when `label` is ''.

    `bare=False` leaves aggregations without `by` alone: a dashboard's single-number stat over the
    selected clusters is meant to be one number.
    """
    if not label:
        return expr
    pieces, position = [], 0
    for string in _STRINGS.finditer(expr):
        pieces += [_code(expr[position : string.start()], label, bare), string.group(0)]
        position = string.end()
    pieces.append(_code(expr[position:], label, bare))
    return "".join(pieces)


def label_lists(expr: str) -> list[tuple[str, list[str]]]:
    """Every by/on clause of `expr` and its labels, string literals skipped (what a test checks).

    'sum by (a, b) (x) and on (a) y' -> [("by", ["a", "b"]), ("on", ["a"])]
    """
    code = _STRINGS.sub('""', expr)
    return [
        (m.group(1), [name.strip() for name in m.group(3).split(",") if name.strip()])
        for m in _CLAUSE.finditer(code)
    ]
