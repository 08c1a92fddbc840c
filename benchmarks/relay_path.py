"""The per-chunk path alone: what reading each streamed event costs, next to only forwarding it.

    python benchmarks/relay_path.py                  # three streams, 1 and 8 events per read
    python benchmarks/relay_path.py --repeat 400     # longer, steadier
    python benchmarks/relay_path.py --strip-usage all  # every stream as for a client that did not
                                                     # ask for usage (most clients of `headroom run`)
    python benchmarks/relay_path.py --against <(git show 97cf110:collector/sidecar/relay.py)
                                                     # another relay.py beside this one, rounds alternated

The sidecar's `relay_stream` (collector/sidecar/relay.py) runs on recorded streams, in this
process, with no network. Since stop 34 `headroom run` does the same reading per read in a
callback of its own upstream client (`relay._StreamSink`, collector/sidecar/h1.py); relay_stream
is the relay for other ASGI servers, and its per-read reading is the same code: a stand-in upstream response yields the stream's bytes in reads of
1 or 8 events (aiohttp hands the proxy whatever is buffered, so under load a read holds several
events), and a stand-in client takes each forwarded body. Its events are split, read, counted
by a real Tracker and forwarded, as in `headroom run`. The floor is the same loop with the
forwarding only: every read passed to the client untouched, as a pass-through proxy does.

Streams: the llama.cpp capture in tests/fixtures (what a real engine sends), and the
benchmarks' upstream's plain and vLLM-style streams (benchmarks/sse_upstream.py: 64 one-token
chunks, and the same with `"usage":null` in every chunk). Reported per stream and read size:
CPU microseconds per event for both loops (best of --rounds, each --repeat streams) and their
ratio. CPU time of this process only, so a noisy machine moves it less than a wall clock.
With --against FILE, that relay.py (say, an earlier commit's) runs beside the current one,
round by round, and each is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.machinery
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType

from prometheus_client import CollectorRegistry

from collector.sidecar.live import LiveRequest
from collector.sidecar.relay import relay_stream
from collector.sidecar.tracker import Tracker

ROOT = Path(__file__).resolve().parent.parent
_ROLE = b'data: {"id":"b","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]%s}\n\n'
_TOKEN = (
    b'data: {"id":"b","object":"chat.completion.chunk","created":1,"model":"bench",'
    b'"choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]%s}\n\n'
)
_USAGE = (
    b'data: {"id":"b","object":"chat.completion.chunk","choices":[],'
    b'"usage":{"prompt_tokens":40,"completion_tokens":64,"total_tokens":104}}\n\n'
)
_DONE = b"data: [DONE]\n\n"


def _bench_stream(vllm: bool) -> bytes:
    null = b',"usage":null' if vllm else b""
    return _ROLE % null + (_TOKEN % null) * 64 + _USAGE + _DONE


def streams() -> dict[str, bytes]:
    return {
        "llama.cpp capture": (ROOT / "tests/fixtures/llamacpp/chat_stream_with_usage.sse").read_bytes(),
        "benchmark stream": _bench_stream(vllm=False),
        "vLLM-style": _bench_stream(vllm=True),
    }


def reads_of(stream: bytes, per_read: int) -> list[bytes]:
    """The stream cut into reads of `per_read` whole events."""
    events = [event + b"\n\n" for event in stream.split(b"\n\n") if event]
    return [b"".join(events[i : i + per_read]) for i in range(0, len(events), per_read)]


class _Content:
    __slots__ = ("_reads",)

    def __init__(self, reads: list[bytes]) -> None:
        self._reads = iter(reads)

    async def readany(self) -> bytes:  # aiohttp's StreamReader: b"" at the end
        return next(self._reads, b"")

    async def iter_any(self):  # what older relays and the pass-through read with
        for data in self._reads:
            yield data


class _Response:
    status = 200

    def __init__(self, reads: list[bytes]) -> None:
        self.content = _Content(reads)


class _Client:
    __slots__ = ("sent", "answered")

    def __init__(self) -> None:
        self.sent = 0
        self.answered = None  # ClientChannel's: set by the relay once [DONE] was sent

    async def send(self, message: dict) -> None:  # the ASGI send: what the relay calls per read
        self.sent += len(message["body"])

    async def body(self, data: bytes) -> None:  # ClientChannel.body, which older relays call
        await self.send({"type": "http.response.body", "body": data, "more_body": True})


async def forward_only(reads: list[bytes], client: _Client) -> None:
    """The floor: every read to the client untouched (what benchmarks/passthrough_proxy.py does)."""
    async for data in _Content(reads).iter_any():
        if data:
            await client.send({"type": "http.response.body", "body": data, "more_body": True})


async def accounted(
    reads: list[bytes], client: _Client, tracker: Tracker, strip_usage: bool, relay=relay_stream
) -> None:
    """headroom's relay: split, read, count and forward, then finish the request."""
    request = LiveRequest("bench", "t", "/v1/chat/completions", True, 64, 40)
    tracker.admit(request)
    ending = await relay(tracker, request, strip_usage, _Response(reads), client, 2**20)  # type: ignore[arg-type]
    tracker.finish(request, ending.outcome, status_code=200)


