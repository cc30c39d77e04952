"""HTTP client of the backend (SGLang or the simulated engine), SPEC §4.

The token path's `/generate` calls go through the lean HTTP/1.1 pool below
(`Http1Pool`); the rarer calls (passthrough, aborts, info and health) through one
`aiohttp.ClientSession` per app. Every call is tried exactly once (no retries, so
a failing backend never sees a retry storm); failures become `BackendError` with the
status the proxy answers: 502 when the backend is unreachable or answers 5xx, 503 when
it answers 503 or times out, the backend's own status for its 4xx answers but 401 and
403 (the proxy's own credentials refused: 502). Every call carries the engine's API key
(`api_key`, SGLang's `--api-key`) when one is set.

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
import contextlib
import json
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httptools
import orjson

from prism_proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

READ_BUFSIZE = 4 * 1024 * 1024  # long cumulative stream chunks must fit in one line
JSON_HEADERS = {"Content-Type": "application/json"}


class BackendError(Exception):
    """The backend could not serve a request; `status` is what the client gets."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BackendAnswerError(BackendError):
    """The backend answered 2xx, but not with the JSON asked for."""


def _error_of(body: Any) -> str | None:
    """The message of an error object (`error` as text or `{message}`, or `message`, or
    `detail`, as SGLang and FastAPI spell them); None if it has none."""
    if not isinstance(body, dict):
        return None
    error = body.get("error", body.get("message", body.get("detail")))
    if isinstance(error, dict):
        error = error.get("message", error)
    return None if error is None else str(error)[:500]


def _error_message(status: int, text: str) -> str:
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text.strip()[:500] or f"HTTP {status}"
    message = _error_of(body)
    return message if message is not None else text.strip()[:500]


