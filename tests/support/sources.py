"""Clients from more than one address on one machine: the sidecar's per-source bounds count by
client address, and on Linux all of 127.0.0.0/8 is loopback, so a socket bound to 127.0.0.2
before it connects is another client to the sidecar."""

from __future__ import annotations

import socket

__all__ = ["connect_from"]

_BIND_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux: the port is chosen at connect


def connect_from(source: str, port: int, timeout_s: float | None = 5.0) -> socket.socket:
    """A TCP connection to 127.0.0.1:`port` from the loopback address `source` (e.g. '127.0.0.2')."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.setsockopt(socket.IPPROTO_IP, _BIND_NO_PORT, 1)  # else bind() spends ephemeral ports early
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock
