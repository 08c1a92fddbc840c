"""Central rulers on loopback for tests/test_central_rulers.py: Prometheus agents that remote-write
one cluster each, a central Prometheus (remote-write receiver) and VictoriaMetrics with vmalert.

Every process listens on 127.0.0.1 at a port from free_port(), writes its output to a log file in
the test's directory, and is a `Service`: its URL, its log's tail for failure messages, `stop()`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from support.processes import free_port, stop_process
from support.waiting import patient, wait_until

__all__ = [
    "Service",
    "AlertSink",
    "start_service",
    "stop_services",
    "write_targets",
    "start_agent",
    "start_central_prometheus",
    "start_victoria_metrics",
    "start_vmalert",
    "query",
    "firing_alerts",
    "rule_errors",
    "hold_requests",
]

INTERVAL = "1s"  # scrape, evaluation and remote-write flush: the test waits on seconds, not minutes


@dataclass
class Service:
    """A started program: its process, base URL and log file."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def tail(self, chars: int = 3000) -> str:
        """The end of the program's output."""
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after patient(10) s."""
        stop_process(self.process)


class AlertSink:
    """An Alertmanager stand-in on loopback: accepts every POST of alerts and keeps their bodies."""

    def __init__(self) -> None:
        self.posts: list[Any] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.posts.append(json.loads(body or b"null"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        """Stop serving and free the port."""
        self.server.shutdown()
        self.server.server_close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=patient(1)).status_code == 200
    except httpx.HTTPError:
        return False


def start_service(name: str, args: list[str], port: int, ready_path: str, log: Path) -> Service:
    """Start `args`, wait until GET ready_path answers 200; fail with the log's tail if it exits."""
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    service = Service(name, process, f"http://127.0.0.1:{port}", log)
    try:
        wait_until(
            lambda: process.poll() is not None or _answers(service.url + ready_path),
            30,
            what=f"{name} to answer {ready_path}",
            interval_s=0.1,
        )
    except AssertionError as error:
        service.stop()
        raise AssertionError(f"{error}: {service.tail()}") from None
    if process.poll() is not None:
        raise AssertionError(f"{name} exited with {process.returncode}: {service.tail()}")
    return service


def stop_services(services: list[Service]) -> None:
    """Stop every service, the last started first."""
    for service in reversed(services):
        service.stop()


def write_targets(path: Path, targets: list[str]) -> None:
    """Write a file_sd target list atomically (a rename), so no reader sees half a file."""
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps([{"targets": targets}] if targets else []))
    os.replace(scratch, path)


DOCUMENTED_AGENT = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
_AGENT_MARKER = "<!-- agent config: loaded by tests/test_central_rulers.py -->"


def documented_agent_config() -> dict[str, Any]:
    """The agent configuration docs/operations.md shows ("Fleet scale"), parsed as written."""
    text = DOCUMENTED_AGENT.read_text(encoding="utf-8")
    block = text.split(_AGENT_MARKER, 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    config: dict[str, Any] = yaml.safe_load(block)
    return config


def _agent_config(cluster: str, job: str, targets: Path, instance: str, writers: list[str]) -> dict[str, Any]:
    """docs/operations.md's agent config with only the cluster, addresses and intervals changed.

    Service discovery becomes a file_sd list (the test empties it to make the job vanish) and the
    instance is relabelled to the same value in every cluster; the remote-write filter is the
    documented one, so a regex that dropped `up` or the sidecar's series would fail the test.
    """
    config = documented_agent_config()
    config["global"] |= {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL}
    config["global"]["external_labels"]["cluster"] = cluster
    (scrape,) = config["scrape_configs"]
    assert scrape["job_name"] == job, (
        f"docs/operations.md's agent scrapes job {scrape['job_name']!r}, not {job!r}"
    )
    scrape.pop("kubernetes_sd_configs", None)
    scrape["file_sd_configs"] = [{"files": [str(targets)], "refresh_interval": INTERVAL}]
    # the same instance in every cluster: only `cluster` tells the series apart
    scrape["relabel_configs"] = [{"target_label": "instance", "replacement": instance}]
    (documented,) = config["remote_write"]
    queue = {"batch_send_deadline": INTERVAL, "min_backoff": "100ms", "max_backoff": INTERVAL}
    config["remote_write"] = [
        documented | {"url": f"{url}/api/v1/write", "queue_config": queue} for url in writers
    ]
    return config


def start_agent(
    prometheus: str, cluster: str, job: str, targets: Path, instance: str, writers: list[str], tmp: Path
) -> Service:
    """`prometheus --enable-feature=agent` scraping `job` from file_sd `targets`, writing to `writers`."""
    config = tmp / f"agent-{cluster}.yml"
    config.write_text(yaml.safe_dump(_agent_config(cluster, job, targets, instance, writers)))
    port = free_port()
    args = [
        prometheus,
        "--enable-feature=agent",
        f"--config.file={config}",
        f"--storage.agent.path={tmp / f'agent-{cluster}'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return start_service(f"agent {cluster}", args, port, "/-/ready", tmp / f"agent-{cluster}.log")


def start_central_prometheus(prometheus: str, rules: Path, tmp: Path) -> Service:
    """Prometheus with --web.enable-remote-write-receiver evaluating every rule file in `rules`."""
    config = tmp / "central.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"evaluation_interval": INTERVAL},
                "rule_files": [str(rules / "*.yaml")],
            }
        )
    )
    port = free_port()
    args = [
        prometheus,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp / 'central'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-remote-write-receiver",
    ]
    return start_service("central prometheus", args, port, "/-/ready", tmp / "central.log")


