"""benchmarks/style_pairs.py, which decides the vLLM-style target (BENCHMARKS.md §2, stop 35):
each pair must hold one window of each style through a real `headroom run`, and every request
of both must succeed, or its ratios compare failures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.waiting import patient

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.subprocess


def _style_pairs(*args: str) -> subprocess.CompletedProcess[bytes]:
    """benchmarks/style_pairs.py with `args`, its exit checked."""
    return subprocess.run(
        [sys.executable, "benchmarks/style_pairs.py", *args],
        cwd=ROOT,
        capture_output=True,
        timeout=patient(300),
        check=True,
    )


@pytest.mark.serial  # 64 streams in 0.3 s windows: on a busy host a window saw no chunk at all
def test_a_short_run_pairs_both_styles_and_gives_a_verdict():
    # a window must see chunks: 0.3 s on a quiet host, stretched beside CPU hogs (one 0.3 s window
    # saw none there, and its pair was dropped)
    done = _style_pairs("--pairs", "3", "--window-s", str(patient(0.3)), "--no-progress")
    result = json.loads(done.stdout)["headroom"]
    assert result["pairs"] == 3 and result["failed"] == 0
    assert result["chunks_per_s"]["plain"] > 0 and result["chunks_per_s"]["vllm"] > 0
    assert len(result["vllm_over_plain_by_pair"]) == 3
    assert result["style_verdict"].endswith("for >= 0.98") and "over 3 rounds" in result["style_verdict"]
    assert result["cpu_us_per_chunk"]["plain"] > 0 and result["cpu_us_per_chunk"]["vllm"] > 0
    assert b"vLLM-style over plain" in done.stderr


def test_an_unknown_target_is_refused_with_the_known_ones():
    done = subprocess.run(
        [sys.executable, "benchmarks/style_pairs.py", "--targets", "litellm"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    assert done.returncode == 2 and "unknown target(s): litellm (known: headroom, direct)" in done.stderr


@pytest.mark.serial  # paired windows of chunk rates: a busy host failed its requests
def test_versus_the_floor_pairs_headroom_with_the_pass_through():
    done = _style_pairs("--versus-floor", "--pairs", "2", "--window-s", "0.3", "--no-progress")
    result = json.loads(done.stdout)["versus_floor"]
    assert result["pairs"] == 2 and result["failed"] == 0
    assert (
        set(result["chunks_per_s"]) == {"headroom", "passthrough"}
        and min(result["chunks_per_s"].values()) > 0
    )
    assert result["rate_verdict"].endswith("for >= 0.95") and result["cpu_verdict"].endswith("for <= 1.2")
    assert result["route"] == "/v1/chat/completions" and result["store"] == "duckdb"
    log = result["sidecar_log"]  # accounted, into DuckDB: no spool
    assert log["accounted_requests"] > 0 and "spool_files" not in log


@pytest.mark.serial  # paired windows of chunk rates, as above
def test_the_pass_through_route_streams_through_the_sidecar_unaccounted():
    done = _style_pairs(
        "--versus-floor", "--route", "passthrough", "--pairs", "2", "--window-s", "0.3", "--no-progress"
    )
    result = json.loads(done.stdout)["versus_floor"]
    assert result["pairs"] == 2 and result["failed"] == 0 and result["route"] == "/v1/bench/stream"
    assert min(result["chunks_per_s"].values()) > 0
    assert result["sidecar_log"]["accounted_requests"] == 0
    assert b"passthrough route" in done.stderr


@pytest.mark.serial  # paired windows of chunk rates, as above
def test_with_lake_the_sidecar_spools_its_rows_for_the_lake():
    done = _style_pairs("--versus-floor", "--lake", "--pairs", "2", "--window-s", "0.3", "--no-progress")
    result = json.loads(done.stdout)["versus_floor"]
    assert result["pairs"] == 2 and result["failed"] == 0 and result["store"] == "lake"
    log = result["sidecar_log"]
    assert log["accounted_requests"] > 0 and log["spool_files"] > 0 and log["spool_bytes"] > 0


def test_route_and_lake_are_refused_without_versus_floor():
    done = subprocess.run(
        [sys.executable, "benchmarks/style_pairs.py", "--lake"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    assert done.returncode == 2 and "--route, --lake and --style go with --versus-floor" in done.stderr


@pytest.mark.serial  # paired windows of chunk rates, as above
def test_versus_no_age_pairs_headroom_with_and_without_the_age_series_while_both_are_scraped():
    done = _style_pairs(
        "--versus-no-age", "--scrape-s", "0.1", "--pairs", "2", "--window-s", "0.3", "--no-progress"
    )
    result = json.loads(done.stdout)["versus_no_age"]
    assert result["pairs"] == 2 and result["failed"] == 0 and result["scrape_s"] == 0.1
    assert set(result["chunks_per_s"]) == {"headroom", "no_age"} and min(result["chunks_per_s"].values()) > 0
    assert result["rate_verdict"].endswith("for >= 0.98") and result["cpu_verdict"].endswith("for <= 1.02")
    text = result["tracker_text_us"]  # the age pass's own cost per scrape, timed in-process
    assert text["with_age"] > text["without_age"] > 0
