"""`headroom capacity kv|quota|curve|split`: the formula commands, the passive curve, and the
engine's own account of the traffic (passive V_P, cache hit rate, where TTFT went, goodput).

Past 300 lines: four thin commands of one group, each with its options and its lines for people,
share the reading of the log (`_reading`) and `_emit`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import click
import duckdb

from collector.analysis.engine_split import EngineSplit, EngineSplitReport, engine_split
from collector.analysis.kv import kv_bytes_per_token, kv_ceiling, usable_memory_bytes
from collector.analysis.passive import passive_curve
from collector.analysis.quota import quota_ceiling
from collector.analysis.render import token_summary
from collector.capacity import CapacityEstimate
from collector.lake.source import open_log, reader_options, reader_window
from collector.store.decision import Decision, decisions
from collector.store.owner import OwnerError
from collector.terminal import JSON_HELP, json_output, write_json
from collector.timewin import WHEN, WHEN_HELP, utc_now

__all__ = ["register"]

_GB = 1e9


def _emit(data: dict[str, Any], json_path: str | None, lines: list[str]) -> None:
    """The lines for people (on stderr with `--json -`), then the JSON where --json says."""
    with json_output(json_path):
        click.echo("\n".join(lines))
    if json_path:
        write_json(json_path, data)


@click.command("kv")
@click.option("--usable-gb", type=float, default=None, help="Usable KV memory, if known (GB).")
@click.option("--gpu-memory-gb", type=float, default=None, help="GPU memory, nominal (GB).")
@click.option("--weights-gb", type=float, default=0.0, show_default=True, help="Model weights (GB).")
@click.option(
    "--usable-fraction",
    type=float,
    default=0.8,
    show_default=True,
    help="Share of GPU memory the engine may use (vLLM gpu_memory_utilization).",
)
@click.option(
    "--reserve-gb", type=float, default=0.0, show_default=True, help="Activation/framework reserve (GB)."
)
@click.option("--kv-per-request-gb", type=float, default=None, help="KV per request at max context (GB).")
@click.option("--layers", type=int, default=None, help="Transformer layers (num_hidden_layers).")
@click.option("--kv-heads", type=int, default=None, help="Key/value heads (GQA groups).")
@click.option("--head-dim", type=int, default=None, help="Dimension of one attention head (head_dim).")
@click.option("--bytes-per-element", type=float, default=2.0, show_default=True, help="2 fp16/bf16, 1 fp8.")
@click.option("--max-context", type=int, default=None, help="Maximum context in tokens (never the mean).")
@click.option("--json", "json_path", default=None, metavar="PATH", help=JSON_HELP)
def kv(
    usable_gb: float | None,
    gpu_memory_gb: float | None,
    weights_gb: float,
    usable_fraction: float,
    reserve_gb: float,
    kv_per_request_gb: float | None,
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    bytes_per_element: float,
    max_context: int | None,
    json_path: str | None,
) -> None:
    """KV-cache ceiling: how many max-context requests fit, and ~70 % of that to configure.

    \b
    Examples:
      headroom capacity kv --usable-gb 57 --kv-per-request-gb 3           # -> ceiling 19, configure 13
      headroom capacity kv --gpu-memory-gb 80 --weights-gb 16 \\
          --layers 32 --kv-heads 8 --head-dim 128 --max-context 8192
    """
    try:
        if usable_gb is not None:
            usable = usable_gb * _GB
        elif gpu_memory_gb is not None:
            usable = usable_memory_bytes(
                gpu_memory_bytes=gpu_memory_gb * _GB,
                weights_bytes=weights_gb * _GB,
                usable_fraction=usable_fraction,
                reserve_bytes=reserve_gb * _GB,
            )
        else:
            raise click.UsageError("give --usable-gb, or --gpu-memory-gb with --weights-gb")
        if kv_per_request_gb is not None:
            per_request, per_token = kv_per_request_gb * _GB, None
        elif layers is not None and kv_heads is not None and head_dim is not None and max_context is not None:
            per_token = kv_bytes_per_token(
                layers=layers, kv_heads=kv_heads, head_dim=head_dim, bytes_per_element=bytes_per_element
            )
            per_request = per_token * max_context
        else:
            raise click.UsageError(
                "give --kv-per-request-gb, or --layers, --kv-heads, --head-dim and --max-context"
            )
        result = kv_ceiling(usable_bytes=usable, kv_bytes_per_request=per_request)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    data = result.to_dict() | {"kv_bytes_per_token": per_token}
    lines = [f"usable memory:       {usable / _GB:.1f} GB"]
    if per_token:
        lines.append(f"KV per token:        {per_token / 1024:.0f} KiB")
    lines += [
        f"KV per request:      {per_request / _GB:.2f} GB (at max context)",
        f"memory ceiling:      {result.ceiling} concurrent requests",
        f"configure (~70 %):   {result.configure}",
        "then validate: if the configured value already breaks the TTFT target, the limit is "
        "memory bandwidth (more cards), not memory.",
    ]
    _emit(data, json_path, lines)


@click.command("quota")
@click.option("--rpm", type=float, default=None, help="Requests per minute quota.")
@click.option("--tpm", type=float, default=None, help="Tokens per minute quota (input + output).")
@click.option("--mean-e2e-s", type=float, required=True, help="Mean end-to-end request time (s).")
@click.option("--mean-tokens-per-request", type=float, default=None, help="Mean input+output tokens.")
@click.option("--json", "json_path", default=None, metavar="PATH", help=JSON_HELP)
def quota(
    rpm: float | None,
    tpm: float | None,
    mean_e2e_s: float,
    mean_tokens_per_request: float | None,
    json_path: str | None,
) -> None:
    """Concurrency ceilings from an RPM and/or TPM quota (Little's law); the smaller binds.

    \b
    Examples:
      headroom capacity quota --rpm 600 --mean-e2e-s 10                   # -> 100
      headroom capacity quota --rpm 600 --tpm 1000000 --mean-e2e-s 10 --mean-tokens-per-request 4000
    """
    if rpm is None and tpm is None:
        raise click.UsageError("give --rpm and/or --tpm")
    try:
        result = quota_ceiling(
            mean_e2e_s=mean_e2e_s, rpm=rpm, tpm=tpm, mean_tokens_per_request=mean_tokens_per_request
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    lines = [
        f"by RPM: {result.by_rpm:.1f}" if result.by_rpm is not None else "by RPM: -",
        f"by TPM: {result.by_tpm:.1f}" if result.by_tpm is not None else "by TPM: -",
        f"ceiling: {result.ceiling} concurrent requests ({(result.binding or '-').upper()} binds)",
    ]
    _emit(result.to_dict(), json_path, lines)


@click.command("curve")
@click.option(
    "--db",
    default=None,
    help="DuckDB request log; while a sidecar serves it, read through the sidecar (its .owner file).",
)
@reader_options
@click.option(
    "--since",
    type=WHEN,
    default=None,
    help=f"Window start (inclusive): {WHEN_HELP} [default: the log's first request].",
)
@click.option("--until", type=WHEN, default=None, help="Window end (exclusive), as --since [default: now].")
@click.option(
    "--model", default=None, help="Only requests to this model (the name clients send) [default: all]."
)
@click.option(
    "--caliber",
    type=click.Choice(["requests", "tokens"]),
    default="requests",
    show_default=True,
    help="Bucket by in-flight requests or by active tokens at admission.",
)
@click.option(
    "--window-seconds",
    type=float,
    default=None,
    help="Throughput window; default 3 x the median generating time (e2e - TTFT).",
)
@click.option(
    "--task-class",
    default=None,
    metavar="NAME",
    help="Only requests of this task class (short, medium, long, or a workload's name).",
)
@click.option("--json", "json_path", default=None, metavar="PATH", help=JSON_HELP)
def curve(
    db: str | None,
    since: datetime | None,
    until: datetime | None,
    model: str | None,
    caliber: str,
    window_seconds: float | None,
    task_class: str | None,
    json_path: str | None,
    lake_uri: str | None,
    catalog_uri: str | None,
    lake_table: str,
) -> None:
    """Passive capacity curve from live traffic (source='traffic'), bucketed by concurrency at admission.

    \b
    Examples:
      headroom capacity curve --db headroom.duckdb --caliber requests
      headroom capacity curve --db headroom.duckdb --caliber tokens --since 24h --json curve.json
      headroom capacity curve --db headroom.duckdb --since 2026-11-30T09:00 --until 2026-11-30T17:00 --json -
      headroom capacity curve --db headroom.duckdb --task-class long --model llama-3-8b
      headroom capacity curve --catalog sqlite:///lake/catalog.db --lake /data/lake --since 7d
    """
    reader_window(db, lake_uri, since, until)  # one log, a window that is not empty
    with (
        _reading(db, lake_uri),
        open_log(db, catalog_uri, lake_uri, table=lake_table, since=since, until=until) as store,
    ):
        result = passive_curve(
            store,
            caliber,
            since,
            until,
            model,
            window_s=window_seconds,
            task_class=task_class,
        )
        made = [
            d
            for d in decisions(store, utc_now())
            if (model is None or d.model == model) and (task_class is None or d.task_class == task_class)
        ]
    lines = [f"{'bucket':>8} {'n':>6} {'windows':>7} {'tok/s':>9} {'TTFT p95':>9} {'errors':>6}"]
    for b in result.buckets:
        ttft = "-" if b.ttft_p95_s is None else f"{b.ttft_p95_s:.3f}"
        windows = result.windows_per_bucket.get(b.concurrency, 0)
        lines.append(
            f"{b.concurrency:>8} {b.samples:>6} {windows:>7} "
            f"{b.total_tokens_per_s:>9.1f} {ttft:>9} {b.error_ratio:>6.0%}"
        )
    knee = result.knee
    lines.append(
        f"traffic knee: {knee.requests if knee else '-'} ({caliber}), confidence "
        f"{result.confidence}: {result.confidence_reason}"
    )
    for decision in made:  # what the gauges export: the one decision every reader shares
        lines.append(_published_line(decision))
    _emit(result.to_dict() | {"published": [_published_dict(d) for d in made]}, json_path, lines)


@click.command("split")
@click.option(
    "--db",
    default=None,
    help="DuckDB request log; while a sidecar serves it, read through the sidecar (its .owner file).",
)
@reader_options
@click.option("--since", type=WHEN, default="7d", show_default=True, help=f"Window start: {WHEN_HELP}.")
@click.option("--until", type=WHEN, default=None, help="Window end (exclusive), as --since [default: now].")
@click.option(
    "--model", default=None, help="Only requests to this model (the name clients send) [default: all]."
)
@click.option(
    "--replica-class", default=None, metavar="NAME", help="Only this replica class [default: every class]."
)
@click.option("--json", "json_path", default=None, metavar="PATH", help=JSON_HELP)
def split(
    db: str | None,
    since: datetime,
    until: datetime | None,
    model: str | None,
    replica_class: str | None,
    json_path: str | None,
    lake_uri: str | None,
    catalog_uri: str | None,
    lake_table: str,
) -> None:
    """Where the traffic's TTFT went, by the engine's own per-request timings, per replica class:
    the sidecar's hop, the engine's queue, prefill and the rest; the passive prefill rate V_P
    (Σ prompt tokens computed / Σ prefill seconds) beside the published one; the prefix-cache hit
    rate; and goodput (met requests/s, attainment, requests per verdict). Client traffic only.

    \b
    Examples:
      headroom capacity split --db headroom.duckdb
      headroom capacity split --db headroom.duckdb --since 24h --replica-class h100-tp1 --json split.json
      headroom capacity split --catalog sqlite:///lake/catalog.db --lake /data/lake --since 7d --json -
    """
    until = reader_window(db, lake_uri, since, until)
    with (
        _reading(db, lake_uri),
        open_log(db, catalog_uri, lake_uri, table=lake_table, since=since, until=until) as store,
    ):
        found = engine_split(store, since, until, model=model, replica_class=replica_class)
        published = {
            (d.model, d.replica_class): d.estimate
            for d in decisions(store, until)
            if d.task_class == "all" and d.estimate is not None
        }
    lines = _split_lines(found, published)
    groups = [
        g.to_dict() | {"published": _published_rate(published.get((g.model, g.replica_class)))}
        for g in found.groups
    ]
    _emit(found.to_dict() | {"groups": groups}, json_path, lines)


def _published_rate(estimate: CapacityEstimate | None) -> dict[str, Any] | None:
    """The published estimate's V_P and where it came from (None: nothing published)."""
    if estimate is None:
        return None
    return {
        "prefill_tokens_per_s": estimate.prefill_tokens_per_s,
        "source": estimate.source,
        "run_id": estimate.run_id,
    }


def _split_lines(found: EngineSplitReport, published: dict[tuple[str, str], CapacityEstimate]) -> list[str]:
    """The table for people: one block per model and replica class."""
    since, until = (f"{t:%Y-%m-%d %H:%M} UTC" if t else "-" for t in (found.since, found.until))
    lines = [f"client traffic admitted {since} to {until} ({found.window_s / 3600:.1f} h)"]
    if not found.groups:
        return lines + ["no client traffic in the window"]
    for group in found.groups:
        lines += _group_lines(group, published.get((group.model, group.replica_class)))
    return lines


def _group_lines(group: EngineSplit, estimate: CapacityEstimate | None) -> list[str]:
    """One model and replica class: its rows, what the engine said (or why nothing), its goodput."""
    p, g = group.prefill, group.goodput
    engines = f" ({', '.join(group.engines)})" if group.engines else ""
    lines = [
        "",
        f"{group.model}, replica class {group.replica_class}{engines}: {_requests(p.rows)}, "
        f"{p.timed_rows:,} with the engine's timings ({_share(p.timed_share)})",
    ]
    lines += [f"  {group.no_timings}"] if group.no_timings else _timed_lines(group, estimate)
    counts = ", ".join(f"{v} {n:,}" for v, n in g.counts.items())
    goodput = "–" if g.met_per_s is None else f"{g.met_per_s:,.4f}"
    lines.append(
        f"  goodput {goodput} met requests/s, attainment {_share(g.attainment)}: {counts}, unjudged {g.unjudged:,}"
    )
    return lines


def _timed_lines(group: EngineSplit, estimate: CapacityEstimate | None) -> list[str]:
    """V_P beside the published one, the cache hit rate, and the TTFT split's table."""
    p, s = group.prefill, group.split
    mine = "–" if p.tokens_per_s is None else f"{p.tokens_per_s:,.0f}"
    theirs = "none published"
    if estimate is not None and estimate.prefill_tokens_per_s is not None:
        run = f" run {estimate.run_id}" if estimate.run_id else ""
        theirs = f"published {estimate.prefill_tokens_per_s:,.0f} ({estimate.source}{run})"
    title = f"TTFT over {s.requests:,} streamed ok requests (s)"
    lines = [
        f"  V_P {mine} prefill tokens/s: {p.computed_tokens:,} tokens computed in {p.prefill_s:,.3f} s "
        f"of prefill over {_requests(p.requests)}; {theirs}",
        f"  prefix-cache hit rate {_share(p.cache_hit_rate)} "
        f"({p.cached_tokens:,} of {p.cached_tokens + p.computed_tokens:,} prompt tokens)",
        f"  {title:<41} {'mean':>8} {'p50':>8} {'p95':>8}",
    ]
    parts = (("hop", s.hop), ("queue", s.queue), ("prefill", s.prefill), ("rest", s.rest), ("TTFT", s.ttft))
    for name, part in parts:
        lines.append(
            f"    {name:<39} " + " ".join(_seconds(v) for v in (part.mean_s, part.p50_s, part.p95_s))
        )
    return lines


def _requests(count: int) -> str:
    return f"{count:,} request{'' if count == 1 else 's'}"


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


def _seconds(value: float | None) -> str:
    """Seconds in a column of 8; a sum's rounding off 0 (llama.cpp's rest, -1e-17) shows as 0."""
    return f"{'–':>8}" if value is None else f"{round(value, 9) + 0.0:>8.3f}"


@contextlib.contextmanager
def _reading(db: str | None, lake_uri: str | None) -> Iterator[None]:
    """What reading the log can raise, as one message that names the --db or --lake it read."""
    try:
        yield
    except (FileNotFoundError, OwnerError) as exc:
        raise click.ClickException(f"{'--lake' if lake_uri else '--db'} {lake_uri or db}: {exc}") from None
    except duckdb.Error as exc:
        raise click.ClickException(
            f"cannot open --db {db} ({str(exc).splitlines()[0]}); pass a DuckDB file written by headroom"
        ) from None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def _published_dict(decision: Decision) -> dict[str, Any]:
    estimate = decision.estimate
    return {
        "model": decision.model,
        "task_class": decision.task_class,
        "reason": decision.reason,
        "knee_requests": estimate.knee_requests if estimate else None,
        "knee_tokens": estimate.knee_tokens if estimate else None,
        "knee_tokens_p95": estimate.knee_tokens_p95 if estimate else None,
        "token_knee_withheld": estimate.token_knee_withheld if estimate else None,
        "recommended_pool": estimate.recommended_pool if estimate else None,
        "source": estimate.source if estimate else None,
        "run_id": estimate.run_id if estimate else None,
    }


def _published_line(decision: Decision) -> str:
    if decision.estimate is None:
        return f"published ({decision.model}, {decision.task_class}): {decision.reason}"
    estimate = decision.estimate
    return (
        f"published ({decision.model}, {decision.task_class}): knee "
        f"{estimate.knee_requests} requests / {token_summary(estimate)}, pool "
        f"{estimate.recommended_pool} - {decision.reason}"
    )


def register(group: click.Group) -> None:
    """Attach kv, quota, curve and split to the `capacity` group."""
    for command in (kv, quota, curve, split):
        group.add_command(command)
