"""The token path's lean HTTP/1.1 client: a pool of kept-alive connections to the
backend (`Http1Pool`), used by `backend.client.BackendClient` for `/generate`.

Why a pool of its own: aiohttp's client cost about 0.04 ms of CPU and 0.08 ms of
latency per proxied request on this machine, a third of what a Rust gateway spends on a
whole request (docs/performance.md, "The transport floor"). The token path needs little
of what it offers: POST a JSON body on a kept-alive connection, read the status and headers, and
take the body as the socket delivers it. `Http1Pool` does just that on an
`asyncio.Protocol`, with httptools (llhttp, the parser uvicorn uses) reading answers.

* Connections are kept alive and reused most recent first. An idle one is dropped after
  `idle_s` (under uvicorn's 5 s keep-alive, so SGLang does not close one as it is reused)
  or as soon as the server closes it.
* A POST is never retried: a request the backend may have seen must not run twice.
* A body the reader does not keep up with pauses the socket (`HIGH_WATER` bytes), so a
  slow client holds back its own stream and nothing else.
* Timeouts: `connect_timeout_s` to connect, `read_timeout_s` of silence while an answer
  is awaited (an inactivity limit: long streams run as long as they flow).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 1 << 20  # body bytes buffered before the socket is paused
IDLE_S = 4.0


class BackendProtocolError(ConnectionError):
    """The backend broke the exchange: it closed early or sent invalid HTTP."""


class Http1Connection(asyncio.Protocol):
    """One kept-alive connection: at most one exchange at a time."""

    def __init__(self, pool: Http1Pool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # until made
        self.closed = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self.begin()  # the per-exchange state, empty ...
        self._expecting = False  # ... and no request written yet

    # --- one exchange ---------------------------------------------------------------
    def begin(self) -> None:
        """Ready for the answer to a request about to be written."""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.headers_complete = False
        self.complete = False
        self.keep_alive = False
        self._body: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._error: BaseException | None = None
        self._expecting = True

    def take(self) -> bytes:
        """The body bytes received since the last call (b"" if none)."""
        if not self._body:
            return b""
        data = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def wait(self, timeout_s: float) -> None:
        """Until the next event of the exchange (headers, body bytes, its end); raises
        the exchange's failure, or TimeoutError after `timeout_s` of silence."""
        if self._error is not None:
            raise self._error
        loop = self._pool.loop
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        if self._error is not None and not self._body:
            raise self._error

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and not self._paused

    def close(self) -> None:
        self.closed = True
        self._pool.forget(self)
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    # --- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self._expecting:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BackendProtocolError(f"backend sent invalid HTTP: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._expecting and not self.complete:
            if self.headers_complete and _close_delimited(self.headers):
                self.complete = True  # the body ran to the end of the connection
                self._expecting = False
                self._wake()
            else:
                self._fail(BackendProtocolError("backend closed the connection mid-answer"))
        self._pool.forget(self)

    # --- httptools callbacks ---------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_complete = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._expecting = False
        self._wake()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _close_delimited(headers: dict[str, str]) -> bool:
    return "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "")


class Http1Response:
    """An answer whose headers arrived; its body is read as it comes."""

    def __init__(self, connection: Http1Connection, read_timeout_s: float) -> None:
        self._connection = connection
        self._timeout_s = read_timeout_s
        self.status = connection.status
        self.headers = connection.headers

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip()

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body as the socket delivers it: whatever arrived since the last step."""
        connection = self._connection
        while True:
            data = connection.take()
            if data:
                yield data
            elif connection.complete:
                return
            else:
                await connection.wait(self._timeout_s)

    async def read(self) -> bytes:
        return b"".join([data async for data in self.iter_any()])


class Exchange:
    """One request and its answer on a pooled connection (a class, not a generator
    context manager: it is entered once per token-path request)."""

    __slots__ = ("_body", "_connection", "_extra", "_path", "_pool")

    def __init__(self, pool: Http1Pool, path: str, body: bytes, extra: bytes = b"") -> None:
        self._pool = pool
        self._path = path
        self._body = body
        self._extra = extra
        self._connection: Http1Connection | None = None

    async def __aenter__(self) -> Http1Response:
        pool = self._pool
        connection = self._connection = await pool.acquire()
        connection.begin()
        head = pool.request_head(self._path, len(self._body), self._extra)
        connection.transport.write(head + self._body)
        try:
            while not connection.headers_complete:
                await connection.wait(pool.read_timeout_s)
        except BaseException:  # no `__aexit__` follows a failed `__aenter__`
            pool.release(connection)
            raise
        return Http1Response(connection, pool.read_timeout_s)

    async def __aexit__(self, *exc_info: object) -> None:
        if self._connection is not None:
            self._pool.release(self._connection)


class Http1Pool:
    """Kept-alive connections to one backend (`http://` or `https://` base URL)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        idle_s: float = IDLE_S,
        api_key: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"backend URL {base_url!r}: expected http(s)://host[:port]")
        https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if https else 80)
        self.ssl = ssl.create_default_context() if https else None
        self._prefix = parts.path.rstrip("/").encode()
        self._host_header = parts.netloc.encode("idna")
        # Every request's fixed headers after Host, the engine's key among them.
        auth = f"Authorization: Bearer {api_key}\r\n".encode() if api_key else b""
        self._fixed_headers = b"Content-Type: application/json\r\n" + auth
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.idle_s = idle_s
        self._idle: list[Http1Connection] = []
        self._open: set[Http1Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def post(self, path: str, body: bytes, headers: Mapping[str, str] | None = None) -> Exchange:
        """POST a JSON `body`: `async with pool.post(path, body) as response`, entered
        once the answer's headers are in. The connection goes back to the pool only when
        the answer was read to its end. `headers`: extra header fields, whose names and
        values the caller checked (visible ASCII: no line breaks)."""
        extra = (
            b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items())
            if headers
            else b""
        )
        return Exchange(self, path, body, extra)

    def request_head(self, path: str, length: int, extra: bytes = b"") -> bytes:
        return b"POST %s%s HTTP/1.1\r\nHost: %s\r\n%s%sContent-Length: %d\r\n\r\n" % (
            self._prefix,
            path.encode(),
            self._host_header,
            self._fixed_headers,
            extra,
            length,
        )

    async def acquire(self) -> Http1Connection:
        """An idle kept-alive connection, else a new one."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < self.idle_s:
                return connection
            connection.close()
        async with asyncio.timeout(self.connect_timeout_s):
            transport, connection = await self.loop.create_connection(
                lambda: Http1Connection(self), self.host, self.port, ssl=self.ssl
            )
        connection.transport = transport  # uvloop may call connection_made only later
        self._open.add(connection)
        return connection

    def release(self, connection: Http1Connection) -> None:
        """Back to the pool if its answer was read whole and it may be kept, else closed."""
        if connection.reusable():
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()

    def forget(self, connection: Http1Connection) -> None:
        """A connection closed (by either side)."""
        self._open.discard(connection)

    def close(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._idle.clear()
