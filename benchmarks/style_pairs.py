"""vLLM-style streams against plain ones through the sidecar, decided on many short paired windows.

    python benchmarks/style_pairs.py                          # 64 streams, 100 pairs of 1.5 s, ~5.5 min
    python benchmarks/style_pairs.py --streams 256 --pairs 60
    python benchmarks/style_pairs.py --targets headroom,direct  # direct too: the load's own gap
    python benchmarks/style_pairs.py --versus-floor --pairs 200 # headroom against the pass-through
    python benchmarks/style_pairs.py --versus-floor --route passthrough  # its un-accounted route
    python benchmarks/style_pairs.py --versus-floor --lake      # headroom staging Parquet, not DuckDB
    python benchmarks/style_pairs.py --versus-floor --style llamacpp  # the engine's timings read
    python benchmarks/style_pairs.py --versus-no-age --scrape-s 0.25  # the in-flight age pass on vs off

The issue's target: vLLM-style streams (`"usage":null` in every chunk plus a final usage chunk)
no slower through `headroom run` than plain ones, a ratio of at least 0.98. proxy_overhead.py
gives each (target, style) one 4 s window a round, with the other targets' windows between the
two styles; on this 2-vCPU host one window's chunk rate moves by 10-25 % (the load generator,
the upstream and the proxy share two cores with the host's other tenants), so 14 rounds leave
the style ratio's interval at 0.8-1.1, far too wide to decide 0.98 (BENCHMARKS.md §2).

Here nothing but the style changes. The windows of one target alternate plain, vLLM, vLLM,
plain (ABBA, so a drift that is linear over four windows cancels within the pairs), each
--window-s long, and each adjacent pair gives one ratio: the vLLM-style window's chunk rate over
the plain one's. The verdict is the median of those ratios with its distribution-free 95 %
interval (benchmarks/_verdict.py): `met` only when the whole interval is at or above 0.98.
The proxy's CPU per chunk is paired the same way (`cpu_plain_over_vllm`: above 1 when a
vLLM-style chunk costs the sidecar less). One window is one `proxy_overhead.measure`: the same
upstream, load generator and `headroom run` as the main benchmark.

With --versus-floor the same pairing decides the flood targets instead: `headroom run` and the
bare pass-through (benchmarks/passthrough_proxy.py) alternate ABBA on plain streams, and each
pair gives headroom's chunk rate over the floor's (target >= 0.95) and its CPU per chunk over
the floor's (target <= 1.2). `--route passthrough` sends both arms' streams to ROUTES'
`passthrough` path instead, which the sidecar forwards through its pass-through, un-accounted
(the upstream answers every path alike); `--lake` starts `headroom run --lake DIR` (Parquet staged
through its spool, no catalog) instead of `--db`. After the pairs the sidecar's /metrics is
checked: accounted requests on the accounted route and none on the pass-through, and the spool's
series with --lake only, so an arm that is not what it says fails the run.

With --versus-no-age two `headroom run` alternate ABBA on plain streams: the production one and
one started by benchmarks/_no_age_headroom.py, whose /metrics leaves out the in-flight age pass
(headroom_inflight_oldest_age_seconds, headroom_inflight_older_than_requests). A scraper process
(benchmarks/_scrape_loop.py) reads both /metrics every --scrape-s seconds the whole run, so each
sidecar's CPU includes its scrapes. Each pair gives the chunk rate and the CPU per chunk with the
age pass over without it: "nothing measurable" is a rate of at least 0.98 and CPU of at most 1.02.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import httpx
from _common import PYTHON, free_port, start, stop_all
from _no_age_headroom import scrape_us
from _verdict import describe
from prometheus_client.parser import text_string_to_metric_families
from proxy_overhead import (
    ACCOUNTED,
    CPU_TARGET,
    RATE_TARGET,
    SIDES,
    STYLE_TARGET,
    Target,
    _headroom,
    measure,
)

# --route: the path both arms' streams go to; any /v1/* path but the accounted ones passes through
ROUTES = {"accounted": ACCOUNTED, "passthrough": "/v1/bench/stream"}


def pairs_for(target: Target, args: argparse.Namespace) -> dict:
    """ABBA windows of one target, --pairs pairs: the ratios and the verdict."""
    rates: list[float] = []
    cpus: list[float] = []
    windows = {"plain": [], "vllm": []}
    for index in range(args.pairs):
        order = ("plain", "vllm") if index % 2 == 0 else ("vllm", "plain")
        got = {style: measure(target, args.streams, "flood", style, args.window_s) for style in order}
        for style in order:
            windows[style].append(got[style])
        if got["plain"]["chunks_per_s"]:
            rates.append(got["vllm"]["chunks_per_s"] / got["plain"]["chunks_per_s"])
        if got["plain"]["cpu_us_per_chunk"] and got["vllm"]["cpu_us_per_chunk"]:
            cpus.append(got["plain"]["cpu_us_per_chunk"] / got["vllm"]["cpu_us_per_chunk"])
        if args.progress:
            print(f"{target.name}: pair {index + 1}/{args.pairs}", file=sys.stderr, end="\r")
    out = {
        "pairs": len(rates),
        "window_s": args.window_s,
        "streams": args.streams,
        "chunks_per_s": {
            s: round(statistics.median(w["chunks_per_s"] for w in v)) for s, v in windows.items()
        },
        "vllm_over_plain_by_pair": sorted(round(x, 3) for x in rates),
        "style_verdict": describe(rates, at_least=STYLE_TARGET),
        "failed": sum(w["failed"] for v in windows.values() for w in v),
    }
    if cpus:
        out["cpu_us_per_chunk"] = {
            s: round(statistics.median(w["cpu_us_per_chunk"] for w in v), 2) for s, v in windows.items()
        }
        out["cpu_plain_over_vllm"] = describe(cpus, at_least=STYLE_TARGET)
    return out


AGE_RATE_TARGET, AGE_CPU_TARGET = 0.98, 1.02  # --versus-no-age: "nothing measurable"


def pair_targets(
    headroom: Target,
    floor: Target,
    args: argparse.Namespace,
    rate_target: float = RATE_TARGET,
    cpu_target: float = CPU_TARGET,
) -> dict:
    """ABBA windows of two targets on plain streams (--versus-floor: `headroom run` and the
    pass-through; --versus-no-age: with and without the age pass); each pair's chunk rate and
    CPU per chunk, the first target's over the second's."""
    rates: list[float] = []
    cpus: list[float] = []
    windows: dict[str, list[dict]] = {headroom.name: [], floor.name: []}
    path = ROUTES[args.route]
    for index in range(args.pairs):
        order = (floor, headroom) if index % 2 == 0 else (headroom, floor)
        style = getattr(args, "style", "plain")
        got = {t.name: measure(t, args.streams, "flood", style, args.window_s, path=path) for t in order}
        for t in order:
            windows[t.name].append(got[t.name])
        ours, base = got[headroom.name], got[floor.name]
        if base["chunks_per_s"]:
            rates.append(ours["chunks_per_s"] / base["chunks_per_s"])
        if ours["cpu_us_per_chunk"] and base["cpu_us_per_chunk"]:
            cpus.append(ours["cpu_us_per_chunk"] / base["cpu_us_per_chunk"])
        if args.progress:
            print(f"versus {floor.name}: pair {index + 1}/{args.pairs}", file=sys.stderr, end="\r")
    return {
        "pairs": len(rates),
        "window_s": args.window_s,
        "streams": args.streams,
        "route": path,
        "style": getattr(args, "style", "plain"),
        "chunks_per_s": {
            n: round(statistics.median(w["chunks_per_s"] for w in v)) for n, v in windows.items()
        },
        "cpu_us_per_chunk": {
            n: round(statistics.median(w["cpu_us_per_chunk"] for w in v), 2) for n, v in windows.items()
        },
        f"over_{floor.name}_by_pair": sorted(round(x, 3) for x in rates),
        "rate_verdict": describe(rates, at_least=rate_target),
        "cpu_verdict": describe(cpus, at_most=cpu_target),
        "failed": sum(w["failed"] for v in windows.values() for w in v),
    }


def _passthrough(upstream: str) -> Target:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    return Target(
        "passthrough", url, start([PYTHON, "benchmarks/passthrough_proxy.py", str(port), upstream], url + "/")
    )


def sidecar_log(url: str) -> dict:
    """What the sidecar at `url` accounted and logged, from its /metrics: requests by outcome
    summed, rows written, and (with --lake only) the spool's files and bytes."""
    samples = [
        sample
        for family in text_string_to_metric_families(httpx.get(url + "/metrics").text)
        for sample in family.samples
    ]
    out = {"accounted_requests": int(sum(s.value for s in samples if s.name == "headroom_requests_total"))}
    # requests whose engine timings the sidecar read (--style llamacpp): the parse really ran
    out["engine_timed_requests"] = int(
        sum(s.value for s in samples if s.name == "headroom_engine_prefill_seconds_count")
    )
    unlabelled = {sample.name: sample.value for sample in samples if not sample.labels}
    for name in ("headroom_log_rows_written_total", "headroom_log_spool_files", "headroom_log_spool_bytes"):
        if name in unlabelled:
            out[name.removeprefix("headroom_log_")] = int(unlabelled[name])
    return out


