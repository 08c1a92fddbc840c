"""The admission path and the event splitter, in process: what a request and a chunk cost.

    python benchmarks/admission_splice.py

* admission: reading a streamed chat body and adding `stream_options.include_usage`, the way the
  sidecar does it now (orjson read + a byte splice) against re-serialising the body (orjson read
  + orjson write, what it did before), for a short and a long (100 kB prompt) body;
* splitting: one typical chunk fed whole, and an 8 MB event fed 4 KB at a time (linear now; the
  old splitter re-joined the buffer on every read).

Results go in BENCHMARKS.md.
"""

from __future__ import annotations

import timeit

import orjson

from collector.sidecar.requests import parse_request
from collector.sse import EventSplitter

SHORT = orjson.dumps(
    {
        "model": "bench",
        "stream": True,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "benchmark prompt " * 10}],
    }
)
LONG = orjson.dumps(
    {
        "model": "bench",
        "stream": True,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "x" * 100_000}],
    }
)
CHUNK = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" tok"}}],'
    b'"created":1796035172,"id":"chatcmpl-fake","model":"fake-model","object":"chat.completion.chunk"}\n\n'
)


def _reserialised(body: bytes) -> bytes:
    payload = orjson.loads(body)
    payload["stream_options"] = {"include_usage": True}
    return orjson.dumps(payload)


def _per_call_us(statement, number: int) -> float:
    return min(timeit.repeat(statement, number=number, repeat=5)) / number * 1e6


def _big_event_seconds() -> float:
    piece = b"x" * 4096

    def feed() -> None:
        splitter = EventSplitter(max_event_bytes=16 * 2**20)
        splitter.feed(b"data: ")
        for _ in range(2048):  # 8 MiB
            splitter.feed(piece)
        splitter.feed(b"\n\n")

    return min(timeit.repeat(feed, number=1, repeat=3))


def main() -> None:
    for name, body in (("short body", SHORT), ("100 kB body", LONG)):
        spliced = _per_call_us(lambda b=body: parse_request(b), 2000)
        old = _per_call_us(lambda b=body: _reserialised(b), 2000)
        print(f"admission, {name}: parse + splice {spliced:.1f} µs; read + re-serialise {old:.1f} µs")
    splitter = EventSplitter()
    print(f"split one chunk: {_per_call_us(lambda: splitter.feed(CHUNK), 200_000):.2f} µs")
    print(f"split an 8 MiB event fed 4 KiB at a time: {_big_event_seconds() * 1000:.1f} ms")


if __name__ == "__main__":
    main()
