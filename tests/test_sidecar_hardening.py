"""Issue #36's sidecar defects, each against the real sidecar on loopback: `GET /v1` never
redirects (N5), tenant headers are read as UTF-8 (N10), and the client connection cap fits the
open-file limit (N7)."""

from __future__ import annotations

import contextlib
import resource
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.processes import headroom_process
from support.sidecar import CHAT, sidecar_rig, wait_until
from support.upstream import FakeUpstream

from collector.sidecar.server import FILE_RESERVE, connection_cap

PATH = "/v1/chat/completions"


# N5: /v1 and /v1/ are passed through, never redirected


@pytest.mark.parametrize("path", ["/v1", "/v1/", "//v1//"])
def test_v1_itself_is_passed_through_not_redirected_to_itself(tmp_path, path):
    with sidecar_rig(tmp_path) as rig:
        with httpx.Client(follow_redirects=False, timeout=10) as client:
            answer = client.get(rig.url + path)
        assert not answer.is_redirect, (answer.status_code, answer.headers)
        assert answer.status_code < 300
        assert rig.fake.targets[-1] == (b"/v1", b"")  # the engine got it, normalised
        with httpx.Client(follow_redirects=True, max_redirects=3, timeout=10) as client:
            followed = client.get(rig.url + path)  # a loop would raise TooManyRedirects
        assert followed.status_code < 300 and not followed.history


def test_an_unknown_path_with_a_trailing_slash_is_a_404_not_a_redirect(tmp_path):
    with sidecar_rig(tmp_path) as rig:
        answer = httpx.get(rig.url + "/healthz/", follow_redirects=False, timeout=10)
        assert answer.status_code == 200  # normalised to /healthz
        answer = httpx.get(rig.url + "/nothing/", follow_redirects=False, timeout=10)
        assert answer.status_code == 404


# N10: tenant headers are UTF-8, else Latin-1


def _tenants(rig) -> set[str]:
    return {
        dict(labels).get("tenant", "") for (name, labels) in rig.metrics() if name.startswith("headroom_")
    }


def test_a_utf8_tenant_header_is_the_tenant_in_metrics_and_in_the_request_log(tmp_path):
    tenant = "équipe-北京"
    with sidecar_rig(tmp_path) as rig:
        answer = httpx.post(
            rig.url + PATH, json=CHAT, headers=[(b"x-tenant-id", tenant.encode())], timeout=10
        )
        assert answer.status_code == 200
        (row,) = rig.rows()
        assert row["tenant"] == tenant
        assert tenant in _tenants(rig)
        page = httpx.get(rig.url + "/metrics", timeout=10).text
        assert f'tenant="{tenant}"' in page


def test_a_tenant_header_that_is_not_utf8_gets_one_stable_label(tmp_path):
    raw = b"\xff\xfe-team"  # not UTF-8: read as Latin-1, the same label every time
    with sidecar_rig(tmp_path) as rig:
        for _ in range(2):
            answer = httpx.post(rig.url + PATH, json=CHAT, headers=[(b"x-tenant-id", raw)], timeout=10)
            assert answer.status_code == 200
        rows = rig.rows()
        assert [row["tenant"] for row in rows] == ["ÿþ-team", "ÿþ-team"]
        assert "ÿþ-team" in _tenants(rig)


# N7: the connection cap fits the open-file limit


@pytest.mark.parametrize(
    ("requested", "file_limit", "upstream", "cap"),
    [
        (4096, 1_048_576, 1024, 4096),  # room for everything: unchanged
        (4096, 4096 + 1024 + FILE_RESERVE, 1024, 4096),  # exactly enough
        (4096, 4096 + 1024 + FILE_RESERVE - 1, 1024, 4095),  # one short
        (4096, 1024, 1024, 480),  # the common default limit: half of 960 left to the upstream
        (4096, 256, 64, 128),  # 192 left, 64 to the upstream pool
        (4096, 256, 1024, 96),  # upstream share bounded by half
        (100, 1024, 1024, 100),  # a small cap fits
        (4096, 64, 1024, 1),  # nothing left: still one connection, never 0
        (4096, 10, 1024, 1),  # below the reserve: never negative
        (4096, resource.RLIM_INFINITY, 1024, 4096),  # unlimited
    ],
)
def test_connection_cap_fits_the_file_limit(requested, file_limit, upstream, cap):
    assert connection_cap(requested, file_limit, upstream) == cap


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))  # soft and hard: cannot be raised


@contextlib.contextmanager
def _sidecar_with_256_files(tmp_path: Path, upstream: str) -> Iterator[tuple[str, Path]]:
    """`headroom run` with RLIMIT_NOFILE 256 (soft and hard); yields its URL and its log file."""
    log = tmp_path / "sidecar.log"
    args = ["run", "--upstream", upstream, "--db", str(tmp_path / "log.duckdb"), "--engine", "none"]
    args += ["--no-jobs", "--max-upstream-connections", "64", "--idle-timeout", "60"]
    with headroom_process(*args, health="/healthz", log=log, preexec_fn=_low_file_limit) as url:
        yield url, log


@pytest.mark.subprocess
def test_a_sidecar_under_a_low_file_limit_clamps_its_cap_warns_and_enforces_it(tmp_path):
    cap = connection_cap(4096, 256, 64)
    assert cap == 128
    with FakeUpstream() as fake, _sidecar_with_256_files(tmp_path, fake.url) as (url, log):
        warnings = [line for line in log.read_text().splitlines() if " WARNING " in line]
        clamped = [line for line in warnings if "--max-client-connections" in line]
        assert len(clamped) == 1, warnings
        assert "4096 lowered to 128" in clamped[0] and "limit (RLIMIT_NOFILE) is 256" in clamped[0]
        assert "ulimit -n" in clamped[0] and "LimitNOFILE=" in clamped[0]
        # the effective cap is 128: 128 connections served (each proved accepted by an answer),
        # the 129th refused with 503 by the sidecar, not left hanging by the kernel
        port = int(url.rsplit(":", 1)[1])
        held: list[socket.socket] = []
        try:
            for _ in range(cap):
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                held.append(sock)
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
                answer = extra.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503") and b"over 128 open connections" in answer
        finally:
            for sock in held:
                sock.close()

        def refused() -> bool:
            page = httpx.get(url + "/metrics", timeout=5).text
            return 'headroom_connections_refused_total{reason="connection_cap"} 1.0' in page

        wait_until(refused, what="the refusal counted")  # the sidecar sees the closes in its own time
