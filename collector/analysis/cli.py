"""`headroom probe` and `headroom capacity kv|quota|curve`: thin shells over the analysis core."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from dataclasses import replace
from pathlib import Path

import click
import duckdb
import orjson
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from collector.analysis.cli_capacity import register
from collector.analysis.estimate import estimate_from_probe, save_estimate
from collector.analysis.plot import write_plot
from collector.analysis.probe import ProbeError, ProbeSettings, new_run_id, run_probe
from collector.analysis.prompts import load_prompts
from collector.analysis.render import print_estimate
from collector.analysis.slo import Slo
from collector.analysis.workload import load_workload
from collector.store.db import RequestStore
from collector.store.shipper import StoreShipper

__all__ = ["probe", "capacity"]


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of integers, e.g. 1,2,4,8",
                                 param_hint="--levels") from None
    if not levels or levels[0] < 1:
        raise click.BadParameter(f"{text!r}: levels must be positive integers, e.g. 1,2,4,8", param_hint="--levels")
    return levels


def _row_writer(db: str | None, store_url: str | None, store_token: str | None):
    """Where probe rows go: a DuckDB file, a store service, or nowhere. Returns (write, close, store)."""
    if db:
        try:
            store = RequestStore(db)
        except duckdb.IOException as exc:
            hint = ("a running sidecar or store owns that file, so pass --store-url to ship rows to the "
                    "store service, or another --db file" if "lock" in str(exc).lower()
                    else "pass a DuckDB file headroom wrote, or a new path")
            raise click.ClickException(f"cannot open --db {db} ({str(exc).splitlines()[0]}); {hint}") from None
        return store.insert_rows, store.close, store
    if store_url:
        spool = Path(tempfile.mkdtemp(prefix="probe-spool-"))
        shipper = StoreShipper(store_url, store_token or "", spool)
        return shipper.write_batch, shipper.close, None
    return None, (lambda: None), None


def _write_json(path: str, data: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


@click.command("probe", epilog="""\b
Examples:
  headroom probe --url http://127.0.0.1:9100 --levels 1,2,4,8,16,32
  headroom probe --url http://127.0.0.1:8000 --model llama-3-8b --max-tokens 256 \\
      --slo-ttft-p95 2.0 --profile interactive --json cap.json --plot cap.png --db headroom.duckdb
  headroom probe --url http://gpu-1:8000 --prompts mixed --profile batch
  headroom probe --url http://127.0.0.1:9100 --workload classes --levels 1,2,4,8,16
  headroom probe --url http://127.0.0.1:9100 --workload my-workload.yaml --json knees.json
