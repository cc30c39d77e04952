"""Errors at the edge, every one answered as OpenAI-style JSON.

`ApiError` is what the handlers raise; `error_middleware` answers it with one JSON body
and counts every request once (its endpoint, lane and status). Errors at the HTTP level
(parser errors, unknown routes and methods, timeouts, the connection cap, unsupported
versions and `Expect`) get the same form from the server (`http_exception_response`,
`raw_error`). Every message is the proxy's own text: nothing a client sent (request line,
path, header names or values) is echoed back; aiohttp's defaults are plain text that
quotes the offending input.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import http_exceptions, web

from prism_proxy.api.error_body import openai_error
from prism_proxy.backend.errors import BackendError
from prism_proxy.edge.gateway import GATEWAY

MESSAGES = {
    400: "malformed HTTP request",
    404: "no such endpoint",
    405: "method not allowed on this endpoint",
    408: "request not received in time",
    413: "request body too large",
    417: "unsupported Expect header: only 100-continue is served",
    431: "request header section too large",
    500: "internal error",
    503: "service unavailable",
    504: "handler timed out",
    505: "HTTP version not supported: use HTTP/1.1 or HTTP/1.0",
}
# Headers of an aiohttp HTTPException that carry no client input and are kept.
_KEPT_HEADERS = ("Allow", "Retry-After")


class RequestTimeout(web.HTTPRequestTimeout):
    """408 raised into a handler's body read when the body took too long (the
    connection closes after the answer)."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message


def error_kind(status: int) -> str:
    if status == 503:
        return "service_unavailable"
    if status >= 500 and status != 505:  # 505: the client's version is the one to change
        return "server_error"
    return "invalid_request_error"


def error_body(status: int, message: str | None = None, param: str | None = None) -> bytes:
    text = message or MESSAGES.get(status) or HTTPStatus(status).phrase.lower()
    return orjson.dumps(openai_error(text, kind=error_kind(status), param=param, code=status))


def error_response(
    status: int,
    message: str | None = None,
    *,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
    close: bool = False,
) -> web.Response:
    """A JSON error answer; `close` adds `Connection: close` (and closes after it)."""
    response = web.Response(
        body=error_body(status, message, param),
        status=status,
        headers=headers,
        content_type="application/json",
    )
    if close:
        response.force_close()
    return response


def raw_error(
    status: int, message: str | None = None, headers: Mapping[str, str] | None = None
) -> bytes:
    """A whole HTTP/1.1 error answer with `Connection: close`, for the protocol to write
    where no request object exists (header timeout, connection cap)."""
    body = error_body(status, message)
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


def http_exception_response(exc: web.HTTPException) -> web.Response:
    """The JSON answer to an aiohttp HTTPException (404, 405, 408, 413, …) raised by
    the router or a handler."""
    status = exc.status
    message = exc.message if isinstance(exc, RequestTimeout) else None
    allow = exc.headers.get("Allow")
    if status == 405 and allow:
        message = f"method not allowed on this endpoint; it accepts {allow}"
    headers = {name: exc.headers[name] for name in _KEPT_HEADERS if name in exc.headers}
    return error_response(status, message, headers=headers, close=status == 408)


# llhttp's reasons are fixed strings; an aiohttp parser message quotes the input after
# them (`"<reason>:\n\n  b'<input>'\n  ^"`).
_LLHTTP_SEPARATOR = ":\n\n"
_BAD_STATUS_PREFIX = "Bad status line:\n"
_AIOHTTP_REASONS = ("Missing 'Host' header in request.", "Duplicate '")


def parser_error(exc: BaseException, max_line_bytes: int) -> tuple[int, str]:
    """Status and message for a request the HTTP parser refused (no input echoed)."""
    if isinstance(exc, http_exceptions.LineTooLong):
        return 431, f"a request line or header field is longer than {max_line_bytes} bytes"
    if not isinstance(exc, http_exceptions.HttpProcessingError):
        return 400, MESSAGES[400]
    text = exc.message
    if text == "Too many headers received":
        return 431, "too many header fields"
    if isinstance(exc, http_exceptions.BadHttpMethod):
        if "HTTPS" in text:
            return 400, "TLS sent to a plain-HTTP port"
        return 400, "invalid request method"
    if isinstance(exc, http_exceptions.InvalidURLError):
        return 400, "invalid request target"
    if isinstance(exc, http_exceptions.InvalidHeader):
        return 400, "invalid header value"
    if text.startswith(_BAD_STATUS_PREFIX):
        text = text[len(_BAD_STATUS_PREFIX) :].strip()
    if _LLHTTP_SEPARATOR in text:
        reason = text.split(_LLHTTP_SEPARATOR, 1)[0]
        if reason == "Invalid HTTP version":
            return 505, MESSAGES[505]
        if reason.startswith("Pause on PRI"):
            return 505, "HTTP/2 is not served here: use HTTP/1.1"
        return 400, f"malformed HTTP request: {reason[:80]}"
    if isinstance(exc, http_exceptions.BadStatusLine):
        return 400, "invalid request line"
    if text.startswith(_AIOHTTP_REASONS) and len(text) <= 80:
        return 400, f"malformed HTTP request: {text}"
    return 400, MESSAGES[400]


ENDPOINT = web.RequestKey("endpoint", str)


LANE = web.RequestKey("lane", str)


STATUS = web.RequestKey("status", int)  # overrides the HTTP status for metrics


STARTED = web.RequestKey("started", float)


# The setting whose limit refused a request with 429 (`prism:account_requests`' `limit`).
REFUSED_BY = web.RequestKey("refused_by", str)


CLIENT_CLOSED = 499  # metrics status of requests whose client went away


async def handle_counted(
    request: web.Request, handler: Any, ended: Callable[[int], None]
) -> web.StreamResponse:
    """`handler(request)`, then `ended(status)` however it ends: the answer's status,
    an HTTP exception's, `CLIENT_CLOSED` when the client went away, 500 otherwise;
    `STATUS` on the request overrides it (for the middlewares that count answers)."""
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except asyncio.CancelledError:
        status = CLIENT_CLOSED
        raise
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        ended(request.get(STATUS, status))


class ApiError(Exception):
    """Answered as an OpenAI-style error body with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: Mapping[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code  # OpenAI's error code ("invalid_api_key"); None: the status
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.headers = dict(headers or {})


# The engine's words for a grammar it could not compile (SGLang 0.5.23 with xgrammar:
# "Failed to compile ebnf grammar: ...") and the field that carried it: the client's
# input, whatever status the engine gave it.
GRAMMAR_FAULT = re.compile(r"Failed to compile (ebnf|regex|json|structural_tag) grammar")
GRAMMAR_FIELDS = {
    "ebnf": "ebnf",
    "regex": "regex",
    "json": "response_format",
    "structural_tag": "response_format",
}


def input_fault(message: str) -> str | None:
    """The request field a backend's error message shows was at fault, else None."""
    found = GRAMMAR_FAULT.search(message)
    return GRAMMAR_FIELDS[found.group(1)] if found else None


def backend_failure(exc: BackendError) -> ApiError:
    """The answer to a failed backend exchange: its status (502/503, or the backend's own
    4xx: a request it refuses) and message; a failure the message shows was the
    client's input (`input_fault`) is a 400 naming the field."""
    param = input_fault(exc.message)
    if param is not None:
        return ApiError(400, exc.message, param=param)
    kind = "invalid_request_error" if 400 <= exc.status < 500 else "backend_error"
    return ApiError(exc.status, exc.message, kind=kind)


def json_answer(
    body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A JSON response encoded by orjson (aiohttp's `json_response` uses the slower
    stdlib encoder)."""
    return web.Response(
        body=orjson.dumps(body), status=status, headers=headers, content_type="application/json"
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Turn `ApiError` into one JSON response; count every request once."""
    request[STARTED] = time.monotonic()
    request[LANE] = "none"
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except ApiError as exc:
        status = exc.status
        return json_answer(
            openai_error(exc.message, kind=exc.kind, param=exc.param, code=exc.code or exc.status),
            status=exc.status,
            headers=exc.headers,
        )
    except web.HTTPException as exc:  # the router's 404/405, a body read's 408/413
        status = exc.status
        if status < 400:
            raise
        return http_exception_response(exc)
    except asyncio.CancelledError:
        status = CLIENT_CLOSED
        raise
    finally:
        endpoint = request.get(ENDPOINT)
        if endpoint is not None:
            metrics = request.app[GATEWAY].metrics
            lane = request[LANE]
            status = request.get(STATUS, status)
            metrics.child(metrics.requests, endpoint, lane, str(status)).inc()
            if lane != "none":
                elapsed = time.monotonic() - request[STARTED]
                metrics.child(metrics.e2e_latency, lane).observe(elapsed)
