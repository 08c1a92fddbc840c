"""Draw the open-loop plots of docs/capacity.md ("Capacity in rates"): achieved rate and p95 TTFT
against offered rate, μ_slo marked; the simulator's (docs/img/openloop-sim.png), or a real run's
from the estimate `headroom probe --rates ... --json` saved (docs/img/openloop-llamacpp.png).

The simulator runs in simulated time (tests/support/offline.py: seeded, a few seconds of CPU): cpu
cost profile, 4 slots, 40-token prompts, 32 output tokens, whose analytic μ is
collector.sim.cost.predicted_rate (~2.02 requests/s). Every offered rate from 0.4 to 1.5 x μ is
measured (the probe's ladder would stop at the first failure; the plot shows what lies past it),
400 requests' worth of time each, the first 15 % warm-up.

    .venv/bin/python scripts/openloop_plot.py [OUT.png]
    .venv/bin/python scripts/openloop_plot.py --from-json ESTIMATE.json OUT.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from collector.analysis.openloop import rate_level, rate_result
from collector.analysis.plot import render_rates_png
from collector.analysis.stats import seconds
from collector.capacity import Slo
from collector.sim.config import SimConfig

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the offline simulator is a test helper, not the product
from support.offline import Mix, poisson_rows  # noqa: E402

OUT = ROOT / "docs" / "img" / "openloop-sim.png"
MULTIPLES = (0.4, 0.6, 0.75, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.35, 1.5)
SLO = Slo(ttft_p95_s=2.0)


def main(out: Path) -> None:
    config = SimConfig(max_num_seqs=4, cost_profile="cpu", seed=7, max_waiting=10_000)
    mix = Mix(prompt_tokens=40, output_tokens=32)
    mu = config.predicted_rate(40, 32).requests_per_s
    levels = []
    for n, multiple in enumerate(MULTIPLES):
        rate = round(mu * multiple, 3)
        duration = 400 / mu
        rows = poisson_rows(config, lambda t, rate=rate: rate, duration, mix, seed=n)
        start = min(seconds(r["admitted_at"]) or 0.0 for r in rows)
        measured = []
        for i, row in enumerate(rows):
            at = (seconds(row["admitted_at"]) or 0.0) - start
            row.update(request_id=f"plot-{i:06d}", probe_rate_per_s=rate, probe_warmup=at < 0.15 * duration)
            if at >= 0.15 * duration:
                measured.append(at + start)
        levels.append(rate_level(rows, rate, (min(measured), max(measured)), slo=SLO))
    result = rate_result(levels)
    png = render_rates_png(
        result.to_dict(),
        ttft_slo_s=SLO.ttft_p95_s,
        reference=(f"analytic μ {mu:.3g}/s (saturation)", mu),
        title=f"headroom sim, cpu profile, 4 slots: analytic μ {mu:.3g}/s, μ_slo {result.mu_slo_per_s:.3g}/s",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    print(f"wrote {out}: μ {mu:.3f}/s, μ_slo {result.mu_slo_per_s}/s ({result.reason})")


def from_json(estimate_path: Path, out: Path) -> None:
    """The ladder of a saved estimate (one class: `headroom probe --json` without a workload)."""
    estimate = json.loads(estimate_path.read_text())
    rates, slo = estimate.get("rates"), (estimate.get("slo") or {}).get("ttft_p95_s")
    if not rates or not rates.get("levels"):
        raise SystemExit(
            f"{estimate_path} has no open-loop ladder: run headroom probe with --rates and --json"
        )
    model = Path(estimate.get("model") or "model").name.removesuffix(".gguf")
    mu = rates.get("mu_slo_requests_per_s")
    shown = f"μ_slo {mu:.3g}/s" if mu is not None else "no μ_slo"
    slo_text = f", SLO p95 TTFT {slo:g} s" if slo is not None else ""
    png = render_rates_png(
        rates, ttft_slo_s=slo, title=f"{model}, run {estimate.get('run_id')}: {shown}{slo_text}"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    print(f"wrote {out}: {shown} ({rates.get('reason')})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "out", nargs="?", type=Path, default=OUT, help=f"the PNG to write (default {OUT.name})"
    )
    parser.add_argument(
        "--from-json", type=Path, metavar="ESTIMATE", help="draw a saved estimate's rates section"
    )
    args = parser.parse_args()
    if args.from_json is not None:
        from_json(args.from_json, args.out)
    else:
        main(args.out)
