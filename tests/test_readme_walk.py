"""The README's "Using it" commands, in order, on one box: each one runs and succeeds.

The commands are read from README.md itself. Long-running ones (`sim`, `run`, `store`) start in
the background and must serve /metrics; every other one must exit 0. Ports are moved to free
ones (other tests and engineers share this machine) and `export` lines set the environment of the
commands after them. Between starting the sidecar and the readers, this test is the clients: a
bounded load through the sidecar, so the request log has traffic to read.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import free_port
from support.waiting import patient

ROOT = Path(__file__).resolve().parent.parent
SERVERS = {"sim", "run"}
pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.timeout(patient(420))]


def readme_commands() -> list[str]:
    """The shell lines of the first code block under '## Using it', comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using it") :]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1).replace("\\\n", " ")
    return [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def _moved(line: str, ports: dict[str, str]) -> str:
    return re.sub(
        r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{ports.setdefault(m.group(1), str(free_port()))}", line
    )


def _wait_serving(process: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + patient(60)
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(url, timeout=patient(1)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pytest.fail(f"{url} never answered (exit {process.poll()}):\n{log.read_text()[-3000:]}")


def _client_load(sidecar: str) -> None:
    """What the README's clients do: requests through the sidecar, 40 in all at concurrency 1-4."""
    from collector.sim.load import run_level

    def payload(worker: int, index: int) -> dict:
        return {
            "model": "headroom-sim",
            "max_tokens": 16,
            "stream": True,
            "messages": [{"role": "user", "content": f"question {worker}-{index}"}],
        }

    for concurrency in (1, 2, 4):
        asyncio.run(run_level(sidecar, concurrency, 1.5, payload))


def test_readme_using_it_commands_run_in_order_on_one_box(tmp_path):
    headroom = str(Path(sys.executable).with_name("headroom"))
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}
    env.pop("HEADROOM_TOKEN", None)
    ports: dict[str, str] = {}
    servers: list[subprocess.Popen] = []
    ran = []
    try:
        for number, line in enumerate(readme_commands()):
            if line.startswith("export "):
                name, _, value = line[len("export ") :].partition("=")
                env[name] = subprocess.run(
                    ["bash", "-c", f"echo {value}"], capture_output=True, text=True, check=True
                ).stdout.strip()
                continue
            words = shlex.split(_moved(line, ports))
            assert words[0] == "headroom", f"README line {line!r} is not a headroom command"
            if words[1] in SERVERS:
                if words[1] == "run" and "--listen" not in words:
                    words += ["--listen", f"127.0.0.1:{ports.setdefault('9100', str(free_port()))}"]
                listen = words[words.index("--listen") + 1]
                log = tmp_path / f"server-{number}.log"
                servers.append(
                    subprocess.Popen(
                        [headroom, *words[1:]],
                        cwd=tmp_path,
                        env=env,
                        stdout=log.open("w"),
                        stderr=subprocess.STDOUT,
                    )
                )
                _wait_serving(servers[-1], f"http://{listen}/metrics", log)
                if words[1] == "run" and "--db" in words:
                    _client_load(f"http://{listen}")
            else:
                result = subprocess.run(
                    [headroom, *words[1:]],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=patient(240),
                )
                assert result.returncode == 0, (
                    f"`{line}` exited {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
                )
            ran.append(words[1])
        for server in servers:
            assert server.poll() is None, "a server of the README exited while the commands ran"
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            try:
                server.wait(patient(30))
            except subprocess.TimeoutExpired:
                server.kill()
    assert {"run", "probe", "capacity", "report", "lake", "dashboards", "alerts"} <= set(ran)
    assert (tmp_path / "knee.png").stat().st_size > 10_000
    assert not (tmp_path / "headroom.duckdb.owner").exists(), "the sidecar left its owner file behind"
