"""`headroom integrations keda|gateway|llm-d`: scaling settings rendered from a stored estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from collector.capacity import ALL_TASKS, CapacityEstimate
from collector.lake.source import reader_options

__all__ = ["integrations"]


def _load_estimate(
    db: str | None,
    estimate_file: str | None,
    lake: tuple[str | None, str | None, str],
    model: str | None,
    replica_class: str | None = None,
) -> CapacityEstimate:
    """The published estimate for `model` (or the only model) from --db, --lake or --estimate:
    what the gauges publish (collector.store.decision), never merely the newest one. A --db that a
    sidecar holds is asked of that sidecar (its published estimates, not a copy of the database)."""
    # lazy: `headroom integrations --help` must not load DuckDB
    import duckdb
    import orjson

    from collector.lake.source import open_log
    from collector.store.decision import published_estimates, unusable
    from collector.store.owner import OwnerError, read_published

    catalog_uri, lake_uri, table = lake
    if [db, estimate_file, lake_uri].count(None) != 2:
        raise click.UsageError(
            "give exactly one of --db PATH, --lake URI (with --catalog) or --estimate FILE"
        )
    estimates: list[CapacityEstimate]
    try:
        if estimate_file:
            estimates = [CapacityEstimate.from_dict(orjson.loads(Path(estimate_file).read_bytes()))]
            if (trouble := unusable(estimates[0])) is not None:
                raise click.ClickException(f"{estimate_file} would not be published: {trouble}")
        elif db is not None:
            estimates = [p.estimate for p in read_published(db)]
        else:
            with open_log(None, catalog_uri, lake_uri, table=table) as store:
                estimates = [p.estimate for p in published_estimates(store)]
    except (OSError, ValueError, KeyError, TypeError, OwnerError, duckdb.Error) as exc:
        source = estimate_file or lake_uri or db
        raise click.ClickException(f"cannot read an estimate from {source} ({exc})") from None
    # one estimate per model and replica class (task class all) is what a replica scales on
    matching = [
        e
        for e in estimates
        if (model is None or e.model == model)
        and (replica_class is None or e.replica_class == replica_class)
        and e.task_class == ALL_TASKS
    ]
    if len(matching) != 1:
        models = sorted(f"{e.model} (replica class {e.replica_class})" for e in estimates) or [
            "none passes the publication gate: run `headroom probe` (see `headroom capacity curve`)"
        ]
        several_classes = len({e.replica_class for e in matching}) > 1
        raise click.ClickException(
            f"{'no' if not matching else 'several'} published estimates match "
            f"--model {model or '(any)'} --replica-class {replica_class or '(any)'}; "
            f"published: {', '.join(models)}"
            + ("; pass --replica-class (one output per class)" if several_classes else "")
            + ("; pass --model" if len(matching) > 1 and not several_classes else "")
        )
    return matching[0]


def _emit(
    document: dict[str, Any],
    out: str | None,
    header: str = "from a stored llm-headroom capacity estimate; rerender after a new probe",
    comments: tuple[str, ...] | list[str] = (),
) -> None:
    from collector.rules.render import render_yaml  # lazy: PyYAML only when something is written

    body = render_yaml(document, "integrations").split("\n", 1)[1]  # our own header, not "do not edit"
    text = f"# Rendered by `headroom integrations` {header}.\n" + "".join(f"# {c}\n" for c in comments) + body
    if out:
        Path(out).write_text(text)
        click.echo(f"wrote {out}", err=True)
    else:
        click.echo(text, nl=False)


def _source_options(command: Any) -> Any:
    command = reader_options(command)
    for option in reversed(
        (
            click.option(
                "--db",
                default=None,
                help="Request log holding the estimate (through its sidecar while one serves it).",
            ),
            click.option(
                "--estimate", "estimate_file", default=None, help="An estimate JSON (headroom probe --json)."
            ),
            click.option(
                "--model", default=None, help="Which model's estimate (needed when several have one)."
            ),
            click.option(
                "--replica-class",
                default=None,
                metavar="NAME",
                help="Which replica class's estimate (needed when the model has several: render one "
                "output per class, e.g. one ScaledObject per Deployment of a hardware class).",
            ),
            click.option("--out", default=None, help="Write the YAML here instead of stdout."),
        )
    ):
        command = option(command)
    return command


@click.group("integrations")
def integrations() -> None:
    """Hand the measured knee to the tools that act on it, from a stored capacity estimate.

    \b
    Examples:
      headroom integrations keda --db headroom.duckdb --deployment llm-inference
      headroom integrations gateway --estimate cap.json --mode tokens
      headroom integrations llm-d --db headroom.duckdb --model Qwen/Qwen2.5-1.5B-Instruct
      headroom integrations keda --db fleet.duckdb --model llama-70b --replica-class l40s --deployment llama-l40s
    """


def _render(kind: str, estimate: CapacityEstimate, **options: Any) -> dict[str, Any]:
    from collector.integrations import render  # lazy: keeps `--help` free of the rules package

    try:
        rendered: dict[str, Any] = getattr(render, kind)(estimate, **options)
        return rendered
    except render.EstimateError as exc:
        raise click.ClickException(str(exc)) from None


@integrations.command("keda")
@_source_options
@click.option("--deployment", required=True, help="The Deployment KEDA scales (the inference pods).")
@click.option(
    "--namespace", default="default", show_default=True, help="Namespace of the inference Deployment."
)
@click.option(
    "--prometheus-url",
    default="http://prometheus-operated.monitoring.svc:9090",
    show_default=True,
    help="Where KEDA's Prometheus scaler queries.",
)
@click.option(
    "--min-replicas",
    default=1,
    show_default=True,
    type=click.IntRange(0),
    help="KEDA's minReplicaCount (0 lets it scale the model to zero).",
)
@click.option(
    "--max-replicas",
    default=10,
    show_default=True,
    type=click.IntRange(1),
    help="KEDA's maxReplicaCount: the ceiling the capacity alerts tell on-call to check first.",
)
@click.option(
    "--cluster",
    default=None,
    metavar="NAME",
    help='Scale on this cluster\'s sidecars only (cluster="NAME"): for a Prometheus that holds '
    "several clusters' series (a central ruler, Thanos, Mimir, VictoriaMetrics).",
)
@click.option(
    "--rate-utilisation",
    default=None,
    type=click.FloatRange(0.0, 1.0, min_open=True),
    show_default="0.8",
    help="With a published μ_slo (probe --rates): the share of it a replica is scaled to carry; the "
    "rate trigger's threshold is μ_slo x this.",
)
def keda(
    db: str | None,
    estimate_file: str | None,
    model: str | None,
    replica_class: str | None,
    out: str | None,
    deployment: str,
    namespace: str,
    prometheus_url: str,
    min_replicas: int,
    max_replicas: int,
    cluster: str | None,
    rate_utilisation: float | None,
    lake_uri: str | None,
    catalog_uri: str | None,
    lake_table: str,
) -> None:
    """A KEDA ScaledObject: replicas = live concurrency ÷ the measured per-replica pool, both calibers.

    \b
    Examples:
      headroom integrations keda --db headroom.duckdb --deployment llm-inference
      headroom integrations keda --estimate cap.json --deployment vllm --max-replicas 40 --out scaledobject.yaml
      headroom integrations keda --db headroom.duckdb --deployment vllm --cluster eu-1 \\
        --prometheus-url http://mimir-query-frontend.mimir.svc:8080/prometheus
      headroom integrations keda --db fleet.duckdb --model llama-70b --replica-class h100 --deployment llama-h100

    With --replica-class (or an estimate of a class other than "default") the ScaledObject counts
    only that class's sidecars (headroom_replica_info) and reads that class's published gauges.
    """
    estimate = _load_estimate(db, estimate_file, (catalog_uri, lake_uri, lake_table), model, replica_class)
    _emit(
        _render(
            "keda_scaled_object",
            estimate,
            deployment=deployment,
            namespace=namespace,
            prometheus_url=prometheus_url,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            cluster=cluster,
            **({} if rate_utilisation is None else {"rate_utilisation": rate_utilisation}),
        ),
        out,
    )


@integrations.command("gateway")
@_source_options
@click.option(
    "--mode",
    type=click.Choice(["requests", "tokens"]),
    default="requests",
    show_default=True,
    help="The concurrency detector's caliber.",
)
def gateway(
    db: str | None,
    estimate_file: str | None,
    model: str | None,
    replica_class: str | None,
    out: str | None,
    mode: str,
    lake_uri: str | None,
    catalog_uri: str | None,
    lake_table: str,
) -> None:
    """Gateway API Inference Extension: an EndpointPickerConfig whose concurrency detector takes the
    pool as maxConcurrency / maxTokenConcurrency and allows bursts up to the knee. A comment per
    threshold says the measured number it comes from, the estimate's source and its age. With no
    estimate that passes the publication gate nothing is rendered, and the gateway keeps its own
    saturation detector (its default queue-depth and KV-cache thresholds).

    \b
    Examples:
      headroom integrations gateway --db headroom.duckdb
      headroom integrations gateway --estimate cap.json --mode tokens --out epp-config.yaml
    """
    from collector.integrations.render import GATEWAY_FALLBACK, gateway_comments  # lazy: as _render

    try:
        estimate = _load_estimate(
            db, estimate_file, (catalog_uri, lake_uri, lake_table), model, replica_class
        )
    except click.ClickException as exc:
        raise click.ClickException(f"{exc.message}; {GATEWAY_FALLBACK}") from None
    config = _render("gateway_picker_config", estimate, mode=mode)
    _emit(config, out, comments=gateway_comments(estimate, mode=mode))


@integrations.command("llm-d")
@_source_options
@click.option("--namespace", default="default", show_default=True, help="The model's namespace.")
def llm_d(
    db: str | None,
    estimate_file: str | None,
    model: str | None,
    replica_class: str | None,
    out: str | None,
    namespace: str,
    lake_uri: str | None,
    catalog_uri: str | None,
    lake_table: str,
) -> None:
    """llm-d's Workload Variant Autoscaler: the saturation ConfigMap entry for the measured model.

    \b
    Examples:
      headroom integrations llm-d --db headroom.duckdb --namespace llm
      headroom integrations llm-d --estimate cap.json --out wva-saturation.yaml
    """
    _emit(
        _render(
            "llmd_saturation_config",
            _load_estimate(db, estimate_file, (catalog_uri, lake_uri, lake_table), model, replica_class),
            namespace=namespace,
        ),
        out,
    )


@integrations.command("prometheusrule")
@click.option("--namespace", default=None, help="Namespace of the PrometheusRule (default: none, kubectl's).")
@click.option("--out", default=None, help="Write the YAML here instead of stdout.")
def prometheusrule(namespace: str | None, out: str | None) -> None:
    """The generated recording and alerting rules as one PrometheusRule (Prometheus Operator).

    \b
    Examples:
      headroom integrations prometheusrule --out deploy/kubernetes/prometheusrule.yaml
      headroom integrations prometheusrule --namespace monitoring | kubectl apply -f -
    """
    # lazy: the rule generators load only for this command
    from collector.alerts.files import rule_files
    from collector.integrations.kubernetes import prometheus_rule

    _emit(
        prometheus_rule(rule_files(), namespace=namespace),
        out,
        "from the same generators as alerts/*.rules.yaml; rerender after `headroom alerts generate`",
    )