def _check_arm(log: dict, args: argparse.Namespace) -> None:
    """Refuse a run whose headroom arm was not what --route and --lake say (see the docstring)."""
    if (log["accounted_requests"] > 0) != (args.route == "accounted"):
        raise RuntimeError(
            f"--route {args.route}, but the sidecar accounted {log['accounted_requests']} requests"
        )
    if (log["engine_timed_requests"] > 0) != (args.style == "llamacpp" and args.route == "accounted"):
        raise RuntimeError(
            f"--style {args.style}, but the sidecar read engine timings of {log['engine_timed_requests']} requests"
        )
    if ("spool_files" in log) != args.lake:
        raise RuntimeError(f"--lake {args.lake}, but the sidecar's log series are {sorted(log)}")


def _no_age(upstream: str) -> Target:
    url, process = _headroom(upstream, launcher=["benchmarks/_no_age_headroom.py"])
    return Target("no_age", url, process)


def _versus_floor(upstream: str, args: argparse.Namespace) -> dict:
    """--versus-floor: headroom (--lake or --db) and the pass-through paired ABBA on --route,
    and what the sidecar accounted and logged meanwhile."""
    targets = [Target("headroom", *_headroom(upstream, lake=args.lake))]
    try:
        targets.append(_passthrough(upstream))
        for target in targets:  # warm-up: connections, imports, first DuckDB batches
            measure(target, 16, "flood", "plain", 1.0, path=ROUTES[args.route])
        result = pair_targets(targets[0], targets[1], args)
        store = "lake" if args.lake else "duckdb"
        return result | {"store": store, "sidecar_log": sidecar_log(targets[0].url)}
    finally:
        stop_all([t.process for t in targets if t.process])


