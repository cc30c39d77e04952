"""Client connections counted per client, as nginx's `limit_conn`: no client (a peer
address: a connection is counted before any header, so before a key could name it)
holds more than its cap, and when the proxy's own cap is reached, an idle connection
of the client holding the most is closed for a newcomer holding fewer.

Pure bookkeeping, generic over the connection object (the server's protocol): the
server asks and tells, this table never touches a socket. Bounded by the open
connections: a client's entry goes with its last connection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

C = TypeVar("C")


@dataclass(slots=True)
class _Client(Generic[C]):
    count: int = 0
    # Its connections with no request under way (waiting for a first head, or kept
    # alive between requests), oldest idle first: a dict keeps insertion order.
    idle: dict[C, None] = field(default_factory=dict)


class ClientConnections(Generic[C]):
    """Open connections per client, and which of them are idle."""

    __slots__ = ("_by_count", "_clients", "max_per_client")

    def __init__(self, max_per_client: int) -> None:
        self.max_per_client = max_per_client
        self._clients: dict[str, _Client[C]] = {}
        # The clients holding each count of connections. Clients holding N connections
        # in all have at most ~sqrt(2N) distinct counts (90 for 4,096), so the biggest
        # holders are found without a look at every client.
        self._by_count: dict[int, dict[str, None]] = {}

    def __len__(self) -> int:
        """Clients with a connection open."""
        return len(self._clients)

    def count(self, client: str) -> int:
        entry = self._clients.get(client)
        return 0 if entry is None else entry.count

    def admits(self, client: str) -> bool:
        """Whether `client` may open one more connection (below its cap)."""
        return self.count(client) < self.max_per_client

    def opened(self, client: str, conn: C) -> None:
        """`conn` of `client` is open and idle (no head received yet)."""
        entry = self._clients.get(client)
        if entry is None:
            entry = self._clients[client] = _Client()
        self._move(client, entry.count, entry.count + 1)
        entry.count += 1
        entry.idle[conn] = None

    def closed(self, client: str, conn: C) -> None:
        entry = self._clients[client]
        self._move(client, entry.count, entry.count - 1)
        entry.count -= 1
        entry.idle.pop(conn, None)
        if entry.count == 0:
            del self._clients[client]

    def _move(self, client: str, old: int, new: int) -> None:
        """`client` now holds `new` connections, not `old` (`_by_count`)."""
        if old:
            holders = self._by_count[old]
            del holders[client]
            if not holders:
                del self._by_count[old]
        if new:
            self._by_count.setdefault(new, {})[client] = None

    def busy(self, client: str, conn: C) -> None:
        """A request is under way on `conn` (its head's first bytes arrived)."""
        entry = self._clients.get(client)
        if entry is not None:
            entry.idle.pop(conn, None)

    def idle(self, client: str, conn: C) -> None:
        """`conn` answered its requests and waits for the next one."""
        entry = self._clients.get(client)
        if entry is not None:
            entry.idle.pop(conn, None)  # to the end: the most recently idle
            entry.idle[conn] = None

    def reclaimable(self, client: str) -> C | None:
        """With every connection slot taken: the connection to close so that `client`
        gets one, or None. The oldest idle connection of the client holding the most
        connections among those with one idle, when it holds more than `client` would
        with one more (so clients never trade slots back and forth, and no request under
        way is cut). Looks at the distinct counts above `client`'s, biggest first, and
        at their holders until one has an idle connection (only at the proxy's cap)."""
        wanted = self.count(client) + 1
        for count in sorted((c for c in self._by_count if c > wanted), reverse=True):
            for holder in self._by_count[count]:
                idle = self._clients[holder].idle
                if idle:
                    return next(iter(idle))
        return None
