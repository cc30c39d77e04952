"""Answers the HTTP server writes itself, outside the application: over a connection
cap, at the header limit, for another HTTP version (`edge.server`). Each carries an
`x-request-id` as the application's answers do (`edge.tracing`)."""

from __future__ import annotations

from aiohttp import web

from prism_proxy.edge.errors import raw_error
from prism_proxy.edge.tracing import REQUEST_ID_HEADER, TRACE, new_request_id, request_id_of


class RawAnswer:
    """An error answer the protocol writes itself (`errors.raw_error`), before or
    without a request object: over a connection cap, at the header limit, another HTTP
    version. Built once; each copy carries its own `x-request-id`."""

    __slots__ = ("_head", "_tail")

    def __init__(
        self, status: int, message: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        marker = "-" * 32  # never a made id (hex digits)
        whole = raw_error(status, message, {**(headers or {}), REQUEST_ID_HEADER: marker})
        self._head, _, self._tail = whole.partition(marker.encode())

    def render(self, request_id: str | None = None) -> bytes:
        """The answer with `request_id` (a new one when None)."""
        return self._head + (request_id or new_request_id()).encode() + self._tail


def answer_request_id(request: web.BaseRequest) -> str:
    """The id of a request answered outside the application (or past it): its trace's
    when the tracing middleware ran, else the client's when safe, else a new one."""
    trace = request.get(TRACE)
    if trace is not None:
        return trace.request_id
    return request_id_of(request.headers.get(REQUEST_ID_HEADER))


def answerable(head: bytes) -> bool:
    """Whether a client whose head is `head` so far can read an HTTP/1.x answer: not
    when its request line is complete and names no HTTP/1.x version (HTTP/0.9)."""
    line, newline, _ = head.lstrip(b"\r\n").partition(b"\n")
    return not newline or line.rstrip(b"\r").endswith((b" HTTP/1.1", b" HTTP/1.0"))
