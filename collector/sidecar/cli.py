"""`headroom run`: the sidecar command line (thin shell over build_sidecar and uvicorn).

Its options are declared once, with SidecarConfig's defaults, in collector.sidecar.options.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click
import uvicorn

from collector.sidecar.options import config_from_options, sidecar_options

__all__ = ["run"]


@click.command("run")
@sidecar_options
def run(**options: Any) -> None:  # click passes each option by its name (collector.sidecar.options)
    """Run the sidecar: proxy the OpenAI API and export dual-caliber concurrency.

    \b
    Examples:
      headroom run --upstream http://127.0.0.1:8000
      headroom run --upstream http://vllm:8000 --listen 0.0.0.0:9100 --engine vllm
      headroom run --upstream http://vllm:8000 --listen 0.0.0.0:9100 --admin-listen 0.0.0.0:9101
      headroom run --upstream http://127.0.0.1:8080 --engine llamacpp --max-tenants 20
      headroom run --upstream http://127.0.0.1:8080 --engine llamacpp --model gemma-3-270m
      headroom run --upstream http://vllm:8000 --max-series 5000 --max-models 40
      headroom run --upstream http://sglang:30000 --engine sglang --adapter sql-lora=llama-3-8b
      headroom run --upstream http://10.0.0.5:8000 --engine generic --engine-mapping my-engine.yaml
      headroom run --upstream http://127.0.0.1:8000 --db headroom.duckdb --probe-db probes.duckdb
      headroom run --upstream http://vllm:8000 --lake s3://llm-logs/headroom --spool-dir /var/spool/headroom
      headroom run --upstream http://l40s-pod:8000 --replica-class l40s-tp1 --lake s3://llm-logs/headroom
      OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector:4318 headroom run --upstream http://vllm:8000 --otlp-metrics

    Point clients at http://LISTEN/v1 instead of the engine; scrape http://LISTEN/metrics
    (http://ADMIN-LISTEN/metrics with --admin-listen).
    """
    # lazy: `headroom run --help` must not load the whole sidecar
    from collector.sidecar.descriptors import fit_connection_cap
    from collector.sidecar.server import uvicorn_options
    from collector.sidecar.wiring import build_sidecar, sidecar_state
    from collector.store.schema import SchemaTooNew  # no DuckDB: the --db store's columns

    log_level: str = options["log_level"]
    os.umask(0o077)  # the request log, its WAL and the spool are readable by this user only
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # APScheduler narrates every job it adds and runs at INFO; its warnings still show.
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, logging.getLevelName(log_level.upper())))
    try:
        config = config_from_options(options)
        app = build_sidecar(config)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:  # the spool directory or --lake cannot be created or written
        raise click.ClickException(f"cannot open the spool or --lake ({exc})") from None
    except _db_errors() as exc:  # locked by another process, not DuckDB, too new
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = (
            "only one process may own it: stop the other one, or give this sidecar its own --db"
            if "lock" in first.lower()
            else ""
            if isinstance(exc, SchemaTooNew)
            else "pass a DuckDB file headroom wrote, or a new path"
        )
        raise click.ClickException(
            f"cannot open --db {options['db_path']} ({first})" + (f"; {hint}" if hint else "")
        ) from None
    host, port, admin = config.listen_host, config.listen_port, config.admin_listen
    click.echo(
        f"headroom sidecar: http://{host}:{port} -> {config.upstream} "
        f"(metrics at {'' if admin is None else f'http://{admin[0]}:{admin[1]}'}/metrics, "
        f"log: {config.lake or os.path.abspath(options['db_path'])})",
        err=True,
    )
    # descriptors for every allowed client, the upstream pool, and the files the sidecar opens;
    # the cap clamped (one WARNING) where the open-file limit cannot be raised that far
    max_client_connections = fit_connection_cap(config.max_client_connections, config.max_connections)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=30,
        proxy_headers=False,  # nothing reads the client address, and the layer costs per request
        **uvicorn_options(
            sidecar_state(app).registry,
            header_timeout_s=config.header_timeout_s,
            body_timeout_s=config.body_timeout_s,
            idle_timeout_s=config.idle_timeout_s,
            max_connections=max_client_connections,
            max_connections_per_source=config.max_connections_per_source,
            max_partial_requests_per_source=config.max_partial_requests_per_source,
            write_stall_timeout_s=config.write_stall_timeout_s,
        ),
    )


def _db_errors() -> tuple[type[Exception], ...]:
    """What opening --db raises (DuckDB's errors, SchemaTooNew), asked once something was raised. A
    --lake sidecar never loads DuckDB (docs/operations.md, "Installing"): then none of its errors
    can have been raised, and DuckDB is not loaded to name them."""
    from collector.store.schema import SchemaTooNew  # lazy: like run's imports

    duckdb = sys.modules.get("duckdb")
    return (SchemaTooNew,) if duckdb is None else (duckdb.Error, SchemaTooNew)
