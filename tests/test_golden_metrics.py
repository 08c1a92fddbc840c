"""The sidecar's /metrics, byte for byte, against a golden file (and `promtool check metrics` on it).

The golden exposition is what `headroom run` exports after a fixed set of requests: every family,
its HELP and TYPE, its label names and label sets, in order. Values that depend on the clock
(durations, timestamps, histogram buckets and sums of durations, `_created`) are normalised to
0; counts, histogram `_count`s included, are kept exact. A change to any exported metric fails here until the golden file is regenerated
(UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_golden_metrics.py) and the change reviewed.
"""

from __future__ import annotations

import os
import re
import subprocess

import httpx
import pytest
from conftest import FIXTURES, require_tool
from support.sidecar import CHAT, sidecar_rig
from support.waiting import patient

from collector.sidecar.wiring import sidecar_state
from collector.sources import gpu

GOLDEN = FIXTURES / "golden" / "sidecar_metrics.txt"
_CLOCKED = re.compile(r"^(\w*(seconds|_created)\w*?)(\{[^}]*\})? .*$")


def normalise(text: str) -> str:
    """Zero every clock-dependent sample value: 'x_seconds_sum{a="b"} 0.0123' -> 'x_seconds_sum{a="b"} 0'."""
    lines = []
    for line in text.splitlines():
        match = _CLOCKED.match(line)
        clocked = match and not line.startswith("#") and not match.group(1).endswith("_count")
        lines.append(f"{match.group(1)}{match.group(3) or ''} 0" if clocked else line)
    return "\n".join(lines) + "\n"


def _exposition(tmp_path, monkeypatch) -> str:
    monkeypatch.setattr(gpu, "pynvml", None)  # the machine's GPUs are not part of the golden file
    with sidecar_rig(tmp_path, engine="none") as rig:
        for mode, stream in (("ok", True), ("ok", False), ("429", True), ("500", False)):
            httpx.post(
                rig.url + "/v1/chat/completions",
                json={**CHAT, "stream": stream},
                headers={"x-fake": mode, "X-Tenant-ID": "team-a"},
                timeout=patient(10),
            )
        assert sidecar_state(rig.app).writer.flush(patient(30))
        return httpx.get(rig.url + "/metrics").text


def test_metrics_exposition_matches_the_golden_file(tmp_path, monkeypatch):
    text = normalise(_exposition(tmp_path, monkeypatch))
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "the /metrics exposition changed; see this module's docstring"


@pytest.mark.subprocess
def test_the_golden_file_passes_promtool_check_metrics():
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=GOLDEN.read_text(), capture_output=True, text=True
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )
