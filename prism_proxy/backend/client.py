"""HTTP client of the backend (SGLang or the simulated engine), SPEC §4.

The token path's `/generate` calls go through the lean HTTP/1.1 pool of `backend.http1`
(`Http1Pool`); the rarer calls (passthrough, aborts, info and health) through one
`aiohttp.ClientSession` per app. Every call is tried exactly once (no retries, so
a failing backend never sees a retry storm); failures become `BackendError` with the
status the proxy answers: 502 when the backend is unreachable or answers 5xx, 503 when
it answers 503 or times out, the backend's own status for its 4xx answers but 401 and
403 (the proxy's own credentials refused: 502). Every call carries the engine's API key
(`api_key`, SGLang's `--api-key`) when one is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson

from prism_proxy.backend.errors import BackendAnswerError, BackendError, error_message, error_of
from prism_proxy.backend.http1 import Http1Pool, Http1Response
from prism_proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

READ_BUFSIZE = 4 * 1024 * 1024  # long cumulative stream chunks must fit in one line
JSON_HEADERS = {"Content-Type": "application/json"}


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
        message = error_of(chunk) or json.dumps(chunk)[:500]
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
        message = self.scrub(error_message(status, text))
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
