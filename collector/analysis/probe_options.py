"""`headroom probe`'s options, each declared once with ProbeSettings' default, and the settings they make.

The command (collector.analysis.cli) takes them as keyword arguments; `settings_from_options` turns
them into the ProbeSettings the probe runs, renaming the few whose field names its unit
(`--timeout` -> `request_timeout_s`) and parsing the few given as text (`--levels 1,2,4` -> (1, 2, 4)).
The rest say what the command does around the run (where it reads and writes, how it recommends);
`--profile`'s default is estimate_from_probe's, which takes it. tests/test_probe_cli_options.py
checks that every option's default is the settings' and that every option reaches them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import click

from collector.analysis.estimate import estimate_from_probe
from collector.analysis.openloop import parse_rates
from collector.analysis.probe import ProbeSettings
from collector.analysis.prompts import load_prompts
from collector.analysis.recommend import PROFILES
from collector.capacity import Slo
from collector.lake.source import catalog_option
from collector.terminal import JSON_HELP

__all__ = ["RENAMED", "PARSED", "NOT_SETTINGS", "PROFILE", "probe_options", "settings_from_options"]

F = TypeVar("F", bound=Callable[..., Any])

# option -> ProbeSettings field, where the field names its unit
RENAMED = {
    "max_level_seconds": "max_level_s",
    "timeout_s": "request_timeout_s",
    "rate_seconds": "rate_level_s",
    "rate_warmup_seconds": "rate_warmup_s",
}
# option -> the ProbeSettings field it is parsed into: text lists into tuples, the SLO targets into
# its Slo, --rates into rates or rates_auto (and only then --rate-seconds and --rate-warmup-seconds
# into rate_level_s and rate_warmup_s)
PARSED = {
    "levels": "levels",
    "slo_ttft_p95": "slo",
    "slo_tpot_p95": "slo",
    "rates": "rates",
    "adapters": "adapters",
}
# options that are not a setting of the run: what the command does around it. (--sidecar-token is
# a setting, resolved by the command once it knows what --url is: collector.analysis.cli._token_for.)
NOT_SETTINGS = (
    "profile",
    "json_path",
    "plot_path",
    "db",
    "lake_uri",
    "catalog_uri",
    "workload",
    "traffic_db",
    "replica_class",
    "sidecar_token",
)
# --profile's default: the one estimate_from_probe recommends a pool with when given none
PROFILE: str = inspect.signature(estimate_from_probe).parameters["profile"].default

_OPTIONS = [
    click.option("--url", required=True, help="Base URL of the sidecar or the engine (OpenAI API)."),
    click.option(
        "--model", default=ProbeSettings.model, help="Model name to send; default: the first of /v1/models."
    ),
    click.option(
        "--levels",
        default=",".join(str(level) for level in ProbeSettings.levels),
        show_default=True,
        help="Concurrency ladder.",
    ),
    click.option(
        "--max-tokens",
        default=ProbeSettings.max_tokens,
        show_default=True,
        type=click.IntRange(1),
        help="Output length per request.",
    ),
    click.option(
        "--ignore-eos/--no-ignore-eos",
        default=ProbeSettings.ignore_eos,
        show_default=True,
        help="Lock the output length (vLLM / llama.cpp accept ignore_eos).",
    ),
    click.option(
        "--prompts",
        default=ProbeSettings.prompts,
        show_default=True,
        help="short, long, mixed, or a file with one prompt per line.",
    ),
    click.option("--slo-ttft-p95", type=float, default=Slo.ttft_p95_s, help="p95 TTFT target in seconds."),
    click.option("--slo-tpot-p95", type=float, default=Slo.tpot_p95_s, help="p95 TPOT target in seconds."),
    click.option(
        "--profile",
        type=click.Choice(list(PROFILES)),
        default=PROFILE,
        show_default=True,
        help="Pool recommendation profile.",
    ),
    click.option("--json", "json_path", default=None, metavar="PATH", help=JSON_HELP),
    click.option(
        "--plot",
        "plot_path",
        default=None,
        help="Write a PNG here (and an .html beside it); with --rates, the open-loop plot too, as NAME-rates.png.",
    ),
    click.option(
        "--db",
        default=None,
        help="DuckDB request log to append rows (source='probe') and the estimate to "
        "(through the sidecar while one serves it).",
    ),
    click.option(
        "--lake",
        "lake_uri",
        metavar="URI",
        help="In a fleet, instead of --db: save the estimate to the fleet's table "
        "headroom.capacity_estimates (beside headroom.requests, in this lake's catalog), where "
        "sidecars run with --lake and --catalog publish it; the probe's rows are logged by the sidecar "
        "it runs through. The traffic it is compared with: the table's last 7 days.",
    ),
    catalog_option,
    click.option(
        "--max-samples",
        default=ProbeSettings.max_samples,
        show_default=True,
        help="Per-level cap on measured requests.",
    ),
    click.option(
        "--max-level-seconds",
        default=ProbeSettings.max_level_s,
        show_default=True,
        help="Per-level cap on measuring time (after warm-up; a level ends by 2x this whatever).",
    ),
    click.option(
        "--timeout",
        "timeout_s",
        default=ProbeSettings.request_timeout_s,
        show_default=True,
        help="Per-request timeout (s).",
    ),
    click.option(
        "--endpoint",
        type=click.Choice(["/v1/chat/completions", "/v1/completions"]),
        default=ProbeSettings.endpoint,
        show_default=True,
        help="The OpenAI route the load goes to (chat, or plain completions for a base model).",
    ),
    click.option("--seed", default=ProbeSettings.seed, show_default=True, help="Seed of the prompt order."),
    click.option(
        "--api-key",
        envvar="OPENAI_API_KEY",
        default=ProbeSettings.api_key,
        help="Bearer token for the server under test [env: OPENAI_API_KEY]; never stored.",
    ),
    click.option(
        "--sidecar-token",
        envvar="HEADROOM_TOKEN",
        default=ProbeSettings.sidecar_token,
        help="The token of the headroom sidecar at --url, sent in X-Headroom-Probe-Token: it makes the "
        "sidecar log this load as the probe's; without it the sidecar counts it as traffic. From "
        "HEADROOM_TOKEN it is sent only when --url is a headroom sidecar (its /metrics says so); "
        "default: the token of the sidecar that owns --db, when --url is that sidecar. Never stored.",
    ),
    click.option(
        "--workload",
        default=None,
        metavar="FILE|classes|from-log",
        help="Measure one gradient per task class (YAML: classes with name, max_tokens, "
        "prompts, and optional inputs with name, prompt_tokens: prompt-length classes, each class "
        "measured once per input; 'classes' = short 128, medium 512, long 1200 tokens); each class "
        "gets its own knee and pool (and μ_slo with --rates). 'from-log': one gradient whose prompt and output "
        "lengths are drawn from the traffic of the request log (--traffic-db). Replaces --max-tokens and --prompts.",
    ),
    click.option(
        "--traffic-db",
        default=None,
        metavar="PATH",
        help="Request log whose traffic (the 7 days before the probe) gives the token capacity "
        "its length mix (the knee times the time-weighted tokens per request in flight), and "
        "--workload from-log draws from; default: --db. Read through the sidecar while one "
        "serves it. Without one (or with under 50 answered requests) the token capacity is "
        "withheld.",
    ),
    click.option(
        "--engine-metrics",
        default=ProbeSettings.engine_metrics,
        show_default=True,
        metavar="auto|none|URL",
        help="Where the probe reads the engine's queue, the knee's evidence: auto = "
        "URL/metrics when it names an engine (vLLM, SGLang, TGI, llama.cpp, or a "
        "headroom sidecar); none = judge queueing from TTFT alone.",
    ),
    click.option(
        "--replica-class",
        default=None,
        metavar="NAME",
        show_default="the class of the sidecar at --url (its headroom_replica_info), else default",
        help="The replica class (hardware x engine configuration) the estimate is for: the knee the "
        "rules compare that class's sidecars with.",
    ),
    click.option(
        "--rates",
        default=None,
        metavar="auto|R1,R2,...",
        help="After the gradient, an open-loop ladder: Poisson arrivals at these requests/s (or "
        "'auto': a bracket around the knee's rate, knee / mean e2e at the knee) to measure μ_slo, the "
        "highest rate within the SLO whose queue does not drift, and V_P, the prefill tokens/s there; "
        "checked against the knee by Little's law and published with it.",
    ),
    click.option(
        "--rate-seconds",
        default=ProbeSettings.rate_level_s,
        show_default=True,
        type=click.FloatRange(1.0),
        help="Measuring time per --rates level (after --rate-warmup-seconds); a level past capacity ends early.",
    ),
    click.option(
        "--rate-warmup-seconds",
        default=ProbeSettings.rate_warmup_s,
        show_default=True,
        type=click.FloatRange(0.0),
        help="Arrivals per --rates level before measuring starts (the queue settles).",
    ),
    click.option(
        "--adapters",
        default=None,
        metavar="A,B,...",
        help="LoRA adapters of the model to put in the mix: each request names the next one in its "
        "`model` (in turn, so concurrent requests name different adapters), to measure the knee with "
        "that many adapters competing for the engine's adapter slots. The estimate records how many.",
    ),
]


def probe_options(command: F) -> F:
    """Attach every `headroom probe` option, in --help order."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def settings_from_options(options: dict[str, Any]) -> ProbeSettings:
    """The ProbeSettings of `headroom probe`'s options (all but NOT_SETTINGS'); a bad value is a
    click usage error naming its option."""
    fields = {
        RENAMED.get(name, name): value
        for name, value in options.items()
        if name not in NOT_SETTINGS and name not in PARSED
    }
    # the open-loop ladder's timings: set only with --rates (without one there is nothing to time)
    timing = {name: fields.pop(name) for name in ("rate_level_s", "rate_warmup_s")}
    fields["levels"] = _levels(options["levels"])
    fields["slo"] = Slo(ttft_p95_s=options["slo_ttft_p95"], tpot_p95_s=options["slo_tpot_p95"])
    fields["adapters"] = _adapter_names(options["adapters"])
    fields.update(_rate_settings(options["rates"], timing))
    try:
        load_prompts(fields["prompts"])  # fails before any load is sent
        return ProbeSettings(**fields)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a comma-separated list of integers, e.g. 1,2,4,8", param_hint="--levels"
        ) from None
    if not levels or levels[0] < 1:
        raise click.BadParameter(
            f"{text!r}: levels must be positive integers, e.g. 1,2,4,8", param_hint="--levels"
        )
    return levels


def _adapter_names(text: str | None) -> tuple[str, ...]:
    """--adapters a,b,... as names, in order, each once; () without it."""
    if text is None:
        return ()
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    if not names:
        raise click.BadParameter("give adapter names, e.g. sql-lora,chat-lora", param_hint="--adapters")
    return names


def _rate_settings(rates: str | None, timing: dict[str, float]) -> dict[str, Any]:
    """ProbeSettings' open-loop fields from --rates and its timings (rate_level_s, rate_warmup_s)."""
    if rates is None:
        return {}
    if rates.strip() == "auto":
        return {"rates_auto": True, **timing}
    try:
        return {"rates": parse_rates(rates), **timing}
    except ValueError as exc:
        raise click.BadParameter(f"{exc}, or auto", param_hint="--rates") from None
