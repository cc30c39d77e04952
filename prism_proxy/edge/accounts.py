"""Who a request comes from, for what a client earns on its own (agent-session retention,
`admission.credit`).

Without API keys the proxy tells clients apart only by their peer address (aiohttp's
`request.remote`: behind a reverse proxy, the reverse proxy's). When keys arrive, this
is the one function to change.
"""

from __future__ import annotations

from aiohttp import web


def client_key(request: web.Request) -> str:
    """The account a request's client is counted under: its peer address ("" unknown)."""
    return request.remote or ""


def connection_key(peername: object) -> str:
    """The account a connection is counted under before any request could name one
    (`edge.connections`): its peer address, as `request.remote` gives it ("" for a
    Unix socket)."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return ""
