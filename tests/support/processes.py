"""The one helper for `headroom` subprocesses: start one, wait until it answers, stop it.

`HeadroomProcess` can be stopped and started again on the same port (a store restarted under
load); `headroom_process` is the context-manager form most tests use. Output goes to a log file
(or is discarded), and a process that dies or never answers fails with the tail of that log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from support.waiting import patient

__all__ = ["HEADROOM", "HeadroomProcess", "free_port", "headroom_process", "sim_process", "stop_process"]

HEADROOM = Path(sys.executable).parent / "headroom"  # the installed console script


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> int:
    """SIGTERM (graceful: a sidecar flushes its log, Prometheus its TSDB), wait; kill past `timeout_s`."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(patient(timeout_s))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(patient(10))
    return process.returncode


class HeadroomProcess:
    """`headroom ARGS --listen 127.0.0.1:PORT` as a child process, ready once `health` answers 200."""

    def __init__(
        self,
        *args: str,
        health: str,
        port: int | None = None,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.args, self.health, self.log, self.preexec_fn = args, health, log, preexec_fn
        self.port = port or free_port()
        self.env = os.environ | (env or {})
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> HeadroomProcess:
        """Start it and poll `health` (a process's readiness has no event to await)."""
        out = self.log.open("ab") if self.log else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                [str(HEADROOM), *self.args, "--listen", f"127.0.0.1:{self.port}"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=self.preexec_fn,  # e.g. a lower RLIMIT_NOFILE for the child only
            )
        finally:
            if self.log:
                out.close()  # type: ignore[union-attr]
        timeout_s = patient(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(self.url + self.health, timeout=patient(1)).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            exited = self.process.poll() is not None
            if exited or time.monotonic() > deadline:
                self.stop()
                why = f"exited {self.process.returncode}" if exited else f"no answer within {timeout_s} s"
                raise RuntimeError(f"headroom {self.args[0]} did not start ({why}): {self.log_tail()}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (graceful: a sidecar flushes its log), then wait; kill past `timeout_s`."""
        if self.process is None:
            return None
        return stop_process(self.process, timeout_s)

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the process's output (when it has a log file)."""
        return self.log.read_text(errors="replace")[-chars:] if self.log and self.log.exists() else ""


@contextlib.contextmanager
def headroom_process(
    *args: str,
    health: str,
    port: int | None = None,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[str]:
    """Run `headroom ARGS --listen 127.0.0.1:PORT`; yields its URL once `health` answers 200."""
    process = HeadroomProcess(
        *args, health=health, port=port, log=log, env=env, preexec_fn=preexec_fn
    ).start()
    try:
        yield process.url
    finally:
        process.stop()


def sim_process(**flags: object) -> contextlib.AbstractContextManager[str]:
    """Run `headroom sim` with --flag value pairs on a free port; yields its base URL."""
    args = ["sim"]
    for name, value in flags.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return headroom_process(*args, health="/health")
