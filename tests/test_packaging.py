"""The slim sidecar install: `pip install llm-headroom` (the sidecar) into a fresh venv runs `headroom run`
with --db and with --lake, without scipy, kneed, matplotlib, numpy or pyiceberg, and --lake after
DuckDB is uninstalled; the other commands name the extra they need."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from conftest import free_port
from support.upstream import FakeUpstream
from support.waiting import patient

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("scipy", "kneed", "matplotlib", "numpy", "grafana-client", "rich")
LAKE = (
    "pyiceberg",
    "sqlalchemy",
    "psycopg",
    "psycopg-binary",
)  # the [lake] extra: the committer's, not the sidecar's
pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.timeout(patient(600))]


def _site_packages_mb(venv: Path) -> float:
    (site,) = venv.glob("lib/python3*/site-packages")
    return sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) / 1e6


def test_sidecar_install_runs_headroom_run_without_the_analysis_stack(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=patient(120))
    pip = [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    install = subprocess.run(
        [*pip, "install", str(ROOT)], capture_output=True, text=True, timeout=patient(480)
    )
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
    assert not installed & set(HEAVY + LAKE), (
        f"the sidecar install pulled in {sorted(installed & set(HEAVY + LAKE))}"
    )
    size = _site_packages_mb(venv)
    print(f"\nsidecar install: {size:.0f} MB in site-packages")  # docs/operations.md quotes this number
    assert size < 400, f"the sidecar install is {size:.0f} MB"

    headroom = str(venv / "bin/headroom")
    refused = subprocess.run(
        [headroom, "report", "--help"], capture_output=True, text=True, timeout=patient(60)
    )
    assert refused.returncode == 1 and "llm-headroom[" in refused.stderr, refused.stderr

    upstream = FakeUpstream()
    try:
        with _sidecar(headroom, upstream.url, tmp_path, "--db", str(tmp_path / "log.duckdb")) as url:
            _one_request(url)
            assert (
                'headroom_requests_total{model="m1",outcome="ok",source="traffic",tenant="anonymous"} 1.0'
                in httpx.get(url + "/metrics", timeout=patient(5)).text
            )
        # a fleet sidecar needs no DuckDB (docs/operations.md, "Installing"): the image drops it
        subprocess.run([*pip, "uninstall", "-y", "duckdb"], check=True, timeout=patient(120))
        lake = tmp_path / "lake"
        with _sidecar(
            headroom, upstream.url, tmp_path, "--lake", str(lake), "--spool-dir", str(tmp_path / "spool")
        ) as url:
            _one_request(url)
    finally:
        upstream.stop()
    (staged,) = lake.glob("staged/*/*.parquet")  # rolled at the stop, with no pyiceberg installed
    assert pq.read_table(staged).column("model").to_pylist() == ["m1"]


@contextlib.contextmanager
def _sidecar(headroom: str, upstream: str, tmp_path: Path, *flags: str) -> Iterator[str]:
    """`headroom run` from the slim venv; yields its URL once ready; SIGTERM at exit, no traceback."""
    port = free_port()
    sidecar = subprocess.Popen(
        [
            headroom,
            "run",
            "--upstream",
            upstream,
            "--listen",
            f"127.0.0.1:{port}",
            "--engine",
            "none",
            *flags,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + patient(60)
        while time.monotonic() < deadline and sidecar.poll() is None:
            try:
                if httpx.get(url + "/readyz", timeout=patient(2)).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert sidecar.poll() is None, sidecar.stdout.read() if sidecar.stdout else ""
        yield url
    finally:
        sidecar.terminate()
        sidecar.wait(patient(30))
    log = sidecar.stdout.read() if sidecar.stdout else ""
    assert "Traceback" not in log, log


def _one_request(url: str) -> None:
    answer = httpx.post(
        url + "/v1/chat/completions",
        timeout=patient(10),
        json={"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert answer.status_code == 200 and b"[DONE]" in answer.content
