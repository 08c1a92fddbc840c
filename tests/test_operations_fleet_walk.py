"""docs/operations.md's "From one box to a fleet" commands, in order, on loopback: each one runs and succeeds.

The commands are read from the section's bash block, and only its placeholders are replaced: the
catalog host by a real PostgreSQL (the doc's fleet catalog; the block's own `createdb` makes the
database), the lake by a directory, the replica by the first sidecar, the spool folder by one under
the test's directory, and every service's `--listen` by a free port; `export` lines set the
environment of the commands after them and `headroom.duckdb` is a one-box log made first in the
working directory. Commands ending in `&` (the engine: the block's `headroom sim`, run at 20x speed
so that the probe's ladder takes seconds; the sidecars; the committer) start in the background and
are waited for (/health, /healthz, the committer's first pass); every other command must exit 0.
Between the first sidecar and the committer, this test is the clients. At the end the sidecars
stop (staging their spools) and the step-2 committer runs once more without --every, so the table
must hold every client request, the probe's requests and the one-box log's sealed days, once each.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import httpx
import pytest
import yaml
from support.postgres import PostgresServer, postgres_server, require_postgres
from support.processes import HEADROOM, free_port, stop_process
from support.synthetic import synthetic_rows
from support.waiting import patient, wait_until

from collector.lake.estimates import read_estimates
from collector.lake.layout import Lake
from collector.lake.read import open_lake_log
from collector.lake.table import open_catalog
from collector.store.db import RequestStore

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.timeout(patient(420))]

CATALOG_HOST, LAKE, ENGINE, REPLICA, SPOOL = (
    "@catalog-db/",
    "s3://llm-logs/headroom",
    "http://127.0.0.1:8000",
    "http://replica-0:9100",
    "/var/spool/headroom",
)
ONE_BOX_MODEL = "llama-3-8b"  # the one-box log's model: only the import brings it into the table
TENANT = "fleet-walk"  # this test's client requests
REQUESTS = 24


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def fleet_block() -> str:
    """The bash block of '## From one box to a fleet' in docs/operations.md."""
    text = (ROOT / "docs" / "operations.md").read_text()
    found = re.search(r"^## From one box to a fleet\n(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE)
    if found is None:
        pytest.fail('docs/operations.md has no section "## From one box to a fleet"')
    block = re.search(r"```bash\n(.*?)```", found.group(1), re.DOTALL)
    if block is None:
        pytest.fail('"## From one box to a fleet" in docs/operations.md has no ```bash block')
    return block.group(1).replace("\\\n", " ")


def _one_box_log(path: Path) -> set[str]:
    """A one-box DuckDB log of the last 3 days up to now; returns the ids of its sealed days' rows."""
    now = datetime.now(UTC)
    rows = synthetic_rows(
        600, now - timedelta(days=3), span=timedelta(days=3), models=(ONE_BOX_MODEL,), prefix="onebox"
    )
    store = RequestStore(path)
    store.insert_rows(rows)
    store.close()
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    return {row["request_id"] for row in rows if row["admitted_at"] < today}


def _client_load(sidecar: str) -> int:
    """What the fleet's clients do, bounded: REQUESTS streamed chats through the sidecar, 4 at a time;
    returns how many were answered whole."""
    body = {
        "model": "headroom-sim",
        "max_tokens": 16,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }

    def one(_: int) -> bool:
        answer = httpx.post(
            sidecar + "/v1/chat/completions", json=body, headers={"X-Tenant-ID": TENANT}, timeout=patient(30)
        )
        return answer.status_code == 200 and b"[DONE]" in answer.content

    with ThreadPoolExecutor(4) as pool:
        return sum(pool.map(one, range(REQUESTS)))


