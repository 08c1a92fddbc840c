"""The open-loop plot (collector.analysis.plot.render_rates_png) and the docs' image script
(scripts/openloop_plot.py: the simulator's ladder in simulated time, ~1 s, or a saved run's)."""

from __future__ import annotations

import json
import runpy
import struct
from pathlib import Path

import pytest

from collector.analysis.plot import DEFAULT_SIZE_PX, render_rates_png

ROOT = Path(__file__).resolve().parent.parent


def _size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])  # IHDR
    return width, height


def test_the_rates_plot_is_a_png_of_the_fixed_size_with_or_without_mu():
    level = {"offered_per_s": 1.0, "achieved_per_s": 0.98, "ttft_p95_s": 0.2, "drifting": False}
    past = {"offered_per_s": 3.0, "achieved_per_s": 2.0, "ttft_p95_s": 9.0, "drifting": True}
    with_mu = render_rates_png({"levels": [past, level], "mu_slo_requests_per_s": 2.0}, ttft_slo_s=1.0)
    without = render_rates_png({"levels": [level], "mu_slo_requests_per_s": None})
    assert _size(with_mu) == _size(without) == DEFAULT_SIZE_PX
    assert len(with_mu) > 20_000  # drawn, not blank


def test_the_docs_image_script_finds_the_slo_binding_below_saturation(tmp_path, capsys):
    script = runpy.run_path(str(ROOT / "scripts" / "openloop_plot.py"))
    script["main"](tmp_path / "p.png")
    assert _size((tmp_path / "p.png").read_bytes()) == DEFAULT_SIZE_PX
    line = capsys.readouterr().out
    # docs/capacity.md quotes these: analytic μ 2.024/s, μ_slo 1.518/s where p95 TTFT crosses 2 s
    assert "μ 2.024/s, μ_slo 1.518/s" in line and "p95 TTFT" in line
    assert (ROOT / "docs" / "img" / "openloop-sim.png").is_file()


def test_the_docs_image_script_draws_a_saved_probe_run(tmp_path):
    """`--from-json`: the ladder of an estimate `headroom probe --rates --json` saved (the real
    engine's figure), and a message naming the fix for one without a ladder."""
    script = runpy.run_path(str(ROOT / "scripts" / "openloop_plot.py"))
    level = {"offered_per_s": 2.0, "achieved_per_s": 1.9, "ttft_p95_s": 0.5, "drifting": False}
    past = {"offered_per_s": 3.0, "achieved_per_s": 2.4, "ttft_p95_s": 4.0, "drifting": True}
    estimate = {
        "model": "/models/gemma.gguf",
        "run_id": "probe-1",
        "slo": {"ttft_p95_s": 2.0},
        "rates": {"levels": [level, past], "mu_slo_requests_per_s": 2.0, "reason": "3/s fails"},
    }
    (tmp_path / "run.json").write_text(json.dumps(estimate))
    script["from_json"](tmp_path / "run.json", tmp_path / "run.png")
    assert _size((tmp_path / "run.png").read_bytes()) == DEFAULT_SIZE_PX
    (tmp_path / "knee.json").write_text(json.dumps(estimate | {"rates": None}))
    with pytest.raises(SystemExit, match="no open-loop ladder: run headroom probe with --rates"):
        script["from_json"](tmp_path / "knee.json", tmp_path / "knee.png")
