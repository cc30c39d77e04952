"""The proxy's HTTP/1.x server: aiohttp's server with the proxy's connection
policy. One job: what a client connection may do, before and around the handlers.

* time limits (`clock`): headers, body, keep-alive idle, responses left unread;
* a cap on client connections: 503 and close above it, the open-file limit raised to fit
  (`edge.connection_policy`); a cap per client (peer address, `edge.connections`), and
  at the proxy's cap an idle connection of the client holding the most closed for a
  newcomer holding fewer;
* HTTP/1.0 and 1.1 only; `Expect: 100-continue` with a declared body over the limit gets
  413 at once (no "100 Continue"), other `Expect` values 417;
* every error at this level is OpenAI-style JSON (`errors`) and carries an
  `x-request-id` (the client's when its headers were read and it is safe, else a new
  one; `edge.tracing`), as the application's answers do.

How it attaches to aiohttp 3.14: `ProxyRunner` (`edge.runner`) is an `AppRunner` whose
server (its `_make_server`) is a `ProxyServer` (a `web.Server`). That builds one
`ProxyProtocol` (a `RequestHandler`) per connection and passes every request through
`ProxyServer.gate` before the application. The protocol overrides asyncio's `connection_made/lost`,
`data_received` and `pause/resume_writing`, and RequestHandler's `finish_response` and
`handle_error`. It reads RequestHandler's queue of parsed requests (`_messages`) to see
a head complete, and uses the loop it holds (`_loop`); aiohttp's own keep-alive timer
is disarmed (a timeout that never fires) and the clock replaces it. pyproject.toml pins
aiohttp to 3.14.x for these internals; tests/test_http_server.py fails if they change.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from typing import Any, cast

from aiohttp import hdrs, web, web_protocol
from aiohttp.http import HttpVersion10, HttpVersion11, RawRequestMessage
from aiohttp.streams import StreamReader

from prism_proxy.edge.accounts import connection_key
from prism_proxy.edge.clock import ConnectionClock, Expiry
from prism_proxy.edge.connection_policy import MAX_LINGERING, ConnectionPolicy
from prism_proxy.edge.connections import ClientConnections
from prism_proxy.edge.errors import RequestTimeout, error_response, parser_error
from prism_proxy.edge.raw_answers import RawAnswer, answer_request_id, answerable
from prism_proxy.edge.tracing import REQUEST_ID_HEADER

log = logging.getLogger(__name__)

BODY_GRACE_S = 1.0  # a handler's time to answer 408 once its body read failed
REJECT_LINGER_S = 1.0  # a refused connection reads (and drops) input this long, then closes
HEAD_SNIFF_BYTES = 8192  # bytes of a pending head kept to tell an HTTP/0.9 line


class ProxyProtocol(web_protocol.RequestHandler):
    """One client connection: aiohttp's HTTP/1.x protocol plus the connection clock."""

    __slots__ = (
        "_active",
        "_body",
        "_client",
        "_clock",
        "_close_after",
        "_conn",
        "_head",
        "_idle",
        "_proxy_server",
        "_rejected",
        "_timer",
    )

    def __init__(self, server: ProxyServer, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._proxy_server = server
        self._clock: ConnectionClock | None = None
        self._timer: asyncio.TimerHandle | None = None
        # The socket's transport until it is lost (aiohttp forgets its own on close).
        self._conn: asyncio.Transport | None = None
        self._body: StreamReader | None = None  # the body being received
        self._active: web.BaseRequest | None = None  # the request a handler runs for
        self._head = b""  # the start of a pending head (HTTP/0.9 detection)
        self._close_after = False  # close once the current response is written
        self._rejected = False
        self._client: str | None = None  # whom it is counted under, while it is counted
        self._idle = True  # no request under way (the per-client table's view)

    # --- asyncio's protocol interface -------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._proxy_server
        conn = cast(asyncio.Transport, transport)
        client = connection_key(conn.get_extra_info("peername"))
        if not server.clients.admits(client):
            self._reject(conn, "client")
            return
        if server.open_connections >= server.policy.max_connections and not server.reclaim(client):
            self._reject(conn, "proxy")
            return
        server.open_connections += 1
        server.clients.opened(client, self)
        self._client = client
        self._conn = conn
        super().connection_made(transport)
        self._clock = ConnectionClock(server.policy.limits, self._loop.time())
        self._rearm()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._rejected:
            if self._conn is not None:
                self._proxy_server.lingering -= 1
                self._conn = None
            return
        self.uncount()
        self._conn = None
        self._clock = None
        self._body = self._active = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        clock = self._clock
        if clock is None:
            if not self._rejected:
                super().data_received(data)
            return  # a refused connection's input is dropped
        now = self._loop.time()
        if data and self._body is None:
            clock.head_bytes(now)
            if self._idle:
                self._idle = False
                if self._client is not None:
                    self._proxy_server.clients.busy(self._client, self)
            head = self._head
            if not head:
                self._head = data  # usually the whole head: kept without a copy
            elif b"\n" not in head and len(head) < HEAD_SNIFF_BYTES:
                self._head = head + data[:HEAD_SNIFF_BYTES]  # a request line in pieces
        queue = self._messages
        before = len(queue)
        super().data_received(data)
        if len(queue) > before:
            for message, payload in itertools.islice(queue, before, None):
                self._head_received(message, payload, now)
        self._rearm()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._clock is not None:
            self._clock.writing_paused(self._loop.time())
            self._rearm()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._clock is not None:
            self._clock.writing_resumed()

    # --- RequestHandler's hooks ---------------------------------------------------------
    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            if self._close_after:
                self._close_now()
            elif self._clock is not None and not self._messages:
                self._clock.response_ended(self._loop.time())
                self._rearm()
                self._idle = True
                if self._client is not None:
                    self._proxy_server.clients.idle(self._client, self)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """JSON instead of aiohttp's text (which quotes the input); parser errors are
        logged at debug level only (any client can send them)."""
        if status >= 500:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
        else:
            self.logger.debug("refused a malformed request from %s: %r", request.remote, exc)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent; cannot send the error")
        text = None
        if status == 400 and exc is not None:
            status, text = parser_error(exc, self.max_line_size)
        return error_response(
            status, text, headers={REQUEST_ID_HEADER: answer_request_id(request)}, close=True
        )

    # --- the gate's calls ---------------------------------------------------------------
    def begin(self, request: web.BaseRequest) -> None:
        self._active = request

    def end(self) -> None:
        self._active = None

    def close_after_response(self) -> None:
        self._close_after = True

    # --- the server's calls -------------------------------------------------------------
    def uncount(self) -> None:
        """Give up this connection's slot (at once when reclaimed; else when lost)."""
        if self._client is not None:
            server = self._proxy_server
            server.open_connections -= 1
            server.clients.closed(self._client, self)
            self._client = None

    def reclaim(self) -> None:
        """Close this idle connection for another client's (its slot is free now)."""
        log.debug("closing an idle connection of a client holding many for another client")
        self.uncount()
        self._close_now()

    # --- internals ----------------------------------------------------------------------
    def _reject(self, conn: asyncio.Transport, cap: str) -> None:
        """Over the proxy's cap or the client's (`cap`): 503 without reading a request,
        and close. The answer is followed by a FIN; what the client sent meanwhile is
        read and dropped for `REJECT_LINGER_S`, so that the close does not reset the
        connection before the client has read the 503."""
        self._rejected = True
        server = self._proxy_server
        server.note_refusal(cap)
        conn.write(server.over_cap_answer.render())
        if server.lingering >= MAX_LINGERING or not conn.can_write_eof():
            conn.close()
            return
        conn.write_eof()
        server.lingering += 1
        self._conn = conn
        self._timer = self._loop.call_later(REJECT_LINGER_S, conn.close)

    def _head_received(self, message: Any, payload: StreamReader, now: float) -> None:
        assert self._clock is not None
        self._head = b""
        if isinstance(message, RawRequestMessage):
            if message.version < HttpVersion10:
                self.force_close()  # HTTP/0.9: its client could not read an HTTP/1.x answer
                return
            if message.upgrade:
                # Upgrade or CONNECT: the proxy switches to no other protocol. Close after
                # the answer: aiohttp would parse what follows inside `finish_response`,
                # out of this clock's sight.
                self._close_after = True
        has_body = not payload.is_eof()
        self._clock.head_received(now, has_body=has_body)
        if has_body:
            self._body = payload
            payload.on_eof(self._body_received)

    def _body_received(self) -> None:
        self._body = None
        if self._clock is not None:
            self._clock.body_received()

    def _rearm(self) -> None:
        """Keep one timer at the clock's next deadline. A timer armed earlier stays:
        when it fires it finds nothing due and re-arms (one handle per request, not
        one per event)."""
        at = self._clock.next_deadline() if self._clock is not None else None
        if at is None:
            return
        timer = self._timer
        if timer is not None:
            if timer.when() <= at:
                return
            timer.cancel()
        self._timer = self._loop.call_at(at, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        clock, conn = self._clock, self._conn
        if clock is None or conn is None:
            return
        expiry = clock.due(self._loop.time())
        if expiry is None:
            self._rearm()
            return
        log.debug("closing a client connection: %s time limit", expiry)
        if expiry is Expiry.SEND:
            conn.abort()  # a close would wait for the reader that does not read
            return
        if expiry is Expiry.BODY and self._fail_body_read():
            self._rearm()
            return
        if (
            expiry is Expiry.HEADERS
            and self.transport is not None
            and not self.writing_paused
            and answerable(self._head)
        ):
            conn.write(self._proxy_server.header_timeout_answer.render())
        self._close_now()

    def _fail_body_read(self) -> bool:
        """The body limit ran out while a handler waits for the body: its read fails
        with 408 (answered as JSON by the error middleware; the connection closes after
        it). False when no handler can still answer: then the connection just closes."""
        body, request, clock = self._body, self._active, self._clock
        if (
            body is None
            or request is None
            or clock is None
            or request.content is not body
            or request.writer.output_size > 0
            or self._close_after
        ):
            return False
        self._close_after = True
        limit_s = clock.limits.body_s
        body.set_exception(RequestTimeout(f"request body not received within {limit_s:g} s"))
        clock.body_grace(self._loop.time(), BODY_GRACE_S)
        return True

    def _close_now(self) -> None:
        if self.writing_paused and self._conn is not None:
            self._conn.abort()
        self.force_close()


class ProxyServer(web.Server):
    """aiohttp's low-level server with the proxy's protocol and request gate."""

    def __init__(
        self,
        handler: Any,
        *,
        policy: ConnectionPolicy,
        request_factory: Any,
        loop: asyncio.AbstractEventLoop,
        **protocol_kwargs: Any,
    ) -> None:
        super().__init__(
            self.gate,
            request_factory=request_factory,
            handler_cancellation=True,
            loop=loop,
            **protocol_kwargs,
        )
        self.policy = policy
        self._app_handler = handler
        self._protocol_loop = loop
        self._protocol_kwargs = protocol_kwargs
        self.open_connections = 0
        self.clients = ClientConnections[ProxyProtocol](policy.max_client_connections)
        self.lingering = 0
        self._refusal_logged_at = {"proxy": -math.inf, "client": -math.inf}
        retry_after = {"Retry-After": str(policy.retry_after_s)}
        self.over_cap_answer = RawAnswer(503, "too many connections; retry later", retry_after)
        self.version_answer = RawAnswer(505)
        self.header_timeout_answer = RawAnswer(
            408, f"request headers not received within {policy.limits.header_s:g} s"
        )

    def __call__(self) -> ProxyProtocol:
        return ProxyProtocol(self, loop=self._protocol_loop, **self._protocol_kwargs)

    def note_refusal(self, cap: str) -> None:
        """Log a refusal over `cap` ("proxy" or "client"), at most every 10 s each."""
        now = self._protocol_loop.time()
        if now - self._refusal_logged_at[cap] < 10.0:
            return
        self._refusal_logged_at[cap] = now
        if cap == "client":
            log.warning(
                "a client holds %d connections (max_client_connections): refusing its new "
                "ones with 503",
                self.policy.max_client_connections,
            )
        else:
            log.warning(
                "%d client connections open (the cap): refusing new ones with 503",
                self.policy.max_connections,
            )

    def reclaim(self, client: str) -> bool:
        """At the cap: close an idle connection of the client holding the most, for
        `client` (`ClientConnections.reclaimable`); False when none may go."""
        victim = self.clients.reclaimable(client)
        if victim is None:
            return False
        victim.reclaim()
        return True

    async def gate(self, request: web.BaseRequest) -> web.StreamResponse:
        """Every request passes here before the application: refusals at the HTTP
        level, and the protocol learns which request a handler runs for."""
        protocol = cast(ProxyProtocol, request.protocol)
        refusal = self._refusal(request)
        if refusal is not None:
            protocol.close_after_response()
            refusal.headers[REQUEST_ID_HEADER] = answer_request_id(request)
            return refusal
        protocol.begin(request)
        try:
            return await self._app_handler(request)
        finally:
            protocol.end()

    def _refusal(self, request: web.BaseRequest) -> web.StreamResponse | None:
        version = request.version
        if version == HttpVersion11:
            expect = request.headers.get(hdrs.EXPECT)
            if not expect:
                return None
            if expect.lower() != "100-continue":
                return error_response(417, close=True)
            length = request.content_length
            limit = self.policy.max_body_bytes
            if length is not None and length > limit:
                # Before routing, so before aiohttp's "100 Continue": the client never
                # sends the body.
                message = f"request body exceeds {limit} bytes"
                return error_response(413, message, param="body", close=True)
            return None
        if version == HttpVersion10:
            return None
        # Another version: 505 in HTTP/1.1 (aiohttp would answer in the request's
        # version); HTTP/0.9 gets nothing, its client could not read an HTTP/1.x answer.
        protocol = request.protocol
        if version > HttpVersion11 and protocol.transport is not None:
            protocol.transport.write(self.version_answer.render(answer_request_id(request)))
        protocol.force_close()
        return web.Response()  # never written: the connection is closed
