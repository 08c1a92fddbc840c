"""Scrape each URL's /metrics every INTERVAL seconds until killed, as a fast Prometheus would.

python benchmarks/_scrape_loop.py 0.25 http://127.0.0.1:9100/metrics http://127.0.0.1:9101/metrics
"""

from __future__ import annotations

import sys
import time

import httpx


def main() -> None:
    interval_s, urls = float(sys.argv[1]), sys.argv[2:]
    with httpx.Client(timeout=5) as client:
        due = time.monotonic()
        while True:
            for url in urls:
                client.get(url).raise_for_status()
            due += interval_s
            time.sleep(max(0.0, due - time.monotonic()))


if __name__ == "__main__":
    main()