def start_victoria_metrics(binary: str, tmp: Path) -> Service:
    """Single-node VictoriaMetrics; answers queries on samples as soon as they arrive."""
    port = free_port()
    args = [
        binary,
        f"-storageDataPath={tmp / 'vm'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-search.latencyOffset=0s",  # default 30s: instant queries near now would read 30 s ago
        "-search.disableCache",
    ]
    return start_service("victoria-metrics", args, port, "/health", tmp / "vm.log")


def start_vmalert(binary: str, rules: Path, vm: str, notifier: str, tmp: Path) -> Service:
    """vmalert on `rules`, reading VM, writing recorded series and ALERTS back to it, notifying `notifier`."""
    port = free_port()
    args = [
        binary,
        f"-rule={rules / '*.yaml'}",
        f"-datasource.url={vm}",
        f"-remoteWrite.url={vm}",
        f"-remoteRead.url={vm}",
        f"-notifier.url={notifier}",  # a refused notification would be every alert's lastError
        f"-evaluationInterval={INTERVAL}",
        f"-remoteWrite.flushInterval={INTERVAL}",
        f"-httpListenAddr=127.0.0.1:{port}",
    ]
    return start_service("vmalert", args, port, "/health", tmp / "vmalert.log")


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query against a Prometheus-compatible /api/v1/query (Prometheus, VictoriaMetrics)."""
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=patient(5)).json()
    assert answer["status"] == "success", f"{expr}: {answer}"
    return list(answer["data"]["result"])


def firing_alerts(url: str, alertname: str) -> list[dict[str, str]]:
    """Labels of each firing `alertname` on a ruler's /api/v1/alerts (Prometheus or vmalert)."""
    answer = httpx.get(f"{url}/api/v1/alerts", timeout=patient(5)).json()
    return [
        alert["labels"]
        for alert in answer["data"]["alerts"] or ()  # vmalert answers null for none
        if alert["state"] == "firing" and alert["labels"].get("alertname") == alertname
    ]


def rule_errors(url: str) -> dict[str, str]:
    """{rule name: last evaluation error} of every failing rule on /api/v1/rules (Prometheus, vmalert)."""
    answer = httpx.get(f"{url}/api/v1/rules", timeout=patient(5)).json()
    return {
        rule["name"]: rule["lastError"]
        for group in answer["data"]["groups"] or ()
        for rule in group["rules"] or ()
        if rule.get("lastError")
    }


def hold_requests(url: str, model: str, count: int) -> list[socket.socket]:
    """Open `count` chat requests for `model` that the fake upstream never answers (`x-fake: hang`).

    Each stays in flight at the sidecar until its socket is closed.
    """
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hold"}]}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"x-fake: hang\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    sockets = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=patient(5))
        sock.sendall(head.encode() + body)
        sockets.append(sock)
    return sockets
