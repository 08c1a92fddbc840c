"""`headroom demo`: the simulator, the sidecar and a load that crosses the knee, in one command.

Starts the simulator and the sidecar (with its in-process DuckDB store) on free loopback ports,
drives a mixed short/long workload at rising concurrency through the sidecar while sampling both
calibers from its /metrics, then prints per-level latency percentiles read back from the DuckDB
log, the caliber time course, the knee and recommended pool, and where everything lives.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import duckdb
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.wiring import build_sidecar, sidecar_state
from collector.sim.app import create_sim_app
from collector.sim.config import SimConfig
from collector.sim.demo_render import render_summary
from collector.sim.demo_summary import (
    DemoSummary,
    LevelWindow,
    caliber_course,
    capacity_estimate,
    level_table,
)
from collector.sim.load import Payload, run_level
from collector.sim.workload import CaliberSample, CaliberSampler, mixed_payload

__all__ = ["demo", "run_demo"]


def _levels(value: str) -> list[int]:
    try:
        levels = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a comma-separated list of integers, e.g. 1,2,4,8", param_hint="--levels"
        ) from None
    if not levels or any(level < 1 for level in levels):
        raise click.BadParameter(
            f"{value!r}: every level must be a positive integer, e.g. 1,2,4,8", param_hint="--levels"
        )
    return levels


async def _drive(
    url: str, levels: list[int], level_s: float, payload: Payload, progress: Progress
) -> tuple[list[LevelWindow], list[CaliberSample]]:
    """Run each level through the sidecar; return (LevelWindow list, caliber samples)."""
    sampler = CaliberSampler(f"{url}/metrics")
    sampling = asyncio.create_task(sampler.run())
    task = progress.add_task("starting", total=len(levels) * level_s)
    windows: list[LevelWindow] = []
    try:
        for index, concurrency in enumerate(levels):
            sampler.level = concurrency
            wall, mono = datetime.now(UTC), time.monotonic()
            warmup = min(0.5, level_s / 4)
            running = asyncio.create_task(
                run_level(url, concurrency, level_s - warmup, payload, warmup_s=warmup)
            )
            while not running.done():
                await asyncio.wait({running}, timeout=0.25)
                live = sampler.latest()
                progress.update(
                    task,
                    completed=index * level_s + min(level_s, time.monotonic() - mono),
                    description=f"concurrency {concurrency:>3}: in-flight "
                    f"{live.get('inflight', 0):>4.0f}, active tokens "
                    f"{live.get('active_tokens', 0):>7.0f}",
                )
            start, stop = running.result().window
            if not progress.console.is_terminal:  # no live bar in a log or pipe: one line a level
                progress.console.print(
                    f"concurrency {concurrency:>3} done ({index + 1}/{len(levels)} levels)"
                )
            windows.append(
                LevelWindow(
                    concurrency,
                    wall,
                    wall + timedelta(seconds=start - mono),
                    wall + timedelta(seconds=stop - mono),
                    datetime.now(UTC),
                )
            )
    finally:
        sampler.stop()
        await sampling
    return windows, sampler.samples


def run_demo(
    *,
    speed: float,
    levels: list[int],
    level_s: float,
    max_num_seqs: int,
    kv_cache_tokens: int,
    db_path: str,
    seed: int,
    slo_ttft_p95_s: float | None,
    progress_console: Console,
    report: Callable[[DemoSummary], None] | None = None,
    keep_serving: bool = False,
) -> DemoSummary:
    """Run the whole demo and return the summary dict (also what --json writes).

    `report(summary)` runs while both servers are still up; with keep_serving they then stay up
    until Ctrl-C.
    """
    sim_config = SimConfig(
        max_num_seqs=max_num_seqs,
        kv_cache_tokens=kv_cache_tokens,
        speed=speed,
        seed=seed,
        max_waiting=4 * max(levels),
        stream_interval=4,
        mean_output_tokens=96,
    )
    sim = serve_in_thread(create_sim_app(sim_config))
    try:
        app = build_sidecar(
            SidecarConfig(
                upstream=sim.url,
                listen_port=0,
                db_path=db_path,
                instance="demo",
                engine="vllm",
                engine_metrics_url=f"{sim.url}/metrics",
                engine_poll_interval_s=0.25,
                jobs=False,
            )
        )
        sidecar = serve_in_thread(app)
        try:
            columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
            with Progress(*columns, console=progress_console) as progress:
                windows, samples = asyncio.run(
                    _drive(sidecar.url, levels, level_s, mixed_payload(seed), progress)
                )
            parts = sidecar_state(app)
            store, writer = parts.store, parts.writer
            assert store is not None and writer is not None  # a --db sidecar: it owns its store
            writer.flush()
            summary: DemoSummary = {
                "db": os.path.abspath(db_path),
                "sidecar_url": sidecar.url,
                "sim_url": sim.url,
                "sim": {
                    "max_num_seqs": max_num_seqs,
                    "kv_cache_tokens": kv_cache_tokens,
                    "speed": speed,
                    "seed": seed,
                },
                "levels": level_table(store, windows),
                "calibers": caliber_course(samples, levels),
                "capacity": capacity_estimate(
                    store,
                    windows,
                    sim_config.model,
                    slo_ttft_p95_s,
                    gauges=parts.capacity,
                    kv_capacity_tokens=kv_cache_tokens,
                ),
                "serving": keep_serving,
            }
            if report is not None:
                report(summary)
            if keep_serving:
                _serve_until_interrupted()
            return summary
        finally:
            sidecar.stop()
    finally:
        sim.stop()


def _serve_until_interrupted() -> None:
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass


@click.command("demo")
@click.option(
    "--speed", type=float, default=4.0, show_default=True, help="Simulated seconds per real second."
)
@click.option(
    "--levels",
    "levels_text",
    default="1,2,4,8,16,32,64",
    show_default=True,
    help="Concurrency levels, comma-separated.",
)
@click.option(
    "--level-seconds",
    type=float,
    default=3.0,
    show_default=True,
    help="Seconds of load per level (the first quarter, at most 0.5 s, is warm-up).",
)
@click.option(
    "--duration",
    type=float,
    default=None,
    help="Total seconds of load, split evenly over the levels (overrides --level-seconds).",
)
@click.option(
    "--max-num-seqs",
    type=int,
    default=16,
    show_default=True,
    help="The simulator's batch size limit: where the knee should appear.",
)
@click.option(
    "--kv-cache-tokens",
    type=int,
    default=32768,
    show_default=True,
    help="The simulator's KV cache in tokens.",
)
@click.option(
    "--db",
    "db_path",
    default=None,
    metavar="PATH",
    help="DuckDB file for the request log [default: a new temporary directory].",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of prompts and output lengths.")
@click.option(
    "--slo-ttft-p95",
    type=float,
    default=None,
    metavar="SECONDS",
    help="p95 TTFT target for the SLO-bounded pool (real seconds at this --speed).",
)
@click.option("--json", "json_path", default=None, metavar="PATH", help="Also write the summary as JSON.")
@click.option("--keep-serving", is_flag=True, help="Keep simulator and sidecar up after the summary.")
def demo(
    speed: float,
    levels_text: str,
    level_seconds: float,
    duration: float | None,
    max_num_seqs: int,
    kv_cache_tokens: int,
    db_path: str | None,
    seed: int,
    slo_ttft_p95: float | None,
    json_path: str | None,
    keep_serving: bool,
) -> None:
    """Simulator + sidecar + a load that crosses the knee + a capacity summary; ends by itself.

    \b
    Examples:
      headroom demo
      headroom demo --speed 8 --levels 1,4,16,32 --level-seconds 1.5 --json demo.json
      headroom demo --db ./headroom-demo/headroom.duckdb --keep-serving

    No arguments needed. Everything runs in this process on free loopback ports; the request log
    is a DuckDB file you can query afterwards.
    """
    levels = _levels(levels_text)
    level_s = duration / len(levels) if duration else level_seconds
    if speed <= 0:
        raise click.BadParameter(
            f"{speed} must be positive, e.g. 4 (simulated seconds per real second)", param_hint="--speed"
        )
    if level_s <= 0.2:
        raise click.BadParameter(
            f"each level must last over 0.2 s (got {level_s:.2f} s); raise --level-seconds or --duration",
            param_hint="--level-seconds/--duration",
        )
    db_path = db_path or str(Path(tempfile.mkdtemp(prefix="headroom-demo-")) / "headroom.duckdb")
    # a pipe or file gets the full-width table (rich would cut it to 80 columns)
    console = Console() if sys.stdout.isatty() else Console(width=130)

    def report(summary: DemoSummary) -> None:
        failed = None
        if json_path:
            summary["json"] = os.path.abspath(json_path)
            try:
                Path(json_path).write_text(json.dumps(summary, indent=2, default=str) + "\n")
            except OSError as exc:
                failed = exc.strerror
                del summary["json"]
        render_summary(summary, console)
        if failed:
            raise click.ClickException(
                f"cannot write --json {json_path} ({failed}); the summary is printed "
                "above, pass a path in a writable directory"
            )

    try:
        run_demo(
            speed=speed,
            levels=levels,
            level_s=level_s,
            max_num_seqs=max_num_seqs,
            kv_cache_tokens=kv_cache_tokens,
            db_path=db_path,
            seed=seed,
            slo_ttft_p95_s=slo_ttft_p95,
            progress_console=Console(stderr=True),
            report=report,
            keep_serving=keep_serving,
        )
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: stopped cleanly; rows so far are in {db_path}", err=True)
        sys.exit(130)
    except duckdb.Error as exc:
        raise click.ClickException(
            f"cannot use --db {db_path} ({str(exc).splitlines()[0]}); pass a new path, or a DuckDB file "
            "headroom wrote that no other process holds open"
        ) from None
