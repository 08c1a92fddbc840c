"""The review's "Where TTFT went" and "Goodput": per replica class, from the engine's own timings.

collector.analysis.engine_split reads them per model and the replica class each row names;
`engine_entries` gives one model's classes as the review's JSON, each with the V_P of the
estimate published for that class beside the passive one, and the tables below render them.

    >>> from collector.analysis.engine_split import NO_TIMINGS
    >>> entry = {"replica_class": "a", "no_timings": NO_TIMINGS, "prefill": {"rows": 3}}
    >>> prefill_lines([entry])[0][:52]
    'Class a: the engine reported no per-request timings:'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from collector.analysis.engine_split import PARTS, EngineSplit
from collector.goodput import VERDICTS
from collector.store.decision import Published

__all__ = ["engine_entries", "split_table", "prefill_lines", "goodput_table"]


def engine_entries(groups: Sequence[EngineSplit], published: Mapping[str, Published]) -> list[dict[str, Any]]:
    """One model's groups (replica class order) as JSON, each with `published`: the V_P of the
    estimate published for its class, its source and run (None: no estimate, or one without V_P)."""
    found = []
    for group in sorted(groups, key=lambda g: g.replica_class):
        mine = published.get(group.replica_class)
        estimate = mine.estimate if mine else None
        rate = None
        if estimate is not None and estimate.prefill_tokens_per_s is not None:
            rate = {
                "prefill_tokens_per_s": estimate.prefill_tokens_per_s,
                "source": estimate.source,
                "run_id": estimate.run_id,
            }
        found.append(group.to_dict() | {"published": rate})
    return found


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


def _clean(seconds: float | None) -> float | None:
    """A sum's rounding off 0 shown as 0 (llama.cpp's rest is 0 by construction, -1e-17 in floats)."""
    return None if seconds is None else round(seconds, 9) + 0.0


def split_table(entries: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of "Where TTFT went": per class, each part's mean / p95 and the cache hit
    rate; the parts' means add up to the mean TTFT."""
    from collector.report.render_md import fmt  # render_md imports this module

    names = [name for name, _ in PARTS] + ["rest", "ttft"]
    header = ["replica class", "streamed ok requests"]
    header += [f"{'TTFT' if n == 'ttft' else n} mean / p95 (s)" for n in names] + ["cache hit rate"]
    rows = []
    for e in entries:
        if e["no_timings"]:
            continue
        split = e["split"]
        cells = [f"{fmt(_clean(split[n]['mean_s']))} / {fmt(_clean(split[n]['p95_s']))}" for n in names]
        rows.append(
            [e["replica_class"], fmt(split["requests"]), *cells, _share(e["prefill"]["cache_hit_rate"])]
        )
    return header, rows


def prefill_lines(entries: list[dict[str, Any]]) -> list[str]:
    """Per class, the passive V_P with its evidence beside the published one, or why there is none."""
    from collector.report.render_md import fmt  # render_md imports this module

    lines = []
    for e in entries:
        p, name = e["prefill"], e["replica_class"]
        if e["no_timings"]:
            lines.append(f"Class {name}: {e['no_timings']} (requests in the window: {fmt(p['rows'])}).")
            continue
        published = e["published"]
        beside = (
            f"the published V_P is {fmt(published['prefill_tokens_per_s'], 0)} "
            f"({published['source']}{' run ' + published['run_id'] if published['run_id'] else ''})"
            if published
            else "no published estimate has a V_P"
        )
        lines.append(
            f"Class {name}: passive V_P {fmt(p['prefill_tokens_per_s'], 0)} prefill tokens/s "
            f"({fmt(p['computed_tokens'])} prompt tokens computed in {fmt(p['prefill_s'])} s of prefill "
            f"over {fmt(p['requests'])} requests; {fmt(p['timed_rows'])} of {fmt(p['rows'])} requests "
            f"carry the engine's timings, {_share(p['timed_share'])}); {beside}."
        )
    return lines


def goodput_table(entries: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of "Goodput": met requests/s, attainment (invalid left out), and the
    requests per verdict."""
    from collector.report.render_md import fmt  # render_md imports this module

    header = ["replica class", "goodput (met/s)", "token goodput (tokens/s)", "attainment"]
    header += [*VERDICTS, "unjudged"]
    rows = [
        [
            e["replica_class"],
            fmt(e["goodput"]["met_per_s"], 4),
            fmt(e["goodput"]["good_tokens_per_s"], 1),
            _share(e["goodput"]["attainment"]),
            *(fmt(e["goodput"]["verdicts"][v]) for v in VERDICTS),
            fmt(e["goodput"]["unjudged"]),
        ]
        for e in entries
    ]
    return header, rows
