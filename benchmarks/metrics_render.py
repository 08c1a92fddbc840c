"""How long does /metrics take with the series budget full?

    python benchmarks/metrics_render.py [--scrapes 200 --max-series 2000]

Builds a sidecar (build_sidecar, no database, no engine), fills its series budget with traffic
from 10,000 tenants x 5,000 models straight through the tracker (half of it from 10 hot models
x 300 tenants, so the admitted models see every outcome), then times, in this one process:

* `GET /metrics` over loopback HTTP from the served sidecar (what Prometheus waits for);
* MetricsPage.render() with every series unchanged since the last scrape, and with every
  counter and histogram child updated in between (the worst case);
* generate_latest over the same registry: every sample built and formatted on each scrape, as
  prometheus_client does (how /metrics rendered before).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import httpx
from prometheus_client import generate_latest

from collector.serving import serve_in_thread
from collector.sidecar.config import SidecarConfig
from collector.sidecar.exposition import MetricsPage
from collector.sidecar.live import LiveRequest
from collector.sidecar.tracker import OUTCOMES
from collector.sidecar.wiring import build_sidecar, sidecar_state


def _now() -> tuple[float, float]:
    """(began, now) of an upstream read that took no time, for Tracker.relayed."""
    now = time.monotonic()
    return now, now


def fill(tracker, requests: int, rng: random.Random) -> None:
    """Traffic that fills the budget: every outcome, live requests left in flight."""
    for i in range(requests):
        hot = i % 2 == 0
        request = LiveRequest(
            f"model-{rng.randrange(10 if hot else 5000)}",
            f"tenant-{rng.randrange(300 if hot else 10_000)}",
            "/v1/chat/completions",
            True,
            64,
            40,
        )
        tracker.admit(request)
        tracker.relayed(request, 2, *_now())
        if i % 50:
            tracker.finish(request, OUTCOMES[i % len(OUTCOMES)])


def timed_ms(action, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        action()
        times.append((time.perf_counter() - began) * 1000)
    return times


def _report(label: str, times: list[float]) -> None:
    times = sorted(times)
    print(
        f"{label:<48} median {statistics.median(times):7.2f} ms   p99 {times[int(len(times) * 0.99)]:7.2f} ms"
    )


def touch_everything(tracker) -> None:
    for vec in (tracker.requests, tracker.prompt_tokens, tracker.generated_tokens):
        for child in vec.children.values():
            child.inc()
    for vec in (tracker.ttft, tracker.tpot, tracker.duration):
        for child in vec.children.values():
            child.observe(0.3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--max-series", type=int, default=2000)
    args = parser.parse_args()
    config = SidecarConfig(
        upstream="http://127.0.0.1:9", db_path=None, engine="none", jobs=False, max_series=args.max_series
    )
    app = build_sidecar(config)
    tracker = sidecar_state(app).tracker
    fill(tracker, 60_000, random.Random(13))
    page = MetricsPage(sidecar_state(app).registry, [tracker.exported])
    loop = asyncio.new_event_loop()  # the page renders as /metrics does: the rest in a worker thread
    render = lambda: loop.run_until_complete(page.render())  # noqa: E731
    text = render()
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    print(
        f"series exported: {series} (budget {args.max_series}); {len(tracker.live)} in flight; "
        f"folded: {tracker.budget.folded}"
    )
    handle = serve_in_thread(app)
    try:
        with httpx.Client() as client:
            client.get(handle.url + "/metrics")
            _report(
                "GET /metrics (HTTP, unchanged series)",
                timed_ms(lambda: client.get(handle.url + "/metrics"), args.scrapes),
            )
    finally:
        handle.stop()
    _report("MetricsPage.render(), unchanged series", timed_ms(render, args.scrapes))

    def dirty_render() -> None:
        touch_everything(tracker)
        began = time.perf_counter()
        render()
        dirty.append((time.perf_counter() - began) * 1000)

    dirty: list[float] = []
    timed_ms(dirty_render, max(20, args.scrapes // 5))
    _report("MetricsPage.render(), every series updated", dirty)
    _report(
        "generate_latest, same series (as prometheus_client)",
        timed_ms(lambda: generate_latest(sidecar_state(app).registry), max(20, args.scrapes // 5)),
    )


if __name__ == "__main__":
    main()
