"""`headroom capacity kv|quota|curve`: the formula commands and the passive curve."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click
import duckdb

from collector.analysis.kv import kv_bytes_per_token, kv_ceiling, usable_memory_bytes
from collector.analysis.passive import passive_curve
from collector.analysis.quota import quota_ceiling
from collector.analysis.render import token_summary
from collector.lake.source import open_log, reader_options
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
    if (db is None) == (lake_uri is None):
        raise click.UsageError("give --db PATH or --lake URI (with --catalog), one of them")
    try:
        with open_log(db, catalog_uri, lake_uri, table=lake_table, since=since, until=until) as store:
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
    except (FileNotFoundError, OwnerError) as exc:
        raise click.ClickException(f"{'--lake' if lake_uri else '--db'} {lake_uri or db}: {exc}") from None
    except duckdb.Error as exc:
        raise click.ClickException(
            f"cannot open --db {db} ({str(exc).splitlines()[0]}); pass a DuckDB file written by headroom"
        ) from None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
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
    """Attach kv, quota and curve to the `capacity` group."""
    for command in (kv, quota, curve):
        group.add_command(command)
