"""What the sidecar costs, next to the floor (a bare pass-through) and the peer (LiteLLM), one run.

    python benchmarks/proxy_overhead.py                      # the BENCHMARKS.md table
    python benchmarks/proxy_overhead.py --rounds 3 --round-s 3 --workloads 64:flood --no-litellm
    python benchmarks/proxy_overhead.py --chunks 1 --workloads 64:flood --no-litellm  # CPU per request
    python benchmarks/proxy_overhead.py --extra-target 'asgi=python benchmarks/x.py {port} {upstream}'

One independent upstream (benchmarks/sse_upstream.py: asyncio streams, 64 one-token chunks per
answer), and the targets in front of it, each its own process: `direct` (no proxy),
`passthrough` (benchmarks/passthrough_proxy.py, aiohttp copying bytes: the floor), `headroom`
(`headroom run`, the accounted path /v1/chat/completions with its DuckDB request log) and
`litellm` (LiteLLM's proxy in its own virtualenv, skipped with a message when it cannot be
installed). The load generator is this process (benchmarks/_load.py).

A workload is STREAMS:PACE (`flood`: the upstream yields between chunks but never waits; `50`:
50 tokens/s per stream). Flood workloads also run the vLLM-style stream (`"usage":null` in
every chunk plus the final usage chunk) through headroom, to compare with the plain stream. In
each round every (target, style) runs once for --round-s seconds, in an order that rotates
round by round, so drift on a shared machine spreads over all of them. Reported per workload:
token chunks/s (median of the rounds) and its ratios, TTFT p50/p99 over all rounds and what a
proxy adds to direct's, the proxy's CPU per chunk, and its resident memory at the end. The
upstream's and this process's CPU per chunk are in the JSON too (`upstream_cpu_us_per_chunk`,
`client_cpu_us_per_chunk`): on 2 cores, whatever a proxy makes the other two spend (more reads,
more wake-ups) costs chunk rate as surely as its own CPU does. `chunks_per_client_read` says how
many token chunks each of the load generator's reads carried: a proxy that forwards sooner, in
smaller pieces, makes the client read more often for the same chunks.

TTFT is also reported over the *clean* requests only (`clean_*`): those whose interval from
sending to first token touched no second in which the host stole more than --max-steal percent
of the CPUs (/proc/stat; benchmarks/_common.StealSampler). Every target loses its stolen
seconds alike, so what a proxy adds in them is its own, not the host's.

Under the table, each flood target of the sidecar (chunk rate >= 0.95x the pass-through's, CPU
per chunk <= 1.2x, vLLM-style >= 0.98x plain) gets a verdict from its per-round ratios: the
median with a 95 % distribution-free interval, `met` or `missed` only when the whole interval
is on one side of the target, else `undecided` (benchmarks/_verdict.py). The vLLM-style
target needs more pairs than these rounds give (its windows sit seconds apart, between the other
targets'): benchmarks/style_pairs.py decides it on 200 ABBA pairs of 1.5 s windows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from _common import PYTHON, StealSampler, checkout_env, cpu_seconds, free_port, rss_mib, start, stop_all
from _load import drive_for, percentile_ms
from _verdict import describe
from litellm_target import start_litellm

ACCOUNTED = "/v1/chat/completions"
RATE_TARGET = 0.95  # chunk rate at flood, against the pass-through's in the same round
CPU_TARGET = 1.2  # CPU per chunk, likewise
STYLE_TARGET = 0.98  # vLLM-style streams against plain ones through headroom
# the other two processes on the box, charged per chunk too: on 2 cores what a proxy costs them
# (reads, writes, wake-ups) is chunk rate lost as surely as its own CPU
SIDES: dict[str, int] = {}  # "upstream", "client" -> pid; set in main


@dataclass
class Target:
    name: str
    url: str
    process: subprocess.Popen | None  # None: nothing of ours to charge CPU to (direct)
    runs: dict = field(default_factory=dict)  # (workload, style) -> list of per-round results


def _headroom(
    upstream: str, launcher: list[str] | None = None, lake: bool = False
) -> tuple[str, subprocess.Popen]:
    """`headroom run` on a free port (`launcher`: a script to run instead of `-m collector.cli`),
    logging into a DuckDB file in a temporary directory, or with `lake` staging Parquet files into
    one (`--lake DIR --spool-dir DIR/spool`, no catalog)."""
    port = free_port()
    scratch = tempfile.mkdtemp()
    log = (
        ["--lake", scratch + "/lake", "--spool-dir", scratch + "/spool"]
        if lake
        else ["--db", scratch + "/bench.duckdb"]
    )
    process = start(
        [
            PYTHON,
            *(launcher or ["-m", "collector.cli"]),
            "run",
            "--upstream",
            upstream,
            "--listen",
            f"127.0.0.1:{port}",
            *log,
            "--engine",
            "none",
            "--log-level",
            "error",
        ],
        f"http://127.0.0.1:{port}/healthz",
    )
    return f"http://127.0.0.1:{port}", process


def _command(template: str, upstream: str) -> tuple[str, subprocess.Popen]:
    """An --extra-target; `env PYTHONPATH=CHECKOUT {python} -m ...` imports that checkout's code
    (checkout_env: without PYTHONSAFEPATH, `-m` would import this checkout's)."""
    port = free_port()
    args = [part.format(port=port, upstream=upstream, python=PYTHON) for part in template.split()]
    return f"http://127.0.0.1:{port}", start(args, f"http://127.0.0.1:{port}/healthz", env=checkout_env())


def start_targets(args, upstream: str, upstream_process: subprocess.Popen) -> list[Target]:
    """Every target the options ask for, started and answering."""
    targets = [Target("direct", upstream, None)]
    port = free_port()
    targets.append(
        Target(
            "passthrough",
            f"http://127.0.0.1:{port}",
            start(
                [PYTHON, "benchmarks/passthrough_proxy.py", str(port), upstream], f"http://127.0.0.1:{port}/"
            ),
        )
    )
    url, process = _headroom(upstream)
    targets.append(Target("headroom", url, process))
    for spec in args.extra_target:
        name, _, template = spec.partition("=")
        url, process = _command(template, upstream)
        targets.append(Target(name, url, process))
    if args.litellm:
        port = free_port()
        process = start_litellm(port, upstream)
        if process is not None:
            targets.append(Target("litellm", f"http://127.0.0.1:{port}", process))
    return targets


def _units(targets: list[Target], pace: str, vllm_targets: set[str]) -> list[tuple[Target, str]]:
    units = [(target, "plain") for target in targets]
    if pace == "flood":
        units += [(target, "vllm") for target in targets if target.name in vllm_targets]
    return units


def measure(
    target: Target,
    streams: int,
    pace: str,
    style: str,
    seconds: float,
    answer_chunks: int = 64,
    path: str = ACCOUNTED,
) -> dict:
    """One time-boxed round of one target at `path`: chunks/s, TTFT samples, CPU per chunk."""
    headers = {
        "x-chunks": str(answer_chunks),
        "x-pace-ms": "0" if pace == "flood" else str(1000 // int(pace)),
        "x-style": style,
    }
    pid = target.process.pid if target.process else None
    pids = {"proxy": pid, **SIDES}

    def read() -> dict[str, float]:
        return {name: cpu_seconds(p) if p else 0.0 for name, p in pids.items()}

    cpu = {"start": read()}
    at_deadline = lambda: cpu.__setitem__("end", read())  # noqa: E731
    result = asyncio.run(drive_for(target.url + path, streams, seconds, headers, at_deadline))
    spent = {name: cpu["end"][name] - cpu["start"][name] for name in pids}
    cpu_s = spent["proxy"]
    chunks = max(1, result.token_chunks)
    return {
        **{f"{name}_cpu_us_per_chunk": spent[name] / chunks * 1e6 for name in SIDES},
        "chunks_per_s": result.chunks_per_s,
        "chunks_per_client_read": result.token_chunks / max(1, result.reads),
        "ttft_s": result.ttft_s,
        "ttft_at": result.ttft_at,
        "failed": result.failed,
        "cpu_us_per_chunk": cpu_s / chunks * 1e6 if pid else None,
    }


def summarise(runs: list[dict], steal: StealSampler | None = None, max_steal: float = 2.0) -> dict:
    """Median rate and CPU over the rounds; TTFT percentiles over every sample of every round,
    and over the clean ones (no second of the request's wait with more than `max_steal` % steal)."""
    ttft = [t for run in runs for t in run["ttft_s"]]
    clean = [
        t
        for run in runs
        for t, at in zip(run["ttft_s"], run["ttft_at"])
        if steal is None or steal.worst(at, at + t) <= max_steal
    ]
    cpus = [run["cpu_us_per_chunk"] for run in runs if run["cpu_us_per_chunk"] is not None]
    sides = {
        f"{name}_cpu_us_per_chunk": round(
            statistics.median(run[f"{name}_cpu_us_per_chunk"] for run in runs), 2
        )
        for name in SIDES
    }
    return {
        "chunks_per_s": round(statistics.median(run["chunks_per_s"] for run in runs), 1),
        **sides,
        "chunks_per_client_read": round(statistics.median(run["chunks_per_client_read"] for run in runs), 2),
        "ttft_p50_ms": percentile_ms(ttft, 0.50),
        "ttft_p99_ms": percentile_ms(ttft, 0.99),
        "clean_requests": f"{len(clean)} of {len(ttft)}",
        "clean_ttft_p50_ms": percentile_ms(clean, 0.50),
        "clean_ttft_p99_ms": percentile_ms(clean, 0.99),
        "cpu_us_per_chunk": round(statistics.median(cpus), 2) if cpus else None,
        "failed": sum(run["failed"] for run in runs),
        "rounds": len(runs),
    }


def compare(summary: dict[str, dict]) -> dict:
    """Ratios against direct and the pass-through, and the TTFT each proxy adds to direct's."""
    direct, floor = summary["direct/plain"], summary["passthrough/plain"]
    out = {}
    for key, row in summary.items():
        if key.startswith("direct/"):
            continue
        out[key] = {
            "over_direct": round(row["chunks_per_s"] / direct["chunks_per_s"], 3),
            "over_passthrough": round(row["chunks_per_s"] / floor["chunks_per_s"], 3),
            "added_ttft_p50_ms": round(row["ttft_p50_ms"] - direct["ttft_p50_ms"], 1),
            "added_ttft_p99_ms": round(row["ttft_p99_ms"] - direct["ttft_p99_ms"], 1),
            "clean_added_ttft_p50_ms": round(row["clean_ttft_p50_ms"] - direct["clean_ttft_p50_ms"], 1),
            "clean_added_ttft_p99_ms": round(row["clean_ttft_p99_ms"] - direct["clean_ttft_p99_ms"], 1),
        }
        if row["cpu_us_per_chunk"] and floor["cpu_us_per_chunk"]:
            out[key]["cpu_over_passthrough"] = round(row["cpu_us_per_chunk"] / floor["cpu_us_per_chunk"], 2)
    if "headroom/vllm" in summary:
        out["headroom/vllm"]["over_headroom_plain"] = round(
            summary["headroom/vllm"]["chunks_per_s"] / summary["headroom/plain"]["chunks_per_s"], 3
        )
    return out


def run_workload(targets: list[Target], workload: str, args) -> dict:
    """Every unit of one workload, args.rounds times, alternating the order round by round."""
    streams_text, _, pace = workload.partition(":")
    streams, pace = int(streams_text), pace or "flood"
    units = _units(targets, pace, set(args.vllm_targets.split(",")))
    runs: dict[str, list] = {f"{t.name}/{style}": [] for t, style in units}
    for round_index in range(args.rounds):
        shift = round_index % len(units)
        for target, style in units[shift:] + units[:shift]:
            runs[f"{target.name}/{style}"].append(
                measure(target, streams, pace, style, args.round_s, args.chunks)
            )
    summary = {key: summarise(value, args.steal, args.max_steal) for key, value in runs.items()}
    for key, rounds in runs.items():  # in the order they ran: a drift over the run shows here
        summary[key]["chunks_per_s_in_round_order"] = [round(r["chunks_per_s"]) for r in rounds]
        summary[key]["cpu_us_per_chunk_in_round_order"] = [
            None if r["cpu_us_per_chunk"] is None else round(r["cpu_us_per_chunk"], 2) for r in rounds
        ]
    compared = compare(summary)
    for key, spread in by_round(runs).items():
        compared.setdefault(key, {}).update(spread)
    return {"streams": streams, "pace": pace, "targets": summary, "compare": compared}


def by_round(runs: dict[str, list]) -> dict[str, dict]:
    """Each proxy's ratios to the pass-through round by round, sorted: the pass-through ran in the
    same round, seconds apart, so the spread of these says how far one run's median can be
    trusted on this host (a 0.95 target read off a median whose rounds span 0.87-1.02 is not met
    or missed, it is unknown)."""
    floor = runs["passthrough/plain"]
    out = {}
    for key, rounds in runs.items():
        if key.startswith(("direct/", "passthrough/")):
            continue
        rates = [r["chunks_per_s"] / f["chunks_per_s"] for r, f in zip(rounds, floor) if f["chunks_per_s"]]
        cpus = [
            r["cpu_us_per_chunk"] / f["cpu_us_per_chunk"]
            for r, f in zip(rounds, floor)
            if r["cpu_us_per_chunk"] and f["cpu_us_per_chunk"]
        ]
        out[key] = {
            "over_passthrough_by_round": sorted(round(x, 3) for x in rates),
            "cpu_over_passthrough_by_round": sorted(round(x, 2) for x in cpus),
        }
        if rates:  # the targets, decided on the rounds (benchmarks/_verdict.py)
            out[key]["rate_verdict"] = describe(rates, at_least=RATE_TARGET)
        if cpus:
            out[key]["cpu_verdict"] = describe(cpus, at_most=CPU_TARGET)
    styles: dict[str, list[float]] = {}
    for key in runs:  # each round's vLLM-style stream against the plain one beside it, per target
        if key.endswith("/vllm"):
            name = key.removesuffix("/vllm")
            styles[name] = [
                v["chunks_per_s"] / p["chunks_per_s"] for v, p in zip(runs[key], runs[f"{name}/plain"])
            ]
            row = out.setdefault(key, {})
            row["over_plain_by_round"] = sorted(round(x, 3) for x in styles[name])
            row["style_verdict"] = describe(styles[name], at_least=STYLE_TARGET)
    if "headroom" in styles and "direct" in styles:
        # the upstream writes more per vLLM-style event, and on 2 cores that costs every target's
        # rate: headroom's style ratio over direct's, round by round, is what the sidecar adds
        relative = [h / d for h, d in zip(styles["headroom"], styles["direct"])]
        out["headroom/vllm"]["over_direct_style_by_round"] = sorted(round(x, 3) for x in relative)
        out["headroom/vllm"]["sidecar_style_verdict"] = describe(relative, at_least=STYLE_TARGET)
    return out


def verdicts(results: list[dict]) -> str:
    """The verdict lines under the table: each flood target decided on its rounds, or undecided."""
    lines = []
    for result in results:
        if result["pace"] != "flood":
            continue
        for key, row in sorted(result["compare"].items()):
            for name in ("rate_verdict", "cpu_verdict", "style_verdict", "sidecar_style_verdict"):
                if name in row:
                    lines.append(
                        f"{result['streams']} streams flood, {key}, {name.removesuffix('_verdict')}: {row[name]}"
                    )
    return "\n".join(lines)


def table(results: list[dict]) -> str:
    """The BENCHMARKS.md table: one line per workload, headroom against the floor."""
    lines = [
        "| load | pass-through / direct | headroom / direct | headroom / pass-through | "
        "added TTFT p50, p99 (headroom vs pass-through) | the same, clean requests | "
        "CPU/chunk headroom, pass-through | rounds: rate, CPU ratios (lowest-highest) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        floor, ours = result["compare"]["passthrough/plain"], result["compare"]["headroom/plain"]
        cpu = result["targets"]
        load = f"{result['streams']} streams, " + (
            "flood" if result["pace"] == "flood" else f"{result['pace']} tok/s each"
        )
        lines.append(
            f"| {load} | {floor['over_direct']:.3f} | {ours['over_direct']:.3f} | "
            f"**{ours['over_passthrough']:.3f}** | +{ours['added_ttft_p50_ms']}, +{ours['added_ttft_p99_ms']} ms "
            f"vs +{floor['added_ttft_p50_ms']}, +{floor['added_ttft_p99_ms']} ms | "
            f"+{ours['clean_added_ttft_p50_ms']}, +{ours['clean_added_ttft_p99_ms']} ms vs "
            f"+{floor['clean_added_ttft_p50_ms']}, +{floor['clean_added_ttft_p99_ms']} ms | "
            f"{cpu['headroom/plain']['cpu_us_per_chunk']} vs {cpu['passthrough/plain']['cpu_us_per_chunk']} µs | "
            f"{_span(ours.get('over_passthrough_by_round'))}, {_span(ours.get('cpu_over_passthrough_by_round'))}x |"
        )
    return "\n".join(lines)


def _span(values: list[float] | None) -> str:
    return f"{values[0]}-{values[-1]}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workloads",
        default="64:flood,256:flood,64:50,256:50",
        help="comma-separated STREAMS:PACE, PACE = flood or tokens/s per stream",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--chunks",
        type=int,
        default=64,
        help="token chunks per answer (default 64; 1 makes CPU per chunk the CPU per request)",
    )
    parser.add_argument("--round-s", type=float, default=4.0, help="seconds per target per round")
    parser.add_argument(
        "--vllm-targets",
        default="headroom",
        help="targets that also get vLLM-style streams (with direct: what the sidecar adds to the "
        "style gap, sidecar_style_verdict)",
    )
    parser.add_argument(
        "--extra-target",
        action="append",
        default=[],
        metavar="NAME=COMMAND",
        help="another proxy to compare: a command with {port}, {upstream}, {python}; "
        "it must answer GET /healthz",
    )
    parser.add_argument("--no-litellm", dest="litellm", action="store_false", help="skip LiteLLM")
    parser.add_argument(
        "--max-steal",
        type=float,
        default=2.0,
        help="a request is clean when no second of its wait for the first token had more steal "
        "time than this percent (default 2)",
    )
    args = parser.parse_args()
    args.steal = StealSampler()
    port = free_port()
    upstream_process = start([PYTHON, "benchmarks/sse_upstream.py", str(port)], f"http://127.0.0.1:{port}/")
    upstream = f"http://127.0.0.1:{port}"
    SIDES.update(upstream=upstream_process.pid, client=os.getpid())
    targets = start_targets(args, upstream, upstream_process)
    try:
        for target in targets:  # warm-up: connections, imports, first DuckDB batches
            measure(target, 16, "flood", "plain", 1.0)
        results = [run_workload(targets, workload, args) for workload in args.workloads.split(",")]
        rss = {t.name: round(rss_mib(t.process.pid), 1) for t in targets if t.process}
        stolen = sorted(args.steal.by_second.values())
        steal = {
            "max_percent": round(stolen[-1], 1) if stolen else None,
            f"seconds_over_{args.max_steal:g}_percent": sum(1 for value in stolen if value > args.max_steal),
            "seconds": len(stolen),
        }
        print(json.dumps({"results": results, "rss_mib": rss, "steal": steal}, indent=2))
        print(table(results), file=sys.stderr)
        print(verdicts(results), file=sys.stderr)
    finally:
        stop_all([upstream_process] + [t.process for t in targets if t.process])


if __name__ == "__main__":
    main()
