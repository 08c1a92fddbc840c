"""What forged and junk probe runs cost an idle sidecar (#48 item 1): CPU and log lines.

    python benchmarks/forged_probe_runs.py [--runs 2000] [--idle-s 60]

A real `headroom run --db` (jobs on: the probe-run check every 5 s) in front of `headroom sim`.
Two phases of `--runs` requests, each with its own `X-Headroom-Run-Id` and no level:
  forged: `X-Headroom-Source: probe` without the sidecar's token (any client can send it);
  trusted: the same marks with the token (junk runs a real probe could leave).
After each phase the sidecar idles for `--idle-s` seconds; its CPU over that window (utime +
stime from /proc, as a share of one core) and the log lines its jobs wrote about probe runs are
printed as JSON. The second audit measured 29 % CPU and 122-130 INFO lines a second, for ever,
after 2,000 junk run ids.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_seconds, free_port, start, stop_all  # noqa: E402

HEADROOM = str(Path(sys.executable).parent / "headroom")
CHAT = {"model": "headroom-sim", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def _send(url: str, runs: int, marks: dict[str, str], prefix: str) -> int:
    """`runs` requests, one run id each (bounded: one request per run, 10 s each at most)."""
    ok = 0
    with httpx.Client(timeout=10) as client:
        for n in range(runs):
            headers = {**marks, "X-Headroom-Run-Id": f"{prefix}-{n}"}
            ok += client.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
    return ok


def _idle(pid: int, log: Path, idle_s: float) -> dict[str, float]:
    """CPU share of one core and probe-run log lines over an idle window."""
    lines_before = log.read_text().count("probe run")
    cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
    time.sleep(idle_s)  # the measurement window itself, not a synchronisation
    cpu = cpu_seconds(pid) - cpu_before
    wall = time.monotonic() - wall_before
    return {
        "cpu_share": round(cpu / wall, 4),
        "probe_run_log_lines": log.read_text().count("probe run") - lines_before,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--idle-s", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sim, proxy = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        db, log = Path(tmp) / "h.duckdb", Path(tmp) / "sidecar.log"
        env = {k: v for k, v in os.environ.items() if k != "HEADROOM_TOKEN"}
        processes = [
            start([HEADROOM, "sim", "--listen", sim, "--speed", "50"], f"http://{sim}/health", env=env)
        ]
        try:
            sidecar = start(
                [HEADROOM, "run", "--upstream", f"http://{sim}", "--db", str(db), "--listen", proxy],
                f"http://{proxy}/healthz",
                env=env | {"PYTHONUNBUFFERED": "1"},
                log=log,
            )
            processes.append(sidecar)
            url, token = f"http://{proxy}", Path(f"{db}.token").read_text().strip()
            result: dict[str, object] = {"runs": args.runs, "idle_s": args.idle_s}
            result["baseline"] = _idle(sidecar.pid, log, args.idle_s)
            forged = {"X-Headroom-Source": "probe"}
            result["forged_ok"] = _send(url, args.runs, forged, "forged")
            result["after_forged"] = _idle(sidecar.pid, log, args.idle_s)
            result["trusted_ok"] = _send(url, args.runs, forged | {"X-Headroom-Probe-Token": token}, "junk")
            result["after_trusted_first"] = _idle(sidecar.pid, log, args.idle_s)
            result["after_trusted_second"] = _idle(sidecar.pid, log, args.idle_s)
            metrics = httpx.get(f"{url}/metrics").text
            result["marks_ignored"] = [
                line
                for line in metrics.splitlines()
                if line.startswith("headroom_probe_marks_ignored_total{")
            ]
        finally:
            stop_all(processes)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