def load_relay(path: str) -> ModuleType:
    """A relay.py from anywhere (a file, or a shell's <(git show ...)) as a module of its own."""
    loader = importlib.machinery.SourceFileLoader("relay_against", path)
    spec = importlib.util.spec_from_loader("relay_against", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    loader.exec_module(module)
    return module


def cpu_per_event(run, reads: list[bytes], events: int, repeat: int, rounds: int) -> float:
    """Best CPU microseconds per event over `rounds` rounds of `repeat` streams."""
    best = float("inf")
    for _ in range(rounds):

        async def many() -> None:
            for _ in range(repeat):
                await run(reads)

        began = time.process_time()
        asyncio.run(many())
        best = min(best, (time.process_time() - began) / (repeat * events) * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="streams per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", metavar="FILE", help="another relay.py to run beside this one")
    parser.add_argument(
        "--strip-usage",
        choices=("vllm", "all"),
        default="vllm",
        help="streams relayed as for a client that did not ask for usage (the proxy asked, and "
        "strips what it asked for): the vLLM-style one only (the default, as recorded before "
        "2026-12-04), or all, as `headroom run` relays most clients",
    )
    args = parser.parse_args()
    against = load_relay(args.against).relay_stream if args.against else None
    tracker = Tracker(CollectorRegistry(), instance="bench")
    client = _Client()
    results = []
    for name, stream in streams().items():
        events = stream.count(b"\n\n")
        for per_read in (1, 8):
            reads = reads_of(stream, per_read)
            strip = args.strip_usage == "all" or name == "vLLM-style"
            relays = {"relay": relay_stream, **({"against": against} if against else {})}
            best = {name: float("inf") for name in ("forward", *relays)}
            for _ in range(args.rounds):  # alternated, so drift on the machine spreads over all
                best["forward"] = min(
                    best["forward"],
                    cpu_per_event(lambda r: forward_only(r, client), reads, events, args.repeat, 1),
                )
                for label, relay in relays.items():
                    best[label] = min(
                        best[label],
                        cpu_per_event(
                            lambda r, v=strip, f=relay: accounted(r, client, tracker, v, f),
                            reads,
                            events,
                            args.repeat,
                            1,
                        ),
                    )
            floor, ours = best["forward"], best["relay"]
            result = {
                "stream": name,
                "events": events,
                "events_per_read": per_read,
                "forward_us_per_event": round(floor, 3),
                "relay_us_per_event": round(ours, 3),
                "relay_added_us_per_event": round(ours - floor, 3),
                "ratio": round(ours / floor, 2),
            }
            if against:
                result["against_added_us_per_event"] = round(best["against"] - floor, 3)
                result["added_change"] = f"{(ours - floor) / (best['against'] - floor) - 1:+.0%}"
            results.append(result)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
