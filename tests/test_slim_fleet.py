"""A slim fleet sidecar: `headroom run --lake` neither imports nor needs DuckDB. The real command
runs with DuckDB made unimportable (a sitecustomize that sets sys.modules['duckdb'] = None, so any
`import duckdb` raises), serves a request and stages its row; without the shim the same check
proves the shim bites (a --db sidecar cannot start)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from support.processes import HEADROOM, HeadroomProcess
from support.sidecar import CHAT
from support.upstream import FakeUpstream
from support.waiting import patient

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(patient(120))]

_NO_DUCKDB = "import sys\nsys.modules['duckdb'] = None  # `import duckdb` raises ImportError\n"


def _without_duckdb(tmp_path: Path) -> dict[str, str]:
    """The environment of a child in which DuckDB cannot be imported."""
    shim = tmp_path / "no-duckdb"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(_NO_DUCKDB)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))}


def test_a_lake_sidecar_serves_and_stages_without_duckdb(tmp_path):
    env = _without_duckdb(tmp_path)
    upstream, lake, log = FakeUpstream(), tmp_path / "lake", tmp_path / "sidecar.log"
    flags = ("--upstream", upstream.url, "--engine", "none", "--lake", str(lake))
    sidecar = HeadroomProcess(
        "run", *flags, "--spool-dir", str(tmp_path / "spool"), health="/readyz", log=log, env=env
    )
    try:
        sidecar.start(timeout_s=60)
        answer = httpx.post(
            sidecar.url + "/v1/chat/completions",
            json=CHAT,
            headers={"X-Request-Id": "fleet-1"},
            timeout=patient(10),
        )
        assert answer.status_code == 200 and b"[DONE]" in answer.content
        assert answer.headers["x-request-id"] == "fleet-1"
        sidecar.stop()  # SIGTERM: the spool rolls into a staged file
    finally:
        sidecar.stop()
        upstream.stop()
    assert "Traceback" not in log.read_text(), sidecar.log_tail()
    (staged,) = lake.glob("staged/*/*.parquet")  # rolled at the stop
    rows = pq.read_table(staged).to_pylist()
    assert [(r["model"], r["client_request_id"]) for r in rows] == [("m1", "fleet-1")]


def test_the_shim_makes_duckdb_unimportable(tmp_path):
    """The check above is only as good as its shim: a --db sidecar under it cannot start."""
    refused = subprocess.run(
        [str(HEADROOM), "run", "--upstream", "http://127.0.0.1:9", "--engine", "none", "--db", "log.duckdb"],
        env=os.environ | _without_duckdb(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    assert refused.returncode != 0 and "duckdb" in refused.stderr, refused.stderr[-2000:]
