"""The deadlines of one client connection, without I/O.

The proxy's HTTP protocol (`server.ProxyProtocol`) feeds events in with the loop's
time and keeps one timer armed at `next_deadline()`; when it fires, `due(now)` names the
limit that ran out. Every limit is a total from a fixed moment, so a client that sends
(or reads) one byte a second cannot stretch it:

    open ─────────▶ head ──▶ body ──▶ … response ends ──▶ idle ──first byte──▶ head …
    |── header_s ──|        |─ body_s ─|                  |─ keepalive_s ─|── header_s ──|
                   (from the head)                        (from the response's end)

* headers: the first request's head within `header_s` of the connection opening; a
  later one within `header_s` of its first byte, or of the previous response's end when
  its bytes came while that response was still being served (pipelining). The idle gap
  before the first byte is the keep-alive limit's, so `keepalive_s` keeps its meaning
  when it exceeds `header_s` (the defaults: 75 s and 60 s).
* body: the whole body within `body_s` of its head.
* idle: a kept-alive connection sends nothing for `keepalive_s` after a response.
* send: the client leaves the proxy's writes unread (the transport paused writing) for
  `send_s` without a break.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Expiry(StrEnum):
    """Which limit ran out (also the reason a connection was closed)."""

    SEND = "send"
    BODY = "body"
    HEADERS = "headers"
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The four time limits of a client connection, in seconds (all > 0)."""

    header_s: float
    body_s: float
    keepalive_s: float
    send_s: float


class ConnectionClock:
    """Deadlines of one connection. Events take `now` (any monotonic clock, seconds)."""

    __slots__ = ("_body_at", "_busy", "_header_at", "_idle_at", "_pending", "_send_at", "limits")

    def __init__(self, limits: ConnectionLimits, now: float) -> None:
        self.limits = limits
        self._header_at: float | None = now + limits.header_s  # counted from the opening
        self._body_at: float | None = None
        self._idle_at: float | None = None
        self._send_at: float | None = None
        self._busy = False  # a request was received and is not yet answered
        self._pending = False  # bytes of the next head arrived while busy

    def head_bytes(self, now: float) -> None:
        """Bytes of a request head (not of a body) arrived."""
        if self._busy:
            self._pending = True
        elif self._header_at is None:
            self._header_at = now + self.limits.header_s
            self._idle_at = None

    def head_received(self, now: float, *, has_body: bool) -> None:
        """A request head is complete; its body (if any) follows."""
        self._header_at = self._idle_at = None
        self._busy = True
        self._pending = False
        self._body_at = now + self.limits.body_s if has_body else None

    def body_received(self) -> None:
        self._body_at = None

    def body_grace(self, now: float, grace_s: float) -> None:
        """The body limit ran out and the handler was told: it has `grace_s` to answer."""
        self._body_at = now + grace_s

    def response_ended(self, now: float) -> None:
        """Every request received so far is answered; the connection waits for the next."""
        self._busy = False
        if self._pending:
            self._pending = False
            self._header_at = now + self.limits.header_s
        else:
            self._idle_at = now + self.limits.keepalive_s

    def writing_paused(self, now: float) -> None:
        self._send_at = now + self.limits.send_s

    def writing_resumed(self) -> None:
        self._send_at = None

    def next_deadline(self) -> float | None:
        """The earliest armed deadline (None: nothing to wait for)."""
        deadlines = [
            at
            for at in (self._send_at, self._body_at, self._header_at, self._idle_at)
            if at is not None
        ]
        return min(deadlines) if deadlines else None

    def due(self, now: float) -> Expiry | None:
        """The limit that has run out at `now`, if any (send first: it closes hardest)."""
        for at, expiry in (
            (self._send_at, Expiry.SEND),
            (self._body_at, Expiry.BODY),
            (self._header_at, Expiry.HEADERS),
            (self._idle_at, Expiry.IDLE),
        ):
            if at is not None and at <= now:
                return expiry
        return None