def _encoded(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
    except (orjson.JSONEncodeError, TypeError) as exc:  # e.g. nested beyond 254 levels
        raise BackendError(400, f"body: cannot be forwarded: {exc}") from None


def _private_names(base_url: str, server_info: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """(string, its replacement) for what names the backend: its URL and host:port, and
    the model path, tokenizer path and served model name its server info reports;
    longest first, so a path is replaced before a name inside it."""
    names = {base_url: "the backend", base_url.split("://", 1)[-1]: "the backend"}
    for key in ("model_path", "tokenizer_path", "served_model_name"):
        value = server_info.get(key)
        if isinstance(value, str) and len(value) >= 3:
            names.setdefault(value, "the model")
    return tuple(sorted(names.items(), key=lambda item: len(item[0]), reverse=True))


def parse_sse_line(line: bytes) -> dict[str, Any] | None:
    """The JSON object of one `data: {...}` line; None for other lines and `[DONE]`."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if not data or data == b"[DONE]":
        return None
    return orjson.loads(data)


def _backend_chunk(line: bytes) -> dict[str, Any] | None:
    """One line of a `/generate` stream: its chunk, None for others; a malformed chunk
    raises BackendError(502), an error chunk BackendError with its own 4xx code (SGLang
    refuses a request it cannot serve, e.g. beyond the context, this way: 400) or 502."""
    try:
        chunk = parse_sse_line(line)
    except ValueError as exc:
        raise BackendError(502, f"backend sent an invalid chunk: {exc}") from exc
    if chunk is not None and "error" in chunk:
        message = _error_of(chunk) or json.dumps(chunk)[:500]
        error = chunk["error"]
        code = error.get("code") if isinstance(error, dict) else None
        if isinstance(code, int) and 400 <= code < 500:
            raise BackendError(code, message)
        raise BackendError(502, f"backend error: {message}")
    return chunk


class BackendClient:
    """Calls `/generate`, the OpenAI endpoints, `/abort_request` and info endpoints."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        metrics: ProxyMetrics,
        timeout_s: float,
        connect_timeout_s: float,
        api_key: str | None = None,
    ) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        # The engine's own key (SGLang's `--api-key`), on every call below and nothing
        # else: a client's headers are never forwarded, so its Authorization stays here.
        self.auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.json_headers = {**JSON_HEADERS, **self.auth}
        self.credentials_refused = False  # the backend answered 401/403 (logged once)
        self.metrics = metrics
        # An inactivity limit, not a total: long streams may run as long as they flow.
        self.timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=timeout_s
        )
        self.pool = Http1Pool(
            self.base_url,
            connect_timeout_s=connect_timeout_s,
            read_timeout_s=timeout_s,
            api_key=api_key,
        )
        self._background: set[asyncio.Task[None]] = set()
        self.aborts_sent = 0
        self.up: bool | None = None  # unknown until the first exchange
        # Times the backend was seen going down: after one, it may come back another
        # engine (the proxy checks its tokenizer again, `backend.tokenizer_guard`).
        self.downs = 0
        # What a client must never read in an error: where the backend lives and what it
        # serves from where (its model path); more is learned from its server info.
        self._private = _private_names(self.base_url, {})

    def scrub(self, message: str) -> str:
        """`message` without the backend's address, model path or served model name."""
        for name, replacement in self._private:
            if name in message:
                message = message.replace(name, replacement)
        return message

    @staticmethod
    def create_session() -> aiohttp.ClientSession:
        """No connection limit of its own: admission's backstop bounds the requests."""
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        return aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE)

    # --- helpers -------------------------------------------------------------------
    def _up(self, up: bool) -> None:
        if not up and self.up is not False:
            self.downs += 1
        if up != self.up:
            log.log(
                logging.INFO if up else logging.WARNING,
                "backend %s is %s",
                self.base_url,
                "up" if up else "down (requests get 502/503 until it answers)",
            )
        self.up = up
        self.metrics.backend_up.set(1 if up else 0)

    def _unreachable(self, exc: BaseException) -> BackendError:
        """The client learns that the backend failed, never where it lives (the log
        says)."""
        self._up(False)
        log.debug("backend %s: %r", self.base_url, exc)
        if isinstance(exc, TimeoutError):
            return BackendError(503, "backend timed out")
        return BackendError(502, "backend unreachable")

    def _answered(self, status: int, text: str) -> None:
        """The backend answered `status`: raise its BackendError (body `text`) if >= 400."""
        if status < 400:
            self._up(True)
            return
        if status in (401, 403):
            # The engine wants a key the proxy lacks: the deployment's fault, never the
            # client's (whose own key the engine never sees), so not the client's 401.
            self._up(True)
            if not self.credentials_refused:  # once: every request would say it again
                log.warning(
                    "backend %s answered HTTP %d: it wants an API key the proxy lacks or has "
                    "wrong (PRISM_ENGINE_API_KEY, PRISM_ENGINE_API_KEY_FILE)",
                    self.base_url,
                    status,
                )
            self.credentials_refused = True
            raise BackendError(502, f"backend refused the proxy's credentials (HTTP {status})")
        message = self.scrub(_error_message(status, text))
        if status >= 500:
            # One request's 5xx leaves the up state alone: a client can provoke one with
            # its own input, and must not mark the engine down (readiness, the tokenizer
            # check) for everyone. The readiness probe finds a failing engine in a second.
            raise BackendError(
                503 if status == 503 else 502, f"backend answered HTTP {status}: {message}"
            )
        self._up(True)
        raise BackendError(status, message)

    async def _check(self, response: aiohttp.ClientResponse) -> None:
        text = "" if response.status < 400 else await response.text(errors="replace")
        self._answered(response.status, text)

    async def _check_lean(self, response: Http1Response) -> None:
        body = b"" if response.status < 400 else await response.read()
        self._answered(response.status, body.decode("utf-8", errors="replace"))

    @contextlib.asynccontextmanager
    async def _post(
        self, path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        data = _encoded(body)
        sent = {**self.json_headers, **headers} if headers else self.json_headers
        try:
            async with self.session.post(
                self.base_url + path, data=data, headers=sent, timeout=self.timeout
            ) as response:
                await self._check(response)
                yield response
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc

    # --- the token path --------------------------------------------------------------
    async def generate_batches(
        self, body: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Streaming `/generate`: yields the chunk objects that arrived together, as one
        list per read of the socket (never empty). `headers`: the request's tracing
        headers (`edge.tracing.engine_headers`), already checked.

        Reading whatever the socket holds and splitting it here costs one await per
        read instead of one per line; under load one read carries several chunks of a
        stream, which the relay then writes to the client at once. A `{"error": ...}`
        chunk raises BackendError(502), after the chunks that preceded it.
        """
        payload = _encoded({**body, "stream": True})
        try:
            async with self.pool.post("/generate", payload, headers) as response:
                await self._check_lean(response)
                rest = b""
                async for data in response.iter_any():
                    lines = (rest + data).split(b"\n") if rest else data.split(b"\n")
                    rest = lines.pop()
                    batch = []
                    for line in lines:
                        try:
                            chunk = _backend_chunk(line)
                        except BackendError as exc:
                            if batch:  # what came before the failure is relayed first
                                yield batch
                            exc.message = self.scrub(exc.message)
                            raise
                        if chunk is not None:
                            batch.append(chunk)
                    if batch:
                        yield batch
                try:
                    last = _backend_chunk(rest)
                except BackendError as exc:
                    exc.message = self.scrub(exc.message)
                    raise
                if last is not None:
                    yield [last]
        except OSError as exc:  # refused, reset, closed mid-answer, invalid HTTP, timeout
            raise self._unreachable(exc) from exc

    async def prefill(self, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> int:
        """Non-streamed `/generate` of a prompt piece (`admission.pieces`): the engine
        prefills and caches it. Returns the tokens it found cached (`cached_tokens`)."""
        payload = _encoded({**body, "stream": False})
        try:
            async with self.pool.post("/generate", payload, headers) as response:
                await self._check_lean(response)
                answer = orjson.loads(await response.read())
        except OSError as exc:
            raise self._unreachable(exc) from exc
        except ValueError as exc:
            raise BackendError(502, "backend answered a prompt piece with invalid JSON") from exc
        meta = answer.get("meta_info") if isinstance(answer, dict) else None
        cached = meta.get("cached_tokens") if isinstance(meta, dict) else None
        return cached if isinstance(cached, int) else 0

    # --- passthrough -----------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def forward(
        self, path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST `body` unchanged to `path` (with the request's tracing `headers`);
        yields the open response (status < 400)."""
        async with self._post(path, body, headers) as response:
            yield response

    async def get_ok(self, path: str) -> None:
        """GET `path` and only check the status (`/health_generate`)."""
        try:
            async with self.session.get(
                self.base_url + path, headers=self.auth, timeout=self.timeout
            ) as response:
                await self._check(response)
                await response.read()
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc

    async def get_json(self, path: str, timeout_s: float | None = None) -> Any:
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else self.timeout
        try:
            async with self.session.get(
                self.base_url + path, headers=self.auth, timeout=timeout
            ) as response:
                await self._check(response)
                return await response.json(content_type=None)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc
        except ValueError as exc:
            raise BackendError(502, f"backend sent invalid JSON on {path}: {exc}") from exc

    async def post_json(self, path: str, body: dict[str, Any], timeout_s: float) -> Any:
        """POST `body` to `path` and return the JSON answer (a small call, `timeout_s`
        in all); BackendError for a failure, with the backend's own 4xx status."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.session.post(
                self.base_url + path,
                data=_encoded(body),
                headers=self.json_headers,
                timeout=timeout,
            ) as response:
                await self._check(response)
                return await response.json(content_type=None)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc
        except ValueError as exc:
            raise BackendAnswerError(502, f"backend sent invalid JSON on {path}: {exc}") from exc

    # --- abort and health ---------------------------------------------------------------
    def abort(self, rid: str) -> None:
        """Send `POST /abort_request {"rid"}` now, in a task of its own.

        A task, not an await: it must survive the cancellation of the handler that
        asks for it (a client disconnect cancels the handler).
        """
        task = asyncio.get_running_loop().create_task(self._abort(rid))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort(self, rid: str) -> None:
        try:
            async with self.session.post(
                self.base_url + "/abort_request",
                json={"rid": rid},
                headers=self.auth,
                timeout=aiohttp.ClientTimeout(total=5.0),
            ) as response:
                await response.read()
                self.aborts_sent += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("abort of %s failed: %s", rid, exc)

    async def get_info(self, name: str, timeout_s: float | None = None) -> Any:
        """SGLang's `/{name}` (`server_info`, `model_info`), or its old name `/get_{name}`
        when the backend has only that: sgl-model-gateway 1.13 in front of engines
        serves only the old names. (SGLang logs a deprecation warning for every call of
        an old name, so it is the second try.)"""
        try:
            return await self.get_json(f"/{name}", timeout_s=timeout_s)
        except BackendError as exc:
            if exc.status != 404:
                raise
        return await self.get_json(f"/get_{name}", timeout_s=timeout_s)

    async def probe(self) -> dict[str, Any] | None:
        """One health probe: the backend's server info (SGLang's batch limits), or None
        when it does not answer; updates `backend_up`."""
        try:
            info = await self.get_info("server_info", timeout_s=5.0)
        except BackendError as exc:
            if exc.status >= 500:
                self._up(False)  # a probe's failure, unlike one request's, is the engine's
            return None
        info = info if isinstance(info, dict) else {}
        self._private = _private_names(self.base_url, info)
        return info

    async def ready(self, timeout_s: float) -> bool | None:
        """The cheap readiness probe: the engine's `GET /ready` (SGLang answers it from
        its tokenizer manager's state, without the scheduler or a generation). True 200,
        False for any other answer or none (the backend is then marked down at once);
        None when the backend has no `/ready` (404, a gateway): ask `probe` instead."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.session.get(self.base_url + "/ready", timeout=timeout) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._unreachable(exc)
            return False
        if status == 404:
            return None
        self._up(status == 200)
        return status == 200

    async def drain(self) -> None:
        """Wait for the abort tasks still running, then close the pool (shutdown)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        self.pool.close()


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
