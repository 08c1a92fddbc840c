"""Tables for people: `headroom probe | cat` shows every header whole, and so does an 80-column terminal."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from support.waiting import patient
from test_analysis_estimate import _estimate

from collector.analysis.render import LEVEL_HEADERS, levels_table

TESTS = Path(__file__).resolve().parent
# the headers for people, as printed: the second line of each (or its only one), then the first lines
BOTTOM = [header.split("\n")[-1] for header in LEVEL_HEADERS]
TOP = [header.split("\n")[0] for header in LEVEL_HEADERS if "\n" in header]


def _header_line(text: str) -> str:
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == BOTTOM[:2])
    assert lines[at - 1].split() == TOP, lines[at - 1]  # the first lines of the two-line headers, whole
    return lines[at]


@pytest.mark.subprocess
def test_piped_probe_output_keeps_every_header_whole():
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONPATH": str(TESTS)}
    script = (
        "from test_analysis_estimate import _estimate\nfrom collector.analysis.render import print_estimate\n"
        "print_estimate(_estimate(slo_ttft=0.5))\n"
    )
    piped = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=patient(60),
        cwd=TESTS,
    ).stdout
    line = _header_line(piped)
    assert line.split() == BOTTOM, line
    assert "…" not in piped
    assert "Kneedle: tokens/s bends at concurrency" in piped and "None" not in piped
    assert "bends at no bend" not in piped


def test_an_80_column_terminal_shows_every_header_and_marks_the_knee():
    for width in (80, 120):
        buffer = io.StringIO()
        console = Console(file=buffer, width=width, force_terminal=True, color_system=None)
        console.print(levels_table(_estimate()))
        text = buffer.getvalue()
        assert _header_line(text).split() == BOTTOM, (width, text)
        assert "knee" in text and max(len(line) for line in text.splitlines()) <= width


def test_kneedle_without_a_bend_reads_as_a_sentence_and_the_rule_is_never_broken_mid_line():
    from dataclasses import replace

    from collector.analysis.render import print_estimate

    estimate = _estimate(slo_ttft=0.5)
    estimate = replace(
        estimate,
        knee=replace(estimate.knee, kneedle_throughput=None, kneedle_latency=None, rule_reason="word " * 40),
    )
    buffer = io.StringIO()
    print_estimate(estimate, Console(file=buffer, width=60, color_system=None))
    text = buffer.getvalue()
    assert "Kneedle: tokens/s shows no bend, p95 TTFT shows no bend;" in text
    assert "  rule: " + "word " * 39 + "word" in text  # one line, however narrow the console


def test_demo_table_fits_120_columns_with_whole_headers():
    from collector.sim.demo_render import _level_table

    level = {
        "concurrency": 4,
        "requests": 120,
        "rate_limited": 0,
        "output_tokens_per_s": 812.0,
        **{f"{m}_{q}_s": 0.0123 for m in ("ttft", "tpot") for q in ("p50", "p95", "p99")},
    }
    summary = {
        "db": "headroom-demo/headroom.duckdb",
        "levels": [level],
        "calibers": {"per_level_peaks": {4: {"inflight": 4, "active_tokens": 2400}}},
    }
    buffer = io.StringIO()
    Console(file=buffer, width=120, force_terminal=True, color_system=None).print(_level_table(summary))
    text = buffer.getvalue()
    assert "…" not in text and "TTFT ms" in text and "p50 / p95 / p99" in text and "active tok" in text
    assert max(len(line) for line in text.splitlines()) <= 120
