"""`headroom sim` as a user runs it: --help with examples, bad flags named, and a real process that
serves on the requested port and stops on Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from conftest import free_port
from support.waiting import patient

from collector.cli import main

pytestmark = pytest.mark.subprocess


def test_help_has_examples_and_every_knob():
    result = CliRunner().invoke(main, ["sim", "--help"])
    assert result.exit_code == 0
    for flag in (
        "--listen",
        "--flavor",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--kv-cache-tokens",
        "--max-waiting",
        "--speed",
        "--seed",
        "Examples:",
    ):
        assert flag in result.output


def test_bad_values_are_named():
    assert "speed=0.0 must be positive" in CliRunner().invoke(main, ["sim", "--speed", "0"]).output
    assert "not HOST:PORT" in CliRunner().invoke(main, ["sim", "--listen", "nowhere"]).output


def test_sim_process_serves_and_stops_on_ctrl_c():
    port = free_port()
    headroom = Path(sys.executable).parent / "headroom"
    process = subprocess.Popen(
        [str(headroom), "sim", "--listen", f"127.0.0.1:{port}", "--flavor", "sglang", "--speed", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline, body = time.monotonic() + patient(30), None
        while body is None and time.monotonic() < deadline:
            try:
                body = httpx.post(
                    f"http://127.0.0.1:{port}/v1/completions",
                    timeout=patient(10),
                    json={"prompt": "hi", "max_tokens": 4, "ignore_eos": True},
                ).json()
            except httpx.TransportError:
                time.sleep(0.1)
        assert body is not None and body["usage"]["completion_tokens"] == 4
        assert "sglang:num_running_reqs" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
        process.send_signal(signal.SIGINT)
        process.wait(timeout=patient(20))
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
