"""`headroom probe` and `headroom capacity kv|quota|curve|split`: thin shells over the analysis core."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import duckdb
import httpx
import orjson
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from collector.analysis.cli_capacity import register
from collector.analysis.estimate import estimate_from_probe
from collector.analysis.plot import rates_plot_path, write_plot
from collector.analysis.probe import ProbeError, ProbeResult, ProbeSettings, new_run_id, run_probe
from collector.analysis.probe_options import probe_options, settings_from_options
from collector.analysis.prompts import load_prompts
from collector.analysis.render import print_estimate, print_rates
from collector.analysis.workload import FROM_LOG, load_workload, log_lengths
from collector.capacity import DEFAULT_REPLICA_CLASS, CapacityEstimate, Slo
from collector.lake.source import MISSING_LAKE_EXTRA, open_log
from collector.store.capacity_gauges import check_replica_class
from collector.store.db import RequestStore
from collector.store.estimates import save_estimate_once
from collector.store.owner import OwnerError, find_owner, is_lock_error, open_request_log, send_rows
from collector.terminal import json_output, write_json

__all__ = ["probe", "capacity"]

_WriteRows = Callable[[list[dict[str, Any]]], object]  # a level's probe rows, to the request log
_SaveEstimate = Callable[[CapacityEstimate], object]
# _row_writer's four: write rows (None: not written here), close, save the estimate (None: not
# saved), the store this process opened itself
_Outputs = tuple[_WriteRows | None, Callable[[], None], _SaveEstimate | None, RequestStore | None]


def _row_writer(db: str | None, url: str) -> _Outputs:
    """Where probe rows and the estimate go. Returns (write rows, close, save estimate, the store
    when this process opened --db itself).

    A --db that a running sidecar owns is written through it (collector.store.owner): rows to its
    ingest route, unless the probe runs through that same sidecar, which logs the load itself.
    """
    if db:
        try:
            store = RequestStore(db)
        except duckdb.IOException as exc:
            if not is_lock_error(exc):
                raise click.ClickException(
                    f"cannot open --db {db} ({str(exc).splitlines()[0]}); pass a DuckDB "
                    "file headroom wrote, or a new path"
                ) from None
            return _through_owner(db, url)

        def save(estimate: CapacityEstimate) -> None:
            saved = save_estimate_once(store, estimate)
            _say_saved(estimate, saved.estimate_id, saved.already_stored, f"--db {db}")

        return store.insert_rows, store.close, save, store
    return None, (lambda: None), None, None


def _say_saved(estimate: CapacityEstimate, estimate_id: str | None, already_stored: bool, where: str) -> None:
    """One line on where the estimate went. A run's estimate stored before (the owning sidecar's job
    built it from the run's rows) is kept and this one not saved: one estimate per run
    (collector.store.estimates)."""
    named = f"estimate {estimate_id}" if estimate_id else "the estimate"
    if already_stored:
        click.echo(
            f"probe run {estimate.run_id}: its {named} was already stored in {where}; kept, not saved again"
        )
    else:
        click.echo(f"{named} saved to {where}")


def _through_owner(db: str, url: str) -> _Outputs:
    """Rows and estimate for a --db another process holds, sent to that process's store routes."""
    try:
        owner = find_owner(db)
    except OwnerError as exc:
        raise click.ClickException(f"--db {db}: {exc}") from None
    same_sidecar = owner.proxy is not None and owner.proxy.rstrip("/") == url.rstrip("/")

    def write(rows: list[dict[str, Any]]) -> None:
        try:
            send_rows(owner, rows)
        except OwnerError as exc:
            raise ProbeError(f"--db {db}: {exc}") from None

    def save(estimate: CapacityEstimate) -> None:
        try:
            answer = httpx.post(
                f"{owner.url}/v1/estimates",
                content=orjson.dumps(estimate.to_dict()),
                timeout=30,
                headers={"Authorization": f"Bearer {owner.token}", "Content-Type": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise click.ClickException(
                f"cannot reach the owner of --db {db} at {owner.url} ({type(exc).__name__}); "
                "the estimate is printed above"
            ) from None
        if answer.status_code == 401:
            raise click.ClickException(
                f"{owner.url} refused the token; set HEADROOM_TOKEN to the owning sidecar's"
            )
        if answer.status_code != 200:
            raise click.ClickException(
                f"{owner.url} did not save the estimate (HTTP {answer.status_code}: {answer.text[:200]})"
            )
        try:
            body = answer.json()
        except ValueError:  # saved (200) all the same; an owner that answers no JSON names no id
            body = None
        body = body if isinstance(body, dict) else {}
        stored_id = body.get("estimate_id")
        where = f"--db {db} (through its owner {owner.url})"
        _say_saved(estimate, str(stored_id) if stored_id else None, body.get("already_stored") is True, where)

    return (None if same_sidecar else write), (lambda: None), save, None


def _lake_saver(catalog_uri: str | None, lake_uri: str) -> _Outputs:
    """_row_writer's four for --lake: no rows (the sidecar probed through logs them), the estimate
    to the fleet's estimates table (collector.lake.estimates)."""
    if not catalog_uri:
        raise click.UsageError("--lake needs --catalog (or HEADROOM_CATALOG): the table's catalog URI")
    try:
        # lazy: pyiceberg, the [lake] extra, only with --catalog
        from collector.lake.estimates import ESTIMATES_TABLE, save_to_lake  # lazy: pyiceberg
        from collector.lake.layout import Lake, private_files
        from collector.lake.table import open_catalog
    except ImportError as exc:
        raise click.ClickException(f"{MISSING_LAKE_EXTRA} ({exc})") from None
    private_files()  # the estimates table's metadata, as private as the sidecars' staged files
    try:
        catalog = open_catalog(catalog_uri, Lake.parse(lake_uri))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except Exception as exc:  # sqlalchemy or the REST client: the catalog cannot be reached
        raise click.ClickException(f"cannot open --catalog ({type(exc).__name__}: {exc})") from None

    def save(estimate: CapacityEstimate) -> None:
        try:
            estimate_id = save_to_lake(catalog, estimate)
        except Exception as exc:  # the catalog went away during the probe
            raise click.ClickException(
                f"the estimate was not saved to {ESTIMATES_TABLE} ({type(exc).__name__}: {exc}); "
                "it is printed above"
            ) from None
        click.echo(f"estimate {estimate_id} saved to {ESTIMATES_TABLE}")

    return None, (lambda: None), save, None


def _lake_traffic(stack: contextlib.ExitStack, catalog_uri: str | None, lake_uri: str) -> RequestStore | None:
    """The fleet's traffic of the last 7 days (the token mix the probe is compared with), or None
    before the table holds any."""
    since = datetime.now(UTC) - timedelta(days=7)
    try:
        return stack.enter_context(open_log(None, catalog_uri, lake_uri, since=since))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@click.command("probe")
@probe_options
def probe(**options: Any) -> None:  # click passes each option by its name (collector.analysis.probe_options)
    """Concurrency-gradient load test: measure each level, find the knee, recommend a pool.

    \b
    Examples:
      headroom probe --url http://127.0.0.1:9100 --levels 1,2,4,8,16,32
      headroom probe --url http://127.0.0.1:9100 --levels 1,2,4,8,16 --rates auto --slo-ttft-p95 2
      headroom probe --url http://127.0.0.1:9100 --rates 2,4,6,8 --rate-seconds 60 --db headroom.duckdb
      headroom probe --url http://127.0.0.1:8000 --model llama-3-8b --max-tokens 256 \\
          --slo-ttft-p95 2.0 --profile interactive --json cap.json --plot cap.png --db headroom.duckdb
      headroom probe --url http://gpu-1:8000 --prompts mixed --profile batch
      headroom probe --url http://127.0.0.1:9100 --workload classes --levels 1,2,4,8,16
      headroom probe --url http://127.0.0.1:9100 --model llama-3-8b --adapters sql-lora,chat-lora
      headroom probe --url http://127.0.0.1:9100 --workload my-workload.yaml --json knees.json
      headroom probe --url http://127.0.0.1:9100 --workload from-log --db headroom.duckdb
      headroom probe --url http://gpu-1:8000 --workload from-log --traffic-db headroom.duckdb \\
          --db probes.duckdb

    Each level warms up, then measures until p95 TTFT moves less than 5 % between windows (or a
    cap). The knee is where the engine starts queueing (its own waiting count, read from
    --engine-metrics) with throughput on its plateau (docs/capacity.md). 429s and 503s count as
    capacity errors and are never retried; a request whose reused connection the engine had
    closed is re-sent once on a new one (counted). The probe stops early once a level is
    clearly saturated and says why.

    A level's outcome mix and first error are printed; when more than 5 % of a level's requests
    fail for reasons other than capacity (a 400, a malformed answer) the estimate has confidence
    none and publishes nothing. The token capacity is the request knee times the traffic's own
    time-weighted tokens per request in flight (--traffic-db: the week's answered requests before
    the probe, at least 50), whatever prompts the probe sent, capped at the engine's KV capacity;
    without enough traffic it is withheld and the reason printed (docs/capacity.md "Token
    capacity").
    """
    url, db, traffic_db = options["url"], options["db"], options["traffic_db"]
    lake_uri, catalog_uri = options["lake_uri"], options["catalog_uri"]
    json_path, replica_class, profile = options["json_path"], options["replica_class"], options["profile"]
    # `--json -`: the JSON alone on stdout, what the probe prints for people on stderr
    click.get_current_context().with_resource(json_output(json_path))
    engine_url = None if options["engine_metrics"] in ("auto", "none") else options["engine_metrics"]
    for name, value, example in (
        ("--url", url, "http://127.0.0.1:9100"),
        ("--engine-metrics", engine_url, "http://127.0.0.1:8000/metrics"),
    ):
        if value is not None and not value.startswith(("http://", "https://")):
            raise click.BadParameter(
                f"{value!r} is not an http(s) URL; expected e.g. {example}", param_hint=name
            )
    settings = settings_from_options(options)
    if replica_class is not None:
        try:
            check_replica_class(replica_class)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--replica-class") from None
    facts = sidecar_facts(url)
    replica_class = replica_class or facts.replica_class
    click.echo(f"replica class: {replica_class}")
    settings = replace(settings, sidecar_token=_token_for(url, options["sidecar_token"], db, facts))
    if facts.is_sidecar and settings.sidecar_token is None:
        click.echo(
            f"warning: {url} is a headroom sidecar and no token was given: it logs this load as "
            "its clients' traffic, not the probe's; pass --sidecar-token or set HEADROOM_TOKEN "
            "to the sidecar's token",
            err=True,
        )
    if lake_uri is not None and db is not None:
        raise click.UsageError("give --db PATH or --lake URI (with --catalog), not both")
    write, close, save, own = _row_writer(db, url) if lake_uri is None else _lake_saver(catalog_uri, lake_uri)
    estimates = []
    try:
        with contextlib.ExitStack() as stack:
            if lake_uri is not None and traffic_db is None:
                traffic = _lake_traffic(stack, catalog_uri, lake_uri)
            else:
                traffic = _traffic_log(stack, traffic_db or db, own if traffic_db in (None, db) else None)
            runs = _class_settings(settings, options["workload"], traffic)
            for run in runs:
                if len(runs) > 1:
                    click.echo(
                        f"\n== task class {run.task_class}: max_tokens {run.max_tokens}, prompts "
                        + (f"of {run.lengths[0][0]} tokens" if run.lengths else run.prompts)
                    )
                estimates.append(_probe_once(run, write, save, settings.slo, profile, traffic, replica_class))
    except ProbeError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        close()
    if len(estimates) > 1:
        _print_classes(estimates)
    _write_outputs(estimates, json_path, options["plot_path"])


def _probe_once(
    run: ProbeSettings,
    write: _WriteRows | None,
    save: _SaveEstimate | None,
    slo: Slo,
    profile: str,
    traffic: RequestStore | None,
    replica_class: str = DEFAULT_REPLICA_CLASS,
) -> CapacityEstimate:
    """One gradient: run it, estimate it (its token knee checked against `traffic`), print, save."""
    result = _run_with_progress(run, write)
    estimate = estimate_from_probe(
        result, slo=slo, profile=profile, traffic=traffic, replica_class=replica_class
    )
    print_estimate(estimate)
    click.echo(f"queueing evidence: {result.queue_evidence}")
    if result.rates is not None:
        print_rates(result.rates)
    if save is not None:
        save(estimate)
    return estimate


@dataclass(frozen=True)
class SidecarFacts:
    """What the /metrics page at --url says of it: a headroom sidecar or not, and its class."""

    is_sidecar: bool
    replica_class: str


def sidecar_facts(url: str) -> SidecarFacts:
    """Whether `url` is a headroom sidecar (its /metrics exports headroom_ series) and the replica
    class it exports (headroom_replica_info), else "default" (an engine, an older sidecar, one
    still deciding, or no answer within 5 s)."""
    base = url.rstrip("/")
    base = base[: -len("/v1")] if base.endswith("/v1") else base
    try:
        text = httpx.get(f"{base}/metrics", timeout=5.0).text
    except httpx.HTTPError:
        return SidecarFacts(False, DEFAULT_REPLICA_CLASS)
    found = re.search(r'^headroom_replica_info\{[^}]*replica_class="([^"]+)"[^}]*\} 1', text, re.MULTILINE)
    is_sidecar = re.search(r"^headroom_inflight_requests\b", text, re.MULTILINE) is not None
    return SidecarFacts(is_sidecar, found.group(1) if found else DEFAULT_REPLICA_CLASS)


def sidecar_replica_class(url: str) -> str:
    """The replica class the sidecar at `url` exports, else "default" (sidecar_facts)."""
    return sidecar_facts(url).replica_class


def _token_for(url: str, given: str | None, db: str | None, facts: SidecarFacts) -> str | None:
    """The token the probe sends to `url`: --sidecar-token as given; HEADROOM_TOKEN from the
    environment only to a headroom sidecar (an engine never sees the fleet's token); else the
    token of the sidecar that owns --db, when `url` is that sidecar."""
    source = click.get_current_context().get_parameter_source("sidecar_token")
    if given and (source != click.core.ParameterSource.ENVIRONMENT or facts.is_sidecar):
        return given
    return _owner_token(db, url)


def _owner_token(db: str | None, url: str) -> str | None:
    """The token of the sidecar that owns `db`, when `url` is that sidecar's proxy; else None
    (a token is never sent to another server)."""
    if not db or not Path(f"{db}.owner").exists():
        return None
    try:
        owner = find_owner(db)
    except OwnerError:
        return None
    if owner.proxy is None or owner.proxy.rstrip("/") != url.rstrip("/").removesuffix("/v1"):
        return None
    return owner.token


def _traffic_log(
    stack: contextlib.ExitStack, path: str | None, own: RequestStore | None
) -> RequestStore | None:
    """The request log the probe compares its token mix with (and from-log draws from), or None.

    The --db this process opened itself is reused; any other path is opened read-only, or read
    through the sidecar that serves it (collector.store.owner).
    """
    if own is not None or path is None:
        return own
    if not Path(path).exists():
        raise click.BadParameter(
            f"{path} does not exist; pass the sidecar's request log", param_hint="--traffic-db"
        )
    try:
        return stack.enter_context(open_request_log(path))
    except (OwnerError, duckdb.Error) as exc:
        raise click.ClickException(f"cannot read the request log {path} ({exc})") from None


def _class_settings(
    settings: ProbeSettings, workload: str | None, traffic: RequestStore | None = None
) -> list[ProbeSettings]:
    """One ProbeSettings per task class of the workload, or the one run without a workload."""
    if workload is None:
        return [settings]
    if workload == FROM_LOG:
        return [_from_log(settings, traffic)]
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
        runs.append(
            replace(
                settings,
                max_tokens=task.max_tokens,
                prompts=task.prompts,
                task_class=task.name,
                run_id=f"{base}-{task.name}",
                # an input class (workload `inputs:`): every prompt a filler of that many tokens
                lengths=() if task.prompt_tokens is None else ((task.prompt_tokens, task.max_tokens),),
            )
        )
    return runs


def _from_log(settings: ProbeSettings, traffic: RequestStore | None) -> ProbeSettings:
    """The settings of a from-log probe: lengths drawn from the traffic of the request log."""
    if traffic is None:
        raise click.BadParameter(
            f"{FROM_LOG} needs the request log to draw lengths from: pass --traffic-db (or --db)",
            param_hint="--workload",
        )
    try:
        lengths = log_lengths(traffic, model=settings.model, until=datetime.now(UTC), seed=settings.seed)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--workload") from None
    click.echo(
        f"lengths from the request log: {len(lengths.pairs)} traffic requests, mean prompt "
        f"{lengths.mean_prompt_tokens:.0f} and completion {lengths.mean_completion_tokens:.0f} tokens"
    )
    return replace(settings, lengths=lengths.pairs, prompts=FROM_LOG)


def _print_classes(estimates: list[CapacityEstimate]) -> None:
    """The per-class knees side by side, with each one's ratio to the first class."""
    first = estimates[0].knee.requests
    click.echo("\ntask class   knee   pool   knee / " + estimates[0].task_class)
    for estimate in estimates:
        ratio = estimate.knee.requests / first if first else float("nan")
        reached = "" if estimate.knee.reached else " (lower bound)"
        click.echo(
            f"{estimate.task_class:<12} {estimate.knee.requests:>4}{reached}   "
            f"{estimate.recommended_pool:>4}   {ratio:.2f}"
        )


def _write_outputs(estimates: list[CapacityEstimate], json_path: str | None, plot_path: str | None) -> None:
    """--json (one estimate, or {"classes": {name: estimate}}) and --plot (one per class)."""
    try:
        if json_path:
            data = (
                estimates[0].to_dict()
                if len(estimates) == 1
                else {"classes": {e.task_class: e.to_dict() for e in estimates}}
            )
            write_json(json_path, data, printed="the estimate is printed above, ")
            if json_path != "-":
                click.echo(f"wrote {json_path}")
        for estimate in estimates if plot_path is not None else ():
            path = Path(str(plot_path))
            if len(estimates) > 1:
                path = path.with_name(f"{path.stem}-{estimate.task_class}{path.suffix or '.png'}")
            png, html = write_plot(estimate, path)
            if (estimate.rates or {}).get("levels"):  # the open-loop ladder ran: its plot too
                click.echo(f"wrote {png}, {rates_plot_path(png)} and {html}")
            else:
                click.echo(f"wrote {png} and {html}")
    except OSError as exc:
        raise click.ClickException(
            f"cannot write {exc.filename or json_path or plot_path} ({exc.strerror}); the estimate is printed "
            "above, pass --json/--plot paths in a writable directory next time"
        ) from None


def _run_with_progress(settings: ProbeSettings, write: _WriteRows | None) -> ProbeResult:
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


@click.group("capacity")
def capacity() -> None:
    """Capacity formulas (KV-cache and quota ceilings), passive curves and the engine's split of
    TTFT from the request log.

    \b
    Examples:
      headroom capacity kv --gpu-memory-gb 96 --weights-gb 20 \\
          --layers 80 --kv-heads 8 --head-dim 128 --max-context 8192
      headroom capacity kv --usable-gb 57 --kv-per-request-gb 3
      headroom capacity quota --rpm 600 --tpm 1000000 --mean-e2e-s 10 --mean-tokens-per-request 4000
      headroom capacity curve --db headroom.duckdb --since 24h --caliber requests --json -
      headroom capacity split --db headroom.duckdb --since 7d    # where TTFT went, passive V_P, goodput
    """


register(capacity)