""")
@click.option("--url", required=True, help="Base URL of the sidecar or the engine (OpenAI API).")
@click.option("--model", default=None, help="Model name to send; default: the first of /v1/models.")
@click.option("--levels", default="1,2,4,8,16,32,64", show_default=True, help="Concurrency ladder.")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(1),
              help="Output length per request.")
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Lock the output length (vLLM / llama.cpp accept ignore_eos).")
@click.option("--prompts", default="short", show_default=True,
              help="short, long, mixed, or a file with one prompt per line.")
@click.option("--slo-ttft-p95", type=float, default=None, help="p95 TTFT target in seconds.")
@click.option("--slo-tpot-p95", type=float, default=None, help="p95 TPOT target in seconds.")
@click.option("--profile", type=click.Choice(["interactive", "semi", "batch"]),
              default="interactive", show_default=True, help="Pool recommendation profile.")
@click.option("--json", "json_path", default=None, help="Write the estimate as JSON here.")
@click.option("--plot", "plot_path", default=None, help="Write a PNG here (and an .html beside it).")
@click.option("--db", default=None,
              help="DuckDB request log to append rows (source='probe') and the estimate to.")
@click.option("--store-url", default=None, help="Ship rows to a `headroom store` service instead.")
@click.option("--store-token", envvar="HEADROOM_TOKEN", default=None,
              help="Bearer token for --store-url [env: HEADROOM_TOKEN].")
@click.option("--max-samples", default=400, show_default=True, help="Per-level cap on measured requests.")
@click.option("--max-level-seconds", default=120.0, show_default=True, help="Per-level time cap.")
@click.option("--timeout", "timeout_s", default=300.0, show_default=True, help="Per-request timeout (s).")
@click.option("--endpoint", type=click.Choice(["/v1/chat/completions", "/v1/completions"]),
              default="/v1/chat/completions", show_default=True)
@click.option("--seed", default=0, show_default=True, help="Seed of the prompt order.")
@click.option("--api-key", envvar="OPENAI_API_KEY", default=None,
              help="Bearer token for the server under test [env: OPENAI_API_KEY]; never stored.")
@click.option("--workload", default=None, metavar="FILE|classes",
              help="Measure one gradient per task class (YAML: classes with name, max_tokens, "
                   "prompts; 'classes' = short 128, medium 512, long 1200 tokens); each class "
                   "gets its own knee and pool. Replaces --max-tokens and --prompts.")
@click.option("--engine-metrics", default="auto", show_default=True, metavar="auto|none|URL",
              help="Where the probe reads the engine's queue, the knee's evidence: auto = "
                   "URL/metrics when it names an engine (vLLM, SGLang, TGI, llama.cpp, or a "
                   "headroom sidecar); none = judge queueing from TTFT alone.")
def probe(url, model, levels, max_tokens, ignore_eos, prompts, slo_ttft_p95, slo_tpot_p95, profile,
          json_path, plot_path, db, store_url, store_token, max_samples, max_level_seconds,
          timeout_s, endpoint, seed, api_key, workload, engine_metrics) -> None:
    """Concurrency-gradient load test: measure each level, find the knee, recommend a pool.

    Each level warms up, then measures until p95 TTFT moves less than 5 % between windows (or a
    cap). The knee is where the engine starts queueing (its own waiting count, read from
    --engine-metrics) with throughput on its plateau (docs/capacity.md). 429s and 503s count as
    capacity errors and are never retried; a request whose reused connection the engine had
    closed is re-sent once on a new one (counted). The probe stops early once a level is
    clearly saturated and says why.
    """
    engine_url = None if engine_metrics in ("auto", "none") else engine_metrics
    for name, value, example in (("--url", url, "http://127.0.0.1:9100"),
                                 ("--store-url", store_url, "http://127.0.0.1:9200"),
                                 ("--engine-metrics", engine_url, "http://127.0.0.1:8000/metrics")):
        if value is not None and not value.startswith(("http://", "https://")):
            raise click.BadParameter(f"{value!r} is not an http(s) URL; expected e.g. {example}",
                                     param_hint=name)
    slo = Slo(ttft_p95_s=slo_ttft_p95, tpot_p95_s=slo_tpot_p95)
    settings = _settings(url=url, model=model, levels=_levels(levels), max_tokens=max_tokens,
                         ignore_eos=ignore_eos, prompts=prompts, endpoint=endpoint, slo=slo,
                         max_samples=max_samples, max_level_s=max_level_seconds,
                         request_timeout_s=timeout_s, seed=seed, api_key=api_key,
                         engine_metrics=engine_metrics)
    runs = _class_settings(settings, workload)
    write, close, store = _row_writer(db, store_url, store_token)
    estimates = []
    try:
        for run in runs:
            if len(runs) > 1:
                click.echo(f"\n== task class {run.task_class}: max_tokens {run.max_tokens}, "
                           f"prompts {run.prompts}")
            result = _run_with_progress(run, write)
            estimate = estimate_from_probe(result, slo=slo, profile=profile)
            print_estimate(estimate)
            click.echo(f"queueing evidence: {result.queue_evidence}")
            if store is not None:
                save_estimate(store, estimate)
            estimates.append(estimate)
    except ProbeError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        close()
    if len(estimates) > 1:
        _print_classes(estimates)
    _write_outputs(estimates, json_path, plot_path)


def _class_settings(settings: ProbeSettings, workload: str | None) -> list[ProbeSettings]:
    """One ProbeSettings per task class of the workload, or the one run without a workload."""
    if workload is None:
        return [settings]
    try:
        classes = load_workload(workload)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--workload") from None
    base = new_run_id()
    runs = []
    for task in classes:
        try:
            load_prompts(task.prompts)  # fails before any load is sent
        except ValueError as exc:
            raise click.BadParameter(f"class {task.name}: {exc}", param_hint="--workload") from None
        runs.append(replace(settings, max_tokens=task.max_tokens, prompts=task.prompts,
                            task_class=task.name, run_id=f"{base}-{task.name}"))
    return runs


def _print_classes(estimates: list) -> None:
    """The per-class knees side by side, with each one's ratio to the first class."""
    first = estimates[0].knee.requests
    click.echo("\ntask class   knee   pool   knee / " + estimates[0].task_class)
    for estimate in estimates:
        ratio = estimate.knee.requests / first if first else float("nan")
        reached = "" if estimate.knee.reached else " (lower bound)"
        click.echo(f"{estimate.task_class:<12} {estimate.knee.requests:>4}{reached}   "
                   f"{estimate.recommended_pool:>4}   {ratio:.2f}")


