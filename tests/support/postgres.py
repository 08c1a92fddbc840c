"""A real PostgreSQL for the tests: initdb in a temporary directory, pg_ctl on a loopback port.

Debian's `postgresql` package (installed by `make tools`, scripts/install-tools.sh) puts its
programs in /usr/lib/postgresql/<version>/bin, off PATH; they are found there or on PATH. initdb
refuses to run as root, so as root the cluster belongs to the package's `postgres` user
(`runuser`). Without PostgreSQL the tests that need it skip, except under CI=true, where they
fail (the suite's rule for real tools).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.processes import free_port
from support.waiting import patient

__all__ = ["PostgresServer", "find_pg_bin", "postgres_server", "require_postgres"]


def find_pg_bin() -> Path | None:
    """The directory holding initdb and pg_ctl: PATH first, then the newest Debian version."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


def require_postgres() -> Path:
    """The PostgreSQL bin directory; skip without one, fail under CI=true."""
    found = find_pg_bin()
    if found is None:
        message = "PostgreSQL is not installed (initdb, pg_ctl); run `make tools` (Debian's postgresql)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


@dataclass(frozen=True)
class PostgresServer:
    """A running cluster: its port; superuser `headroom` (trust, loopback only), database `postgres`."""

    port: int
    data: Path

    @property
    def url(self) -> str:
        """SQLAlchemy/pyiceberg URI of the database."""
        return f"postgresql://headroom@127.0.0.1:{self.port}/postgres"


def _as_owner(argv: list[str], owner: str | None) -> list[str]:
    return ["runuser", "-u", owner, "--", *argv] if owner else argv


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a throwaway PostgreSQL on 127.0.0.1:<free port>; stop it and delete it at exit."""
    bin_dir = require_postgres()
    owner = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="headroom-pg-"))
    data, sockets = root / "data", root / "run"
    sockets.mkdir()
    if owner:
        shutil.chown(root, owner)
        shutil.chown(sockets, owner)
    port = free_port()

    def run(*argv: str) -> None:
        done = subprocess.run(
            _as_owner(list(argv), owner), capture_output=True, text=True, timeout=patient(120)
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stdout[-800:]} {done.stderr[-800:]}")

    run(str(bin_dir / "initdb"), "-D", str(data), "-U", "headroom", "--auth=trust", "-E", "UTF8", "--no-sync")
    options = f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off"
    try:
        # -w: pg_ctl returns once the server accepts connections (it waits for that event itself)
        run(
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(root / "log"),
            "-w",
            "-t",
            str(round(patient(60))),
            "start",
        )
        yield PostgresServer(port=port, data=data)
    finally:
        with contextlib.suppress(Exception):
            run(
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-m",
                "fast",
                "-w",
                "-t",
                str(round(patient(60))),
                "stop",
            )
        shutil.rmtree(root, ignore_errors=True)
