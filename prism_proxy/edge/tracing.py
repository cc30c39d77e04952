"""Following one request: its id, its access-log line, its OpenTelemetry trace.

* **Request id**: a client's `x-request-id` when it is safe (at most
  `MAX_REQUEST_ID_CHARS` of `[A-Za-z0-9._:/+=@-]`), else a new one (32 hex digits, as
  `uuid4().hex`). It is echoed on every response of the application (errors and streams
  too) and on the HTTP server's own answers (`edge.server`), set on the log records
  made while the request runs (`record.request_id`), and sent to the engine as
  `x-request-id`. The engine's `rid` stays the proxy's own
  (`admit.new_rid`): SGLang needs it unique, and a client's could abort others'.
* **Trace context**: a valid W3C `traceparent` (and its `tracestate`) goes on to the
  engine (SGLang started with `--enable-trace` reads both from its request headers);
  with OpenTelemetry on, the proxy's own request span goes instead, a child of the
  client's, so the engine's spans hang below the proxy's.
* **Access log** (`access_log`: off, text, json): one line per request at its end, on
  the `prism_proxy.access` logger.
* **Spans** (`tracing`: auto, when `opentelemetry-api` is importable; the `otel`
  extra): one `prism.request` span per request, continuing an incoming `traceparent`,
  with events `queued`, `released` and `first_token` and a child span
  `prism.admission_wait` from queued to released. Spans go to the global tracer
  provider the operator configured before the proxy started (`opentelemetry-instrument`,
  or an SDK provider); none when none is.

The hooks are called from few places: `tracing_middleware` (arrival and end),
`admit.Admitted` (queued, released, first token, token counts), the token path and
passthrough (the engine's headers). Nothing here blocks or raises into a request.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from prism_proxy.edge.accounts import client_key
from prism_proxy.edge.errors import LANE, handle_counted

REQUEST_ID_HEADER = "x-request-id"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
MAX_REQUEST_ID_CHARS = 128
MAX_TRACESTATE_CHARS = 512  # W3C: 32 list members; vendors keep it far shorter
_SAFE_ID = re.compile(rf"[A-Za-z0-9._:/+=@-]{{1,{MAX_REQUEST_ID_CHARS}}}")
# W3C trace context level 1: version-traceid-parentid-flags, lowercase hex; version ff
# and all-zero ids are invalid.
_TRACEPARENT = re.compile(
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
)
_TRACESTATE = re.compile(rf"[\x20-\x7e]{{1,{MAX_TRACESTATE_CHARS}}}")

access_log = logging.getLogger("prism_proxy.access")

# The id of the request whose handler runs (log records read it: `install_log_context`).
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("prism_request_id", default="-")


def new_request_id() -> str:
    """32 hex digits, as `uuid4().hex` (os.urandom costs a quarter as much)."""
    return os.urandom(16).hex()


def request_id_of(value: str | None) -> str:
    """The client's request id when safe to log and forward, else a new one."""
    if value is not None and _SAFE_ID.fullmatch(value):
        return value
    return new_request_id()


def trace_context_of(traceparent: str | None, tracestate: str | None) -> dict[str, str]:
    """The W3C trace headers worth forwarding: a valid `traceparent`, and its
    `tracestate` when printable and bounded (a tracestate alone means nothing)."""
    if traceparent is None or not _TRACEPARENT.fullmatch(traceparent.strip()):
        return {}
    headers = {TRACEPARENT: traceparent.strip()}
    if tracestate is not None and _TRACESTATE.fullmatch(tracestate.strip()):
        headers[TRACESTATE] = tracestate.strip()
    return headers


