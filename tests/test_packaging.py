"""The slim sidecar install: `pip install llm-headroom` (the sidecar) into a fresh venv runs `headroom run`
without scipy, kneed, matplotlib or numpy; the other commands name the extra they need."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import free_port
from support.upstream import FakeUpstream

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("scipy", "kneed", "matplotlib", "numpy", "grafana-client", "rich")
pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.timeout(600)]


def _site_packages_mb(venv: Path) -> float:
    (site,) = venv.glob("lib/python3*/site-packages")
    return sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) / 1e6


def test_sidecar_install_runs_headroom_run_without_the_analysis_stack(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    install = subprocess.run([*pip, "install", str(ROOT)], capture_output=True, text=True, timeout=480)
    assert install.returncode == 0, install.stderr[-3000:]
    listed = subprocess.run(
        [
            str(venv / "bin/python"),
            "-c",
            "import importlib.metadata as m, json; "
            "print(json.dumps([d.metadata['Name'] for d in m.distributions()]))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {name.lower() for name in json.loads(listed.stdout)}
    assert not installed & set(HEAVY), f"the sidecar install pulled in {sorted(installed & set(HEAVY))}"
    size = _site_packages_mb(venv)
    print(f"\nsidecar install: {size:.0f} MB in site-packages")  # docs/operations.md quotes this number
    assert size < 400, f"the sidecar install is {size:.0f} MB"

    headroom = str(venv / "bin/headroom")
    refused = subprocess.run([headroom, "report", "--help"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "llm-headroom[" in refused.stderr, refused.stderr

    upstream = FakeUpstream()
    port = free_port()
    sidecar = subprocess.Popen(
        [
            headroom,
            "run",
            "--upstream",
            upstream.url,
            "--listen",
            f"127.0.0.1:{port}",
            "--db",
            str(tmp_path / "log.duckdb"),
            "--engine",
            "none",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sidecar.poll() is None:
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert sidecar.poll() is None, sidecar.stdout.read()
        answer = httpx.post(
            url + "/v1/chat/completions",
            timeout=10,
            json={"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert answer.status_code == 200 and b"[DONE]" in answer.content
        assert (
            'headroom_requests_total{model="m1",outcome="ok",source="traffic",tenant="anonymous"} 1.0'
            in httpx.get(url + "/metrics").text
        )
    finally:
        sidecar.terminate()
        sidecar.wait(30)
        upstream.stop()
    log = sidecar.stdout.read()
    assert "Traceback" not in log, log
