"""The sidecar's file-descriptor budget: the client connection cap fitted to RLIMIT_NOFILE.

Every client connection, upstream connection and open file costs a descriptor, and the kernel's
open-file limit bites silently: past it a connection fails in accept() and is never answered,
where the connection cap (collector.sidecar.server) would have answered 503 (issue #36 N7). So
the cap must bite first. `fit_connection_cap`, run once by `headroom run` before serving, first
lifts the soft RLIMIT_NOFILE toward the hard one (`raise_file_limit`), then clamps the cap to
what the limit leaves (`connection_cap`) and logs one WARNING when it had to:

    descriptors left = soft limit - FILE_RESERVE (64: log files, the store, DuckDB's WAL, the
                       reserved admin slots)
    upstream share   = min(upstream pool bound, half of what is left)
    cap              = min(requested, descriptors left - upstream share), at least 1

e.g. a soft limit of 1,024 with the default 1,024-connection upstream pool: 960 left, 480 for the
upstream, a cap of 480; a limit of 256 and a pool of 64: 192 left, a cap of 128.
"""

from __future__ import annotations

import logging
import resource

__all__ = ["FILE_RESERVE", "connection_cap", "fit_connection_cap", "raise_file_limit"]

log = logging.getLogger(__name__)
# descriptors kept for what is not a client or upstream connection: log files, the store, DuckDB's
# WAL, and the reserved admin slots
FILE_RESERVE = 64


def raise_file_limit(wanted: int) -> int:
    """Lift the soft RLIMIT_NOFILE to `wanted` (at most the hard limit); returns the new soft one
    (the old one where the kernel refuses)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return soft


def connection_cap(requested: int, file_limit: int, upstream_connections: int) -> int:
    """The client connection cap that fits `file_limit` open files (the module docstring):
    (4096, 1024, 1024) -> 480; (4096, 256, 64) -> 128; (100, 1024, 1024) -> 100; an unlimited
    `file_limit` (resource.RLIM_INFINITY) keeps `requested`."""
    if file_limit == resource.RLIM_INFINITY:
        return requested
    left = file_limit - FILE_RESERVE
    upstream_share = min(upstream_connections, left // 2)
    return max(1, min(requested, left - upstream_share))


def fit_connection_cap(requested: int, upstream_connections: int) -> int:
    """The cap to serve with: the soft RLIMIT_NOFILE lifted to cover `requested` (at most to the
    hard limit), then the cap clamped to it, with one WARNING naming both numbers when clamped."""
    limit = raise_file_limit(requested + upstream_connections + FILE_RESERVE)
    cap = connection_cap(requested, limit, upstream_connections)
    if cap < requested:
        wanted = requested + upstream_connections + FILE_RESERVE
        log.warning(
            "--max-client-connections %d lowered to %d: the open-file limit (RLIMIT_NOFILE) is %d "
            "and cannot be raised further (hard limit), and %d descriptors stay for the upstream "
            "pool and files; raise it to %d to keep %d (`ulimit -n %d` before starting, "
            "LimitNOFILE=%d in the systemd unit, or --ulimit nofile=%d in Docker)",
            requested,
            cap,
            limit,
            limit - cap,
            wanted,
            requested,
            wanted,
            wanted,
            wanted,
        )
    return cap