def install_log_context() -> None:
    """Give every log record a `request_id` (the running request's, or "-") once per
    process, so a log format or a JSON formatter can name the request."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "prism_request_id", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.request_id = REQUEST_ID.get()
        return record

    factory.prism_request_id = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def configure_access_log(mode: str) -> None:
    """For `prism-proxy serve`: JSON access lines alone on stderr (no log prefix), so a
    collector can parse each line; text lines go through the usual log format."""
    if mode != "json":
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_log.addHandler(handler)
    access_log.propagate = False


@dataclass(slots=True)
class RequestTrace:
    """What is known of one request as it goes (monotonic seconds; None: not yet)."""

    request_id: str
    arrival: float
    arrival_wall: float
    incoming: dict[str, str]  # the client's trace headers, checked
    queued_at: float | None = None
    released_at: float | None = None
    first_token_at: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    span: Any = None  # the OpenTelemetry request span, when tracing
    wait_span: Any = None  # its admission-wait child, while queued
    engine: dict[str, str] | None = field(default=None)  # headers for the engine, once built


TRACE = web.RequestKey("trace", RequestTrace)


def _otel() -> tuple[Any, Any] | None:
    """OpenTelemetry's tracer and W3C propagator, or None when the API is not installed
    or no tracer provider is configured when the proxy starts (its no-op spans would
    cost ~10 µs a request for nothing: `python -m bench.tracing_cost`)."""
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer("prism_proxy"), TraceContextTextMapPropagator()


class Tracing:
    """The app's tracing settings: the access log's form and the tracer (None: off)."""

    __slots__ = ("access", "propagator", "tracer")

    def __init__(self, access: str, tracing: str) -> None:
        self.access = access
        found = _otel() if tracing == "auto" else None
        self.tracer, self.propagator = found if found is not None else (None, None)

    # --- the request's life -------------------------------------------------------------
    def arrive(self, request: web.Request) -> RequestTrace:
        headers = request.headers
        trace = RequestTrace(
            request_id_of(headers.get(REQUEST_ID_HEADER)),
            time.monotonic(),
            time.time(),
            trace_context_of(headers.get(TRACEPARENT), headers.get(TRACESTATE)),
        )
        if self.tracer is not None:
            from opentelemetry.trace import SpanKind

            parent = self.propagator.extract(trace.incoming) if trace.incoming else None
            span = self.tracer.start_span(
                "prism.request",
                context=parent,
                kind=SpanKind.SERVER,
                attributes={
                    "http.request.method": request.method,
                    "url.path": request.rel_url.raw_path,
                    "prism.request_id": trace.request_id,
                },
            )
            # a span the sampler left out is not kept: the client's trace context then
            # goes to the engine as it came
            if span.is_recording():
                span.add_event("arrival")
                trace.span = span
        return trace

    def end(self, request: web.Request, trace: RequestTrace, status: int) -> None:
        now = time.monotonic()
        lane = request.get(LANE, "none")
        if trace.span is not None:
            _end_wait(trace, "withdrawn")
            span = trace.span
            span.set_attribute("http.response.status_code", status)
            span.set_attribute("prism.lane", lane)
            if status >= 500:
                from opentelemetry.trace import StatusCode

                span.set_status(StatusCode.ERROR)
            span.end()
        if self.access != "off":
            line = access_fields(request, trace, status, lane, now)
            if self.access == "json":
                access_log.info(orjson.dumps(line).decode(), extra={"access": line})
            else:
                access_log.info(access_text(line), extra={"access": line})


def _end_wait(trace: RequestTrace, outcome: str) -> None:
    wait = trace.wait_span
    if wait is not None:
        wait.set_attribute("prism.outcome", outcome)
        wait.end()
        trace.wait_span = None


def _ms(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round((end - start) * 1000.0, 3)


def access_fields(
    request: web.Request, trace: RequestTrace, status: int, lane: str, now: float
) -> dict[str, Any]:
    """One access-log line's fields (None: not known for this request)."""
    return {
        "time": datetime.fromtimestamp(trace.arrival_wall, UTC).isoformat(timespec="milliseconds"),
        "request_id": trace.request_id,
        "method": request.method,
        "path": request.rel_url.raw_path,  # as sent: no decoded line breaks, no query
        "status": status,
        "latency_ms": _ms(trace.arrival, now),
        "wait_ms": _ms(trace.queued_at, trace.released_at),
        "ttft_ms": _ms(trace.arrival, trace.first_token_at),
        "lane": lane,
        "client": client_key(request),
        "prompt_tokens": trace.prompt_tokens,
        "completion_tokens": trace.completion_tokens,
    }