def _versus_no_age(upstream: str, args: argparse.Namespace) -> dict:
    """--versus-no-age: both sidecars scraped every --scrape-s the whole run, paired ABBA."""
    targets = [Target("headroom", *_headroom(upstream)), _no_age(upstream)]
    urls = [target.url + "/metrics" for target in targets]
    ages = ["headroom_inflight_oldest_age_seconds" in httpx.get(url).text for url in urls]
    if ages != [True, False]:  # the arms must differ by the age series, and only the no-age arm lacks them
        stop_all([t.process for t in targets if t.process])
        raise RuntimeError(f"age series on /metrics (production, no-age): {ages}, expected [True, False]")
    scraper = subprocess.Popen([PYTHON, "benchmarks/_scrape_loop.py", str(args.scrape_s), *urls])
    try:
        for target in targets:  # warm-up: connections, imports, first DuckDB batches
            measure(target, 16, "flood", "plain", 1.0)
        result = pair_targets(*targets, args, AGE_RATE_TARGET, AGE_CPU_TARGET)
        if scraper.poll() is not None:
            raise RuntimeError(f"the scraper exited with {scraper.returncode}: a /metrics failed")
        return result | {"scrape_s": args.scrape_s, "tracker_text_us": scrape_us(args.streams)}
    finally:
        stop_all([scraper] + [t.process for t in targets if t.process])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams (default 64)")
    parser.add_argument("--pairs", type=int, default=100, help="paired windows per target (default 100)")
    parser.add_argument("--window-s", type=float, default=1.5, help="seconds per window (default 1.5)")
    parser.add_argument(
        "--targets",
        default="headroom",
        help="comma-separated: headroom, direct (default headroom)",
    )
    parser.add_argument(
        "--versus-floor",
        action="store_true",
        help="pair headroom's plain windows with the bare pass-through's instead (the flood "
        "targets: chunk rate >= 0.95x, CPU per chunk <= 1.2x)",
    )
    parser.add_argument(
        "--route",
        choices=sorted(ROUTES),
        default="accounted",
        help=f"--versus-floor: the path both arms are sent (accounted: {ACCOUNTED}; passthrough: "
        f"{ROUTES['passthrough']}, forwarded by the sidecar un-accounted)",
    )
    parser.add_argument(
        "--lake",
        action="store_true",
        help="--versus-floor: headroom run --lake TMPDIR (Parquet through the spool) instead of --db",
    )
    parser.add_argument(
        "--style",
        choices=("plain", "vllm", "llamacpp"),
        default="plain",
        help="--versus-floor: the streams both arms get (llamacpp: llama.cpp's timings on the last "
        "chunk, which the sidecar reads; default plain)",
    )
    parser.add_argument(
        "--versus-no-age",
        action="store_true",
        help="pair headroom with and without the in-flight age pass, both scraped every "
        "--scrape-s (nothing measurable: rate >= 0.98x, CPU per chunk <= 1.02x)",
    )
    parser.add_argument(
        "--scrape-s", type=float, default=0.25, help="--versus-no-age: seconds between scrapes (0.25)"
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    args = parser.parse_args()
    names = args.targets.split(",")
    unknown = set(names) - {"headroom", "direct"}
    if unknown:
        parser.error(f"unknown target(s): {', '.join(sorted(unknown))} (known: headroom, direct)")
    if args.pairs < 1 or args.window_s <= 0:
        parser.error("--pairs must be at least 1 and --window-s positive")
    if (args.route != "accounted" or args.lake or args.style != "plain") and not args.versus_floor:
        parser.error("--route, --lake and --style go with --versus-floor")
    port = free_port()
    upstream_process = start([PYTHON, "benchmarks/sse_upstream.py", str(port)], f"http://127.0.0.1:{port}/")
    upstream = f"http://127.0.0.1:{port}"
    SIDES.update(upstream=upstream_process.pid, client=os.getpid())
    targets: list[Target] = []
    try:
        if args.versus_no_age:
            result = _versus_no_age(upstream, args)
            print(json.dumps({"versus_no_age": result}, indent=2))
            for name in ("rate", "cpu"):
                print(
                    f"{args.streams} streams flood, scraped every {args.scrape_s:g} s, age pass on "
                    f"over off, {name}: {result[name + '_verdict']}",
                    file=sys.stderr,
                )
            return
        if args.versus_floor:
            result = _versus_floor(upstream, args)
            print(json.dumps({"versus_floor": result}, indent=2))
            _check_arm(result["sidecar_log"], args)
            for name in ("rate", "cpu"):
                print(
                    f"{args.streams} streams flood, {args.route} route, {result['store']} log, headroom over "
                    f"the pass-through, {name}: {result[name + '_verdict']}",
                    file=sys.stderr,
                )
            return
        for name in names:
            if name == "direct":
                targets.append(Target("direct", upstream, None))
            else:
                url, process = _headroom(upstream)
                targets.append(Target("headroom", url, process))
        for target in targets:  # warm-up: connections, imports, first DuckDB batches
            measure(target, 16, "flood", "plain", 1.0)
            measure(target, 16, "flood", "vllm", 1.0)
        results = {target.name: pairs_for(target, args) for target in targets}
        print(json.dumps(results, indent=2))
        for name, result in results.items():
            print(
                f"{args.streams} streams flood, {name}, vLLM-style over plain: {result['style_verdict']}",
                file=sys.stderr,
            )
            if "cpu_plain_over_vllm" in result:
                print(
                    f"{args.streams} streams flood, {name}, CPU plain over vLLM-style: {result['cpu_plain_over_vllm']}",
                    file=sys.stderr,
                )
    finally:
        stop_all([upstream_process] + [t.process for t in targets if t.process])


if __name__ == "__main__":
    main()
