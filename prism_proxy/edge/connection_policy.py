"""What a client connection may do (`ConnectionPolicy`, from `ProxyConfig`), and the
open-file limit that cap needs (`fd_budget`): the numbers `edge.server` enforces.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from prism_proxy.config import ProxyConfig
from prism_proxy.edge.clock import ConnectionLimits

log = logging.getLogger(__name__)


MAX_LINGERING = 256  # refused connections lingering at once (beyond: closed at once)
FD_SLACK = 128 + MAX_LINGERING  # files besides client and backend connections


@dataclass(frozen=True, slots=True)
class ConnectionPolicy:
    """What a client connection may do (from `ProxyConfig`; `max_connections` is the
    effective cap, which `fd_budget` may have lowered; `max_client_connections` is one
    client's, at most that)."""

    limits: ConnectionLimits
    max_connections: int
    max_body_bytes: int
    retry_after_s: int
    max_client_connections: int

    @classmethod
    def from_config(cls, config: ProxyConfig, max_connections: int) -> ConnectionPolicy:
        limits = ConnectionLimits(
            header_s=config.header_timeout_s,
            body_s=config.body_timeout_s,
            keepalive_s=config.keepalive_timeout_s,
            send_s=config.send_timeout_s,
        )
        per_client = min(config.client_connections, max_connections)
        return cls(limits, max_connections, config.max_body_bytes, config.retry_after_s, per_client)


def fd_budget(max_connections: int) -> int:
    """Raise the soft open-file limit towards the hard one so that `max_connections`
    clients fit (each may hold a backend connection too: 2x, plus `FD_SLACK`); return
    the cap that fits, lower than asked (with a warning) when the hard limit is short."""
    need = 2 * max_connections + FD_SLACK
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit to %d: %s", target, exc)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return max_connections
    fits = max(1, (soft - FD_SLACK) // 2)
    log.warning(
        "max_connections %d needs %d open files; the limit is %d (hard %s): serving at most"
        " %d client connections (raise the hard limit, e.g. LimitNOFILE= or ulimit -Hn)",
        max_connections, need, soft, hard, fits,
    )  # fmt: skip
    return fits