def access_text(line: dict[str, Any]) -> str:
    """The text form: `key=value` pairs after the request line; unknowns left out."""
    head = f'{line["request_id"]} "{line["method"]} {line["path"]}" {line["status"]}'
    rest = " ".join(
        f"{key}={value}"
        for key, value in line.items()
        if key not in ("time", "request_id", "method", "path", "status") and value is not None
    )
    return f"{head} {rest}"


# --- the hooks ------------------------------------------------------------------------
def queued(request: web.Request) -> None:
    """The request enters QAS's queue."""
    trace = request.get(TRACE)
    if trace is None:
        return
    trace.queued_at = time.monotonic()
    if trace.span is not None:
        from opentelemetry import trace as otel

        trace.span.add_event("queued")
        tracer = request.app[TRACING].tracer
        trace.wait_span = tracer.start_span(
            "prism.admission_wait", context=otel.set_span_in_context(trace.span)
        )


def released(request: web.Request, lane: str, wait_s: float) -> None:
    """QAS released the request in `lane` after `wait_s` queued."""
    trace = request.get(TRACE)
    if trace is None:
        return
    trace.released_at = time.monotonic()
    if trace.span is not None:
        if trace.wait_span is not None:
            trace.wait_span.set_attribute("prism.lane", lane)
            trace.wait_span.set_attribute("prism.wait_ms", wait_s * 1000.0)
        _end_wait(trace, "released")
        trace.span.add_event("released", {"prism.lane": lane, "prism.wait_ms": wait_s * 1000.0})


def first_token(request: web.Request) -> None:
    """The engine's first chunk (or whole answer) arrived."""
    trace = request.get(TRACE)
    if trace is None or trace.first_token_at is not None:
        return
    trace.first_token_at = time.monotonic()
    if trace.span is not None:
        trace.span.add_event("first_token")


def tokens(request: web.Request, prompt: int, completion: int) -> None:
    """The engine's token counts for the request, when it reported them."""
    trace = request.get(TRACE)
    if trace is not None:
        trace.prompt_tokens, trace.completion_tokens = prompt, completion


def engine_headers(request: web.Request) -> dict[str, str] | None:
    """Headers for the engine: the request id and the trace context (the proxy's span
    when tracing, else the client's, checked)."""
    trace = request.get(TRACE)
    if trace is None:
        return None
    if trace.engine is None:
        headers = {REQUEST_ID_HEADER: trace.request_id}
        if trace.span is not None:
            from opentelemetry import trace as otel

            carrier: dict[str, str] = {}
            request.app[TRACING].propagator.inject(carrier, otel.set_span_in_context(trace.span))
            headers.update(trace_context_of(carrier.get(TRACEPARENT), carrier.get(TRACESTATE)))
        else:
            headers.update(trace.incoming)
        trace.engine = headers
    return trace.engine


# --- wiring ---------------------------------------------------------------------------
TRACING = web.AppKey("tracing", Tracing)


@web.middleware
async def tracing_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Outermost: the request's id and trace from its arrival to its answer's end
    (a stream's last byte: the handler returns after it)."""
    tracing = request.app[TRACING]
    trace = tracing.arrive(request)
    request[TRACE] = trace
    token = REQUEST_ID.set(trace.request_id)
    try:
        return await handle_counted(
            request, handler, lambda status: tracing.end(request, trace, status)
        )
    finally:
        REQUEST_ID.reset(token)


async def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """`x-request-id` on every response the application prepares (errors, streams)."""
    trace = request.get(TRACE)
    if trace is not None:
        response.headers[REQUEST_ID_HEADER] = trace.request_id


def add_tracing(app: web.Application, access: str, tracing: str) -> None:
    """Set up an application's tracing (its middleware goes first in its list)."""
    app[TRACING] = Tracing(access, tracing)
    app.on_response_prepare.append(echo_request_id)
