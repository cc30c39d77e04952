"""The proxy's session table with its clock and its pushes to DART: the edge calls
it at each event of a chat with tools (`admission.sessions` says what the events mean)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from prism_proxy.admission.retention_push import Push, RetainPush
from prism_proxy.admission.sessions import SessionParams, SessionTable


class SessionKeeper:
    """The proxy's session table with its pushes to DART (`push(retain, release)`, or
    None without a control RPC: continuations are still recognised for QAS). Times come
    from `clock`; every method returns at once."""

    def __init__(
        self,
        params: SessionParams,
        push: RetainPush | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = SessionTable(params)
        self.push = push
        self.clock = clock

    def arrive(
        self, rid: str, keys: Sequence[str], head: str, tokens: int, client: str = ""
    ) -> float | None:
        """A request from `client` with cut ids `keys`: its program's start if it
        continues a paused session (None: a new program)."""
        now = self.clock()
        self.table.expire(now)
        found = self.table.arrive(rid, keys, head, tokens, now, client)
        self._push(found.push)
        return found.program_start if found.continues else None

    def started(self, rid: str) -> None:
        self._push(self.table.started(rid, self.clock()))

    def calling(self, rid: str, tools: Sequence[str] = ()) -> None:
        self._push(self.table.calling(rid, self.clock(), tools))

    def finish(self, rid: str, tool_call: bool, tools: Sequence[str] = ()) -> None:
        self._push(self.table.finish(rid, tool_call, self.clock(), tools))

    def forget(self, rid: str) -> None:
        self._push(self.table.forget(rid, self.clock()))

    def _push(self, push: Push) -> None:
        if self.push is not None and push:
            self.push(push)
