"""The sidecar's per-client-address bounds: which address a connection counts under, how much one
address may hold, and the live counts per address.

One client must not be able to starve the others, or the monitoring, by holding every connection
slot or filling them with half-sent requests (issue #48). The connection guard
(collector.sidecar.server's `ConnectionGuard`) counts each connection under its client's address
(`source_of`: an IPv4 address, an IPv6 /64) in one `SourceCounts` per server, and refuses what
goes past the bounds `source_limits` works out from `--max-connections-per-source` and
`--max-partial-requests-per-source`.
"""

from __future__ import annotations

import ipaddress

__all__ = ["MIN_PARTIAL_PER_SOURCE", "SourceCounts", "source_limits", "source_of"]

MIN_PARTIAL_PER_SOURCE = 64  # the default per-address bound on partial requests, at least


def source_of(host: str) -> str:
    """The client address the per-source bounds count by: an IPv4 address as it is, an IPv6 one
    as its /64 (one host commonly holds a whole /64), an IPv4-mapped IPv6 one as the IPv4:
    '10.0.0.5' -> '10.0.0.5'; '2001:db8::1' -> '2001:db8::/64'; '::ffff:10.0.0.5' -> '10.0.0.5'."""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.partition("%")[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False))


def source_limits(
    max_connections: int, per_source_connections: int | None, per_source_partial: int | None
) -> tuple[int, int]:
    """(connections, partial requests) one client address may hold; None takes the default: the
    connection cap itself, and a quarter of it, at least MIN_PARTIAL_PER_SOURCE.
    (4096, None, None) -> (4096, 1024); (480, None, None) -> (480, 120); (5, None, None) -> (5, 64)."""
    connections = max_connections if per_source_connections is None else per_source_connections
    partial = (
        max(MIN_PARTIAL_PER_SOURCE, max_connections // 4)
        if per_source_partial is None
        else per_source_partial
    )
    return connections, partial


class SourceCounts:
    """Per client address (`source_of`): its open connections, the reserved admin slots it holds
    and its partial requests; an address with none of one is not in that table."""

    __slots__ = ("connections", "reserved", "partial")

    def __init__(self) -> None:
        self.connections: dict[str, int] = {}
        self.reserved: dict[str, int] = {}
        self.partial: dict[str, int] = {}

    @staticmethod
    def add(table: dict[str, int], source: str) -> int:
        """One more for `source` in `table`; returns its count now."""
        count = table.get(source, 0) + 1
        table[source] = count
        return count

    @staticmethod
    def remove(table: dict[str, int], source: str) -> None:
        count = table.get(source, 0) - 1
        if count > 0:
            table[source] = count
        else:
            table.pop(source, None)