def _headroom(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One `headroom` command of the walk, run to its end in the walk's folder and environment."""
    return subprocess.run(
        [str(HEADROOM), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=patient(240)
    )


def _serving(process: subprocess.Popen[bytes], url: str, log: Path) -> bool:
    if process.poll() is not None:
        pytest.fail(f"{url} never answered (exit {process.returncode}):\n{log.read_text()[-3000:]}")
    try:
        return httpx.get(url, timeout=patient(1)).status_code == 200
    except httpx.HTTPError:
        return False


def _on_a_free_port(words: list[str]) -> list[str]:
    """A service's command with its --listen on a free loopback port (added where it has none)."""
    address = f"127.0.0.1:{free_port()}"
    if "--listen" in words:
        at = words.index("--listen") + 1
        return [*words[:at], address, *words[at + 1 :]]
    return [*words, "--listen", address]


def _first_pass(process: subprocess.Popen[bytes], log: Path) -> bool:
    if process.poll() is not None:
        pytest.fail(f"the committer exited {process.returncode}:\n{log.read_text()[-3000:]}")
    return re.search(r"\d+ files, \d+ rows in \d+ commits", log.read_text()) is not None


def test_operations_fleet_commands_run_in_order_on_loopback(postgres: PostgresServer, tmp_path: Path) -> None:
    block = fleet_block()
    for placeholder in (CATALOG_HOST, LAKE, ENGINE, REPLICA, SPOOL, "headroom.duckdb"):
        assert placeholder in block, (
            f"the fleet walk no longer has {placeholder!r}: update this test with the doc"
        )
    lines = [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    sealed = _one_box_log(tmp_path / "headroom.duckdb")
    lake = tmp_path / "lake"
    uri = re.search(r"postgresql://\S+", block)
    assert uri is not None, "the fleet walk's catalog is no longer PostgreSQL: update this test with the doc"
    assert "createdb --host catalog-db" in block, "the walk no longer creates the catalog's database"
    createdb = require_postgres() / "createdb"

    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADROOM_")} | {
        "NO_COLOR": "1",
        "COLUMNS": "120",
    }
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}  # by command, e.g. "lake import"
    background: list[tuple[str, subprocess.Popen[bytes]]] = []
    committer: list[str] = []
    sidecars: list[str] = []
    engine = ENGINE
    try:
        for number, line in enumerate(lines):
            line = (
                line.replace(CATALOG_HOST, f"@127.0.0.1:{postgres.port}/")
                .replace("--host catalog-db", f"--host 127.0.0.1 --port {postgres.port}")
                .replace(LAKE, str(lake))
                .replace(ENGINE, engine)
                .replace(REPLICA, sidecars[0] if sidecars else REPLICA)
                .replace(SPOOL, str(tmp_path / "spool"))
            )
            line = re.sub(r'"?\$(\w+)"?', lambda m: shlex.quote(env[m.group(1)]), line)
            words = shlex.split(line, comments=True)
            if words[0] == "export":
                name, _, value = words[1].partition("=")
                env[name] = value
                continue
            if words[0] == "createdb":
                done = subprocess.run([str(createdb), *words[1:]], env=env, capture_output=True, text=True)
                assert done.returncode == 0, f"`{line}` exited {done.returncode}: {done.stderr}"
                continue
            assert words[0] == "headroom", f"{line!r} is not a headroom command"
            log = tmp_path / f"{number}-{words[1]}.log"
            if words[-1] == "&":  # a service: started, waited for, stopped at the end
                words = _on_a_free_port(words[:-1]) if words[1] in ("sim", "run") else words[:-1]
                if words[1] == "sim":
                    words += ["--speed", "20", "--max-num-seqs", "4"]  # a probe ladder in seconds
                process = subprocess.Popen(
                    [str(HEADROOM), *words[1:]],
                    cwd=tmp_path,
                    env=env,
                    stdout=log.open("wb"),
                    stderr=subprocess.STDOUT,
                )
                background.append((line, process))
                if words[1] in ("sim", "run"):
                    url = "http://" + words[words.index("--listen") + 1]
                    health = "/health" if words[1] == "sim" else "/healthz"
                    wait_until(partial(_serving, process, url + health, log), 60, what=f"{line} serving")
                    if words[1] == "sim":
                        engine = url
                    else:
                        if not sidecars:  # this test is the first sidecar's clients
                            assert _client_load(url) == REQUESTS, "client requests through the sidecar failed"
                        sidecars.append(url)
                else:
                    wait_until(partial(_first_pass, process, log), 120, what="the committer's first pass")
                    every = words.index("--every")
                    committer = words[:every] + words[every + 2 :]
                continue
            done = _headroom(words[1:], tmp_path, env)
            assert done.returncode == 0, (
                f"`{line}` exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            )
            outputs[" ".join(word for word in words[1:3] if not word.startswith("-"))] = done
        for line, process in background:
            assert process.poll() is None, f"`{line}` exited {process.returncode} while the walk ran"
    finally:  # the sidecars stage their spools as they stop
        stopped = {line: stop_process(process, 30) for line, process in background}
    assert set(stopped.values()) <= {0, -signal.SIGTERM}, stopped
    assert len(sidecars) == 2 and committer, "the walk starts two sidecars and a committer"
    assert set(outputs) == {
        "lake maintain",
        "lake import",
        "report",
        "capacity curve",
        "probe",
        "integrations keda",
    }
    final = _headroom(committer[1:], tmp_path, env)
    assert final.returncode == 0, final.stderr[-3000:]

    catalog = env["HEADROOM_CATALOG"]
    assert catalog.startswith("postgresql://") and env["HEADROOM_LAKE"] == str(lake)
    with open_lake_log(catalog, str(lake)) as store:
        rows, distinct = store.query("SELECT count(*), count(DISTINCT request_id) FROM requests")[0]
        clients = store.query(
            "SELECT count(*) FROM requests WHERE tenant = ? AND model = 'headroom-sim' AND source = 'traffic'",
            [TENANT],
        )[0][0]
        probed = store.query(
            "SELECT count(*) FROM requests WHERE source = 'probe' AND model = 'headroom-sim'"
        )[0][0]
        imported = {
            row[0] for row in store.query("SELECT request_id FROM requests WHERE model = ?", [ONE_BOX_MODEL])
        }
    assert rows == distinct, "a row is in the table twice"
    assert clients == REQUESTS and imported == sealed and probed > 0
    assert rows == clients + probed + len(sealed), "rows no command of the walk made"

    assert ONE_BOX_MODEL in outputs["report"].stdout, outputs["report"].stdout
    [saved] = read_estimates(open_catalog(catalog, Lake.parse(str(lake)))).to_pylist()
    assert (
        saved["model"] == "headroom-sim"
        and f"estimate {saved['estimate_id']} saved" in outputs["probe"].stdout
    )
    scaled = yaml.safe_load(outputs["integrations keda"].stdout)
    assert scaled["kind"] == "ScaledObject" and scaled["spec"]["scaleTargetRef"]["name"] == "llm-inference"
    pool = json.loads(saved["estimate_json"])["recommended_pool"]
    assert any(f"or vector({pool})" in trigger["metadata"]["query"] for trigger in scaled["spec"]["triggers"])
