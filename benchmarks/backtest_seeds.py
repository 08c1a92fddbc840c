"""How much a scenario's lead times depend on its seed: the same scenario, several Poisson realisations.

    .venv/bin/python benchmarks/backtest_seeds.py --scenario ramp --seeds 8

Prints JSON: per seed the first SLO breach (minutes from the start, and its kind), the lead of the
first warning and of the first page (minutes; negative: late), false pages and warnings, and
whether the scenario's expectations held; then the range of each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from collector.backtest.run import run_scenario
from collector.backtest.scenarios import SCENARIOS
from collector.rules.config import DEFAULT


def _minutes(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 60, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="ramp", choices=sorted(SCENARIOS))
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    rows = []
    for seed in range(1, args.seeds + 1):
        scenario = dataclasses.replace(SCENARIOS[args.scenario], seed=seed)
        with tempfile.TemporaryDirectory() as workdir:
            result = run_scenario(scenario, DEFAULT, Path(workdir))
        t = result.timeline
        rows.append(
            {
                "seed": seed,
                "passed": result.passed,
                "breach_min": _minutes(t.first_breach.start - t.start) if t.first_breach else None,
                "breach_kind": t.first_breach.kind if t.first_breach else None,
                "lead_warning_min": _minutes(t.lead_warning_s),
                "lead_page_min": _minutes(t.lead_page_s),
                "false_pages": len(t.false_pages),
                "false_warnings": len(t.false_warnings),
            }
        )

    def span(key: str) -> list:
        values = [row[key] for row in rows if row[key] is not None]
        return [min(values), max(values)] if values else []

    print(
        json.dumps(
            {
                "scenario": args.scenario,
                "seeds": rows,
                "range": {key: span(key) for key in ("breach_min", "lead_warning_min", "lead_page_min")},
                "passed": sum(row["passed"] for row in rows),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
