"""How long a backtest takes: each stage of one scenario through the real Prometheus, repeated.

    .venv/bin/python benchmarks/backtest_scenario.py --scenario ramp --runs 3

Prints JSON: per run the seconds of each stage (simulate: the scheduler in simulated time;
series: rebuilding the exported series; backfill: OpenMetrics + `promtool tsdb create-blocks-from
openmetrics` + Prometheus start; recording: the recording rules level by level; alerting: the
alert expressions and the state machine), the samples written, and the median of each stage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from collector.backtest.run import run_scenario
from collector.backtest.scenarios import SCENARIOS
from collector.rules.config import DEFAULT

STAGES = ("simulate_s", "series_s", "backfill_s", "recording_s", "alerting_s", "total_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="ramp", choices=sorted(SCENARIOS))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as workdir:
            result = run_scenario(SCENARIOS[args.scenario], DEFAULT, Path(workdir))
        runs.append(
            {stage: round(result.timings_s[stage], 2) for stage in STAGES}
            | {
                "samples": int(result.timings_s["samples"]),
                "passed": result.passed,
                "instant_queries": int(result.timings_s["instant_queries"]),
            }
        )
    scenario = SCENARIOS[args.scenario]
    print(
        json.dumps(
            {
                "scenario": args.scenario,
                "simulated_hours": scenario.duration_s / 3600,
                "runs": runs,
                "median": {stage: statistics.median(run[stage] for run in runs) for stage in STAGES},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
