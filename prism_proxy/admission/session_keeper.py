"""The proxy's session table with its clock and its retention words to DART: the edge calls
it at each event of a chat with tools (`admission.sessions` says what the events mean)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from prism_proxy.admission.sessions import SessionParams, SessionTable
from prism_wire import Retention

# Sends a retention to DART's control RPC (every replica's: `edge.gateway.retain_to_all`).
SendRetention = Callable[[Retention], None]


class SessionKeeper:
    """The proxy's session table with its retention words to DART (`send`, or None
    without a control RPC: continuations are still recognised for QAS). Times come from
    `clock`; every method returns at once."""

    def __init__(
        self,
        params: SessionParams,
        send: SendRetention | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = SessionTable(params)
        self.send = send
        self.clock = clock

    def arrive(
        self, rid: str, keys: Sequence[str], head: str, tokens: int, client: str = ""
    ) -> float | None:
        """A request from `client` with cut ids `keys`: its program's start if it
        continues a paused session (None: a new program)."""
        now = self.clock()
        self.table.expire(now)
        found = self.table.arrive(rid, keys, head, tokens, now, client)
        self._send(found.retention)
        return found.program_start if found.continues else None

    def started(self, rid: str) -> None:
        self._send(self.table.started(rid, self.clock()))

    def calling(self, rid: str, tools: Sequence[str] = ()) -> None:
        self._send(self.table.calling(rid, self.clock(), tools))

    def finish(self, rid: str, tool_call: bool, tools: Sequence[str] = ()) -> None:
        self._send(self.table.finish(rid, tool_call, self.clock(), tools))

    def forget(self, rid: str) -> None:
        self._send(self.table.forget(rid, self.clock()))

    def _send(self, retention: Retention) -> None:
        if self.send is not None and retention:
            self.send(retention)
