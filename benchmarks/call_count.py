"""Python calls per request in the serving thread: headroom against the pass-through, no clock.

    python benchmarks/call_count.py                          # 64 streams, 640 answers of 64 chunks
    python benchmarks/call_count.py --chunks 1               # what a request costs, not its chunks
    python benchmarks/call_count.py --pace-ms 20             # 50 tok/s per stream: one chunk per read
    python benchmarks/call_count.py --against /tmp/before    # another checkout as a third target
    python benchmarks/call_count.py --top 40                 # where headroom's extra calls are

On this shared 2-vCPU host a timed benchmark moves by 10-15 % between runs (BENCHMARKS.md §2),
more than most single changes to the hot path. A count does not: each target serves the same
load in a child process whose serving threads run under `threading.setprofile`, which counts
every Python function entered (a coroutine's resumption included) and every builtin called from
Python, per thread. Reported per answer: the calls in the event loop's thread (and in the
others, the request log's writer among them), and the upstream reads the relay saw. The count is
not CPU time (a call to `orjson.loads` counts one, a `len` one), but a change that removes work
removes calls, and the same code gives the same count to within the few reads that coalesce
differently from run to run. Use it to compare builds; use proxy_overhead.py for time.

Targets: `passthrough` (benchmarks/passthrough_proxy.py on aiohttp's server, the floor),
`headroom` (build_sidecar served by uvicorn, as `headroom run` serves it, with its DuckDB log)
and, with --against, `against` (the same, importing `collector` from another checkout). The
upstream is benchmarks/sse_upstream.py in a process of its own; the load generator is the child's
main thread (aiohttp, not profiled).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
BODY = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}'


def _child(
    target: str, upstream: str, streams: int, requests: int, chunks: int, pace_ms: int, top: int
) -> None:
    """Serve `target` in a profiled thread, drive the load from this thread, print JSON counts."""
    import aiohttp  # the child's own imports: the parent only starts processes

    counts: collections.Counter[tuple[int, str, str]] = collections.Counter()
    counting = False

    def profile(frame, event, arg):  # type: ignore[no-untyped-def]
        if not counting:
            return
        if event == "call":
            code = frame.f_code
            name = code.co_filename.rpartition("site-packages/")[2]
            for root in ("/collector/", "/benchmarks/"):  # a checkout's own files, wherever it is
                name = root[1:] + name.rpartition(root)[2] if root in name else name
            counts[(threading.get_ident(), name, code.co_qualname)] += 1
        elif event == "c_call":
            counts[(threading.get_ident(), "builtin", getattr(arg, "__qualname__", repr(arg)))] += 1

    threading.setprofile(profile)  # the serving threads started from here on are counted
    if target == "passthrough":
        url, loop_ident, stop, flush = _passthrough(upstream)
    else:
        url, loop_ident, stop, flush = _headroom(upstream)
    threading.setprofile(None)

    async def load(answers: int) -> None:
        left = [answers]
        headers = {"content-type": "application/json", "x-chunks": str(chunks), "x-pace-ms": str(pace_ms)}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def worker() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    async with session.post(url + "/v1/chat/completions", data=BODY, headers=headers) as r:
                        async for _ in r.content.iter_any():
                            pass

            await asyncio.gather(*(worker() for _ in range(streams)))

    asyncio.run(load(min(requests, 4 * streams)))  # warm: imports, pools, first-use paths
    flush()
    counting = True
    asyncio.run(load(requests))
    flush()
    counting = False
    stop()
    loop_calls = sum(c for (t, _, _), c in counts.items() if t == loop_ident)
    other_calls = sum(c for (t, _, _), c in counts.items() if t != loop_ident)
    builtin_calls = sum(c for (t, f, _), c in counts.items() if t == loop_ident and f == "builtin")
    reads = sum(c for (t, _, n), c in counts.items() if t == loop_ident and n == "EventSplitter.take")
    functions = collections.Counter()
    for (t, f, n), c in counts.items():
        if t == loop_ident:
            functions[f"{f}:{n}"] += c
    print(
        json.dumps(
            {
                "loop_calls_per_request": loop_calls / requests,
                "builtin_calls_per_request": builtin_calls / requests,
                "other_threads_calls_per_request": other_calls / requests,
                "reads_per_request": reads / requests,
                "functions": {k: v / requests for k, v in functions.most_common(top)} if top else {},
            }
        )
    )


def _passthrough(upstream: str):  # type: ignore[no-untyped-def]
    import uvloop
    from aiohttp import web

    sys.path.insert(0, str(HERE))
    import passthrough_proxy

    ready, box = threading.Event(), {}

    def serve() -> None:
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        app = web.Application()
        app["upstream"] = upstream
        app.cleanup_ctx.append(passthrough_proxy._session)
        app.router.add_route("*", "/{tail:.*}", passthrough_proxy._proxy)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        box["loop"], box["port"] = loop, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(30)
    loop = box["loop"]
    return (
        f"http://127.0.0.1:{box['port']}",
        thread.ident,
        lambda: loop.call_soon_threadsafe(loop.stop),
        _nothing,
    )


def _headroom(upstream: str):  # type: ignore[no-untyped-def]
    from collector.serving import serve_in_thread
    from collector.sidecar.config import SidecarConfig
    from collector.sidecar.wiring import build_sidecar, sidecar_state

    db = Path(tempfile.mkdtemp(prefix="call-count-")) / "log.duckdb"
    app = build_sidecar(
        SidecarConfig(upstream=upstream, engine="none", db_path=str(db), instance="calls", jobs=False)
    )
    try:  # served as `headroom run` serves it (its defaults), where the checkout has these
        from collector.sidecar.server import uvicorn_options

        options = {"proxy_headers": False} | uvicorn_options(
            sidecar_state(app).registry, header_timeout_s=10.0, idle_timeout_s=5.0, max_connections=4096
        )
    except ImportError:
        options = {}
    handle = serve_in_thread(app, **options)
    return handle.url, handle.thread.ident, handle.stop, sidecar_state(app).writer.flush


def _nothing() -> None:
    pass


def _run(target: str, upstream: str, args: argparse.Namespace, pythonpath: str) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    command = [sys.executable, __file__, "--child", target, "--upstream", upstream]
    command += [
        "--streams",
        str(args.streams),
        "--requests",
        str(args.requests),
        "--chunks",
        str(args.chunks),
    ]
    command += ["--pace-ms", str(args.pace_ms)]
    command += ["--top", str(max(args.top, 400) if args.top else 0)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{target} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams (default 64)")
    parser.add_argument("--requests", type=int, default=640, help="answers counted (default 640)")
    parser.add_argument("--chunks", type=int, default=64, help="token chunks per answer (default 64)")
    parser.add_argument(
        "--pace-ms", type=int, default=0, help="gap between chunks (default 0: flood; 20: 50 tok/s)"
    )
    parser.add_argument(
        "--against", metavar="CHECKOUT", help="another checkout's collector, as a third target"
    )
    parser.add_argument(
        "--top", type=int, default=0, help="list the N functions headroom calls most beyond the floor"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.upstream, args.streams, args.requests, args.chunks, args.pace_ms, args.top)
        return
    sys.path.insert(0, str(HERE))
    from _common import free_port  # benchmarks/_common: shared by the benchmark scripts

    port = free_port()
    upstream = subprocess.Popen([sys.executable, str(HERE / "sse_upstream.py"), str(port)])
    try:
        _wait_port(port)
        here = str(HERE.parent)
        targets = [("passthrough", here), ("headroom", here)]
        if args.against:
            targets.append(("against", str(Path(args.against).resolve())))
        results = {}
        for name, path in targets:
            print(f"counting {name} ...", file=sys.stderr, flush=True)
            results[name] = _run(
                "passthrough" if name == "passthrough" else "headroom", f"http://127.0.0.1:{port}", args, path
            )
    finally:
        upstream.terminate()
        upstream.wait(10)
    _report(results, args)


def _wait_port(port: int) -> None:
    import socket
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)  # a child process starting: nothing to await but its port
    raise SystemExit(f"the upstream did not listen on {port}")


def _report(results: dict[str, dict], args: argparse.Namespace) -> None:
    floor = results["passthrough"]["loop_calls_per_request"]
    pace = f"a chunk every {args.pace_ms} ms" if args.pace_ms else "flood"
    print(
        f"{args.streams} streams ({pace}), {args.requests} answers of {args.chunks} chunks; calls per answer:"
    )
    print(
        f"{'target':12} {'event loop':>11} {'of them builtins':>17} {'other threads':>14} {'reads':>6} {'/ floor':>8}"
    )
    for name, r in results.items():
        print(
            f"{name:12} {r['loop_calls_per_request']:11.1f} {r['builtin_calls_per_request']:17.1f} "
            f"{r['other_threads_calls_per_request']:14.1f} {r['reads_per_request']:6.2f} "
            f"{r['loop_calls_per_request'] / floor:8.3f}"
        )
    if args.top:
        mine, base = results["headroom"]["functions"], results["passthrough"]["functions"]
        extra = sorted(mine, key=lambda k: base.get(k, 0) - mine[k])[: args.top]
        print(f"\nheadroom's calls beyond the floor, per answer (top {args.top}):")
        for key in extra:
            print(f"{mine[key] - base.get(key, 0):9.2f}  {key}")


if __name__ == "__main__":
    main()