def _write_outputs(estimates: list, json_path: str | None, plot_path: str | None) -> None:
    """--json (one estimate, or {"classes": {name: estimate}}) and --plot (one per class)."""
    try:
        if json_path:
            data = estimates[0].to_dict() if len(estimates) == 1 else \
                {"classes": {e.task_class: e.to_dict() for e in estimates}}
            _write_json(json_path, data)
            click.echo(f"wrote {json_path}")
        for estimate in estimates if plot_path else ():
            path = Path(plot_path)
            if len(estimates) > 1:
                path = path.with_name(f"{path.stem}-{estimate.task_class}{path.suffix or '.png'}")
            png, html = write_plot(estimate, path)
            click.echo(f"wrote {png} and {html}")
    except OSError as exc:
        raise click.ClickException(
            f"cannot write {exc.filename or json_path or plot_path} ({exc.strerror}); the estimate is printed "
            "above, pass --json/--plot paths in a writable directory next time") from None


def _settings(**values):
    """ProbeSettings, with bad values (such as an unreadable --prompts file) as usage errors."""
    try:
        load_prompts(values["prompts"])  # fails before any load is sent
        return ProbeSettings(**values)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _run_with_progress(settings, write):
    """Run the probe under a rich progress bar on stderr (level and measured requests)."""
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed} measured"))
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("connecting", total=settings.max_samples)

        def progress(level: int, measured: int, cap: int) -> None:
            bar.update(task, description=f"concurrency {level}", completed=measured, total=cap)

        # the engine poller warns once when URL/metrics names no engine; the probe says it in
        # its summary instead ("queueing evidence: ...")
        logging.getLogger("collector.sources.poller").setLevel(logging.ERROR)
        return asyncio.run(run_probe(settings, write_rows=write, progress=progress))


@click.group("capacity", epilog="""\b
Examples:
  headroom capacity kv --gpu-memory-gb 96 --weights-gb 20 \\
      --layers 80 --kv-heads 8 --head-dim 128 --max-context 8192
  headroom capacity kv --usable-gb 57 --kv-per-request-gb 3
  headroom capacity quota --rpm 600 --tpm 1000000 --mean-e2e-s 10 --mean-tokens-per-request 4000
  headroom capacity curve --db headroom.duckdb --since 2026-11-30T00:00:00+00:00 --caliber requests
""")
def capacity() -> None:
    """Capacity formulas (KV-cache and quota ceilings) and passive curves from the request log."""


register(capacity)
