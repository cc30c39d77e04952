"""HTTP handlers: parse at the edge, admit through QAS, relay the backend's answer.

Token path (SPEC §1, §2, §4): body → `TokenJob` → queued in QAS → released in a wave →
serialized in the released order → backend `/generate` with `input_ids`, `rid`,
`sampling_params` and the anchors in `kv_hints` (SGLang's envelope, built by
`backend_plugin.dart.anchors.make_kv_hints`) → OpenAI (or native) response.
Passthrough (features the token path cannot serve): admitted by QAS the same way, then
sent unchanged (minus `prism`) to the backend's own endpoint.

Every accepted request ends in exactly one response: errors raised anywhere become
`ApiError` and one JSON error body (middleware); a client that leaves while queued is
withdrawn, one that leaves after its request was sent triggers `/abort_request`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar, cast

import aiohttp
import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from backend_plugin.dart.anchors import CUSTOM_PARAMS_KEY, make_kv_hints
from prism_proxy import state
from prism_proxy.admission import (
    DuplicateRidError,
    QueueFullError,
    Release,
    ShuttingDownError,
)
from prism_proxy.api_models import (
    ChatCompletionRequest,
    CheckedBody,
    CompletionRequest,
    GenerateRequest,
    PromptSize,
    describe_validation_error,
    openai_error,
)
from prism_proxy.backend_client import BackendError
from prism_proxy.bodies import BodyError, Caps, check_counts
from prism_proxy.config import ProxyConfig
from prism_proxy.conversation import (
    NotRenderable,
    chat_job,
    content_format,
    dispatch_check,
    find_turns,
    template_messages,
    template_tools,
    turns_job,
)
from prism_proxy.http_errors import http_exception_response
from prism_proxy.memory import release_free_memory
from prism_proxy.openai_format import (
    SSE_DONE,
    ChatFormat,
    CompletionFormat,
    GenerateFormat,
    ResponseFormat,
    TokenUsage,
    sse,
    stream_error,
)
from prism_proxy.prompts import (
    Finding,
    PromptError,
    TokenJob,
    chat_defaults,
    find_documents,
    hinted_job,
    message_text,
    private_job,
    segmented_job,
)
from prism_proxy.qas.types import QueuedRequest
from prism_proxy.sglang_fields import MAX_PROMPT_LOGPROB_ENTRIES, refused
from prism_proxy.tokenizer import ChatTemplateError, Tokenizer

ENDPOINT = web.RequestKey("endpoint", str)
LANE = web.RequestKey("lane", str)
STATUS = web.RequestKey("status", int)  # overrides the HTTP status for metrics
STARTED = web.RequestKey("started", float)

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

CLIENT_CLOSED = 499  # metrics status of requests whose client went away
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.headers = dict(headers or {})


def backend_failure(exc: BackendError) -> ApiError:
    """The answer to a failed backend exchange: its status (502/503, or the backend's own
    4xx: a request it refuses) and message."""
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


def new_rid() -> str:
    """The backend rid of one request: always the proxy's own, fixed length.

    SGLang aborts every request whose rid *starts with* the aborted one, so a rid chosen
    by a client could abort other clients' requests; a client's `rid` only names its
    response.
    """
    return "prism-" + os.urandom(16).hex()  # uuid4().hex costs 4x as much


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
            openai_error(exc.message, kind=exc.kind, param=exc.param, code=exc.status),
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
            metrics = request.app[state.METRICS]
            lane = request[LANE]
            status = request.get(STATUS, status)
            metrics.child(metrics.requests, endpoint, lane, str(status)).inc()
            if lane != "none":
                elapsed = time.monotonic() - request[STARTED]
                metrics.child(metrics.e2e_latency, lane).observe(elapsed)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body exceeds {limit} bytes", param="body")


def body_caps(config: ProxyConfig) -> Caps:
    return Caps(config.max_messages, config.max_segments, config.max_prompt_chars)


async def read_body(request: web.Request, model: type[M]) -> tuple[M, dict[str, Any]]:
    """Parse and validate the JSON body: 413 over the limits, 400 naming the bad field.
    Costly bodies are judged off the event loop first (`prism_proxy.bodies`)."""
    config = request.app[state.CONFIG]
    limit = config.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    try:
        data = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(limit) from None
    try:
        raw = await request.app[state.PARSER].parse(data)
        if not isinstance(raw, dict):
            raise BodyError(400, "body: expected a JSON object")
        check_counts(raw, body_caps(config))
    except BodyError as exc:
        raise ApiError(exc.status, exc.message, param=exc.param) from None
    check_refused(raw)
    try:
        body = model.model_validate(raw)
    except ValidationError as exc:
        param, message = describe_validation_error(exc)
        raise ApiError(400, message, param=param) from None
    check_served(request, cast(CheckedBody, body))
    return body, raw


def check_refused(raw: dict[str, Any]) -> None:
    """400 naming the first field PRISM does not serve (`sglang_fields.REFUSED`), in the
    body or its `sampling_params`."""
    places: list[tuple[str, Any]] = [("", raw)]
    params = raw.get("sampling_params")
    if isinstance(params, dict):
        places.append(("sampling_params.", params))
    elif isinstance(params, list):
        places.extend((f"sampling_params.{i}.", p) for i, p in enumerate(params))
    for prefix, fields in places:
        found = refused(fields) if isinstance(fields, dict) else None
        if found is not None:
            name, reason = found
            raise ApiError(400, f"{prefix}{name}: not accepted: {reason}", param=prefix + name)


def check_ids(ids: Sequence[int], vocab_size: int, param: str) -> None:
    """Token ids the served model can embed: 0 <= id < vocab size, else 400 naming the
    first one outside (an id outside kills the engine). min/max run at C speed: a
    million ids cost ~20 ms; the index is looked for only when one is outside."""
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        index, token = next((i, t) for i, t in enumerate(ids) if not 0 <= t < vocab_size)
        raise ApiError(
            400,
            f"{param}.{index}: token id {token} is outside the vocabulary [0, {vocab_size})",
            param=f"{param}.{index}",
        )


def check_served(request: web.Request, body: CheckedBody) -> None:
    """What types cannot say: every token id within the served vocabulary, `top_k`
    within it, and prompt logprobs within `MAX_PROMPT_LOGPROB_ENTRIES`."""
    vocab_size = request.app[state.TOKENIZER].vocab_size
    try:
        for param, ids in body.token_ids():
            check_ids(ids, vocab_size, param)
    except ValueError as exc:  # a logit_bias key that is no token id
        raise ApiError(400, str(exc), param="logit_bias") from None
    for param, top_k in body.top_ks():
        if top_k > vocab_size:
            message = f"{param}: must be -1 or at most the vocabulary size {vocab_size}"
            raise ApiError(400, message, param=param)
    entries = body.prompt_logprob_entries()
    if entries > MAX_PROMPT_LOGPROB_ENTRIES:
        raise ApiError(
            400,
            f"logprobs: {entries} prompt positions x logprobs exceed the limit of "
            f"{MAX_PROMPT_LOGPROB_ENTRIES}",
            param="logprobs",
        )


def _prompt_error(exc: PromptError) -> ApiError:
    return ApiError(400, str(exc), param=exc.param)


# Requests whose prompt work (`PromptSize.work`) is at least this large are rendered,
# tokenized and serialized in a worker thread (the tokenizer releases the GIL for long
# texts, and the interpreter switches threads every 5 ms in Python code such as the
# chat template), so one big request never stalls the loop.
OFFLOAD_CHARS = 32_768


async def off_loop(size: PromptSize, work: Callable[[], T]) -> T:
    """`work()` here for a small prompt, in a worker thread for a large one."""
    if size.work >= OFFLOAD_CHARS:
        try:
            return await asyncio.to_thread(work)
        finally:
            release_free_memory()
    return work()


def check_prompt_size(request: web.Request, size: PromptSize) -> None:
    """413 above `max_prompt_chars` (every path, the forwarded one included)."""
    limit = request.app[state.CONFIG].max_prompt_chars
    if size.chars > limit:
        raise ApiError(
            413,
            f"prompt: {size.chars} characters (token ids count one each) exceed the "
            f"limit of {limit}",
            param="prompt",
        )


async def make_job(size: PromptSize, build: Callable[[], TokenJob]) -> TokenJob:
    """Build a request's token job (its size already checked): 400 for a bad prompt,
    off the event loop when large."""
    try:
        return await off_loop(size, build)
    except PromptError as exc:
        raise _prompt_error(exc) from None


def _record_tokens(request: web.Request, lane: str, usage: TokenUsage | None) -> None:
    if usage is None:
        return
    metrics = request.app[state.METRICS]
    metrics.child(metrics.prompt_tokens, lane).inc(usage.prompt_tokens)
    metrics.child(metrics.cached_tokens, lane).inc(usage.cached_tokens)


SLO_HEADER = "x-prism-ttft-slo-ms"
MAX_SLO_MS = 3_600_000.0
# Plain decimal milliseconds: Python's float() also takes "1_000", " 1e3", "inf", "nan".
_SLO_VALUE = re.compile(r"[0-9]{1,7}(?:\.[0-9]{1,3})?")


def ttft_slo_s(request: web.Request) -> float | None:
    """The client's TTFT target from `x-prism-ttft-slo-ms` (None when absent; 400 when
    not plain decimal milliseconds in (0, 1 h])."""
    raw = request.headers.get(SLO_HEADER)
    if raw is None:
        return None
    value = float(raw) if _SLO_VALUE.fullmatch(raw) else math.nan
    if not 0.0 < value <= MAX_SLO_MS:  # also refuses NaN
        raise ApiError(
            400,
            f"{SLO_HEADER}: expected decimal milliseconds in (0, {MAX_SLO_MS:.0f}]",
            param=SLO_HEADER,
        )
    return value / 1000.0


def _admission_error(exc: BaseException, retry_after_s: float) -> ApiError | None:
    """The answer to an admission failure, or to a backend failure inside the block."""
    if isinstance(exc, QueueFullError):
        headers = {"Retry-After": str(retry_after_s)}
        return ApiError(429, str(exc), kind="rate_limit_exceeded", headers=headers)
    if isinstance(exc, ShuttingDownError):
        return ApiError(503, str(exc), kind="service_unavailable")
    if isinstance(exc, DuplicateRidError):
        return ApiError(400, f"rid: {exc}", param="rid")
    if isinstance(exc, BackendError):
        return backend_failure(exc)
    if isinstance(exc, PromptError):  # found only when serialized at release
        return _prompt_error(exc)
    return None


class _Admitted:
    """QAS admission as a block: 429 when full, 503 when stopping; always frees the slot.
    A TTFT SLO header gives the request its own admission deadline (issue 13). A class,
    not a generator-based context manager: one per request (issue 14)."""

    __slots__ = ("_lane", "_queued", "_request", "_slot")

    def __init__(
        self, request: web.Request, queued: QueuedRequest, lane: str | None = None
    ) -> None:
        self._request = request
        self._queued = queued
        self._lane = lane

    async def __aenter__(self) -> Release:
        request = self._request
        app = request.app
        queued = self._queued
        slo_s = ttft_slo_s(request)
        if slo_s is not None:
            queued = replace(queued, ttft_slo_s=slo_s)
        self._slot = app[state.ADMISSION].slot(queued)
        try:
            release = await self._slot.__aenter__()
        except Exception as exc:
            self._raise_mapped(exc)
            raise
        chosen = self._lane or release.lane.value
        request[LANE] = chosen
        metrics = app[state.METRICS]
        metrics.child(metrics.admission_wait, chosen).observe(release.wait_s)
        return release

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        await self._slot.__aexit__(exc_type, exc, tb)
        if exc is not None:
            self._raise_mapped(exc)

    def _raise_mapped(self, exc: BaseException) -> None:
        error = _admission_error(exc, self._request.app[state.CONFIG].retry_after_s)
        if error is not None:
            raise error from None


# --- the token path -------------------------------------------------------------------
async def token_path(
    request: web.Request,
    job: TokenJob,
    *,
    size: PromptSize,
    rid: str,
    sampling_params: dict[str, Any],
    stream: bool,
    fmt: ResponseFormat,
    extra_fields: dict[str, Any] | None = None,
    group: str = "",
) -> web.StreamResponse:
    """Admit, serialize in the released order, stream from the backend's `/generate`.
    `group`: the client's grouping hint (`prompt_cache_key`) for QAS.

    The proxy always streams from the backend, also for clients that did not ask to:
    the first chunk is the moment the request stops pending prefill (SPEC §2 pacing).
    Non-streaming clients get the chunks assembled into one response.
    """
    app = request.app
    backend = app[state.BACKEND]
    async with _Admitted(request, job.queued(rid, time.monotonic(), group)) as release:
        lane = release.lane.value
        payload = await off_loop(
            size,
            lambda: job.payload(
                release.skeleton,
                rid=rid,
                priorities=release.priorities,
                sampling_params=sampling_params,
                extra_fields=extra_fields,
            ),
        )
        batches = backend.generate_batches(payload)
        async with contextlib.aclosing(batches):
            try:
                first = await anext(batches, None)
                if first is None:
                    raise BackendError(502, "backend stream ended without a chunk")
                _first_token(request, rid, lane, first[0])
                if stream:
                    return await _relay_stream(request, first, batches, fmt, lane, rid)
                feed = fmt.assembled.feed
                for chunk in first:
                    feed(chunk)
                async for batch in batches:
                    for chunk in batch:
                        feed(chunk)
            except asyncio.CancelledError:
                backend.abort(rid)  # the client left while the backend was working
                raise
        _record_tokens(request, lane, TokenUsage.from_meta(fmt.assembled.meta_info))
        return json_answer(fmt.whole())


def _first_token(request: web.Request, rid: str, lane: str, chunk: dict[str, Any]) -> None:
    """The backend's first chunk: the request leaves pending prefill; TTFT is observed."""
    meta_info = chunk.get("meta_info") or {}
    uncached: int | None = None
    prompt, cached = meta_info.get("prompt_tokens"), meta_info.get("cached_tokens")
    if isinstance(prompt, int) and isinstance(cached, int):
        uncached = prompt - cached
    request.app[state.ADMISSION].first_token(rid, uncached)
    metrics = request.app[state.METRICS]
    metrics.child(metrics.ttft, lane).observe(time.monotonic() - request[STARTED])


async def _relay_stream(
    request: web.Request,
    first: list[dict[str, Any]],
    batches: AsyncIterator[list[dict[str, Any]]],
    fmt: ResponseFormat,
    lane: str,
    rid: str,
) -> web.StreamResponse:
    """Relay `/generate` chunks as they come, one write per batch the backend's socket
    delivered (a chunk is never held back for a later one). Headers go out with the
    first chunk, so a backend that fails before answering still gets a proper 502/503
    status; a failure after that ends the stream with an error event."""
    backend = request.app[state.BACKEND]
    response = web.StreamResponse(headers=SSE_HEADERS)
    meta_info: dict[str, Any] = {}
    try:
        await response.prepare(request)
        pending = fmt.start()
        render = fmt.chunk
        batch: list[dict[str, Any]] | None = first
        while batch is not None:
            for chunk in batch:
                meta_info = chunk.get("meta_info") or meta_info
                pending += render(chunk)
            if pending:
                await response.write(b"".join(pending))
                pending = []
            batch = await anext(batches, None)
        await response.write(b"".join(pending + fmt.end(meta_info)))
    except BackendError as exc:
        request[STATUS] = exc.status
        await response.write(sse(stream_error(exc.message, exc.status)) + SSE_DONE)
    except ConnectionResetError:  # the client went away mid-stream
        backend.abort(rid)
        request[STATUS] = CLIENT_CLOSED
        return response
    _record_tokens(request, lane, TokenUsage.from_meta(meta_info) if meta_info else None)
    await response.write_eof()
    return response


# --- passthrough ----------------------------------------------------------------------
class _ClientGone(Exception):
    """The client's connection broke while we relayed; not a backend failure.

    (aiohttp's ClientConnectionResetError is also a ClientConnectionError, which the
    backend client would otherwise take for a backend failure.)"""


async def passthrough(
    request: web.Request,
    path: str,
    body: dict[str, Any],
    *,
    set_rid: bool,
    job: TokenJob | None = None,
    group: str = "",
) -> web.StreamResponse:
    """Admit, then send `body` (the request's checked, served fields: its `forwarded`)
    to the backend's `path`, with a rid of the proxy's own when `set_rid`. The request
    counts as pending prefill until the backend's first body byte (SPEC §2).

    With a `job` (the turns the proxy found in a chat that the engine renders itself),
    QAS schedules its skeleton and the anchors ride in `custom_params`, with the
    `anchor_check` of the proxy's rendering: the engine places them only on a prompt
    that matches."""
    backend = request.app[state.BACKEND]
    rid = new_rid() if set_rid else None
    if rid is not None:
        body["rid"] = rid
    arrival = time.monotonic()
    queued = (
        QueuedRequest(rid=rid or new_rid(), arrival=arrival, group=group)
        if job is None
        else job.queued(rid or new_rid(), arrival, group)
    )
    async with _Admitted(request, queued, lane=None if job else "passthrough") as release:
        lane = release.lane.value if job else "passthrough"
        if job is not None:
            dispatch = job.build(release.skeleton)
            hints = make_kv_hints(
                dispatch.anchors,
                release.priorities,
                message_id=queued.rid,
                check=dispatch_check(dispatch),
            )
            body["custom_params"] = {CUSTOM_PARAMS_KEY: orjson.dumps(hints).decode()}
        try:
            async with backend.forward(path, body) as upstream:
                if not upstream.content_type.startswith("text/event-stream"):
                    data = await upstream.read()
                    request.app[state.ADMISSION].first_token(queued.rid)
                    _record_tokens(request, lane, _usage_of(data))
                    return web.Response(
                        body=data, status=upstream.status, content_type=upstream.content_type
                    )
                return await _relay_lines(request, upstream, queued.rid, lane)
        except (asyncio.CancelledError, _ClientGone) as exc:
            if rid is not None:
                backend.abort(rid)
            if isinstance(exc, asyncio.CancelledError):
                raise
            request[STATUS] = CLIENT_CLOSED
            return web.StreamResponse()


async def _relay_lines(
    request: web.Request, upstream: Any, rid: str, lane: str
) -> web.StreamResponse:
    """Copy an upstream SSE stream line by line as it comes."""
    metrics = request.app[state.METRICS]
    response = web.StreamResponse(status=upstream.status, headers=SSE_HEADERS)
    usage: TokenUsage | None = None
    first = True
    lines = aiter(upstream.content)
    try:
        await response.prepare(request)
        while True:
            try:
                line = await anext(lines)
            except StopAsyncIteration:
                break
            except (aiohttp.ClientError, TimeoutError) as exc:
                # Headers are out: end the stream with an error event.
                request[STATUS] = 502
                message = f"backend stream broke: {exc!r}"
                await response.write(sse(stream_error(message, 502)) + SSE_DONE)
                return response
            if first:
                request.app[state.ADMISSION].first_token(rid)
                elapsed = time.monotonic() - request[STARTED]
                metrics.child(metrics.ttft, lane).observe(elapsed)
                first = False
            if b'"usage"' in line:
                usage = _usage_of(line.strip()[5:]) or usage
            await response.write(line)
        await response.write_eof()
    except ConnectionResetError as exc:
        raise _ClientGone() from exc
    _record_tokens(request, lane, usage)
    return response


def _usage_of(data: bytes) -> TokenUsage | None:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return TokenUsage.from_openai(body.get("usage")) if isinstance(body, dict) else None


# --- endpoints ------------------------------------------------------------------------
def _format(cls: type[ResponseFormat], rid: str, prefix: str, model: str, usage: bool):
    return cls(
        completion_id=f"{prefix}-{rid}" if prefix else rid, model=model, created=int(time.time()),
        include_usage=usage,
    )  # fmt: skip


EXTRACT_HEADER = "x-prism-extract"


def count_origin(request: web.Request, outcome: str, layout: str = "") -> None:
    """Count a request by where its segments came from (`prism:extraction_total`)."""
    metrics = request.app[state.METRICS]
    metrics.child(metrics.extraction, request[ENDPOINT], outcome, layout).inc()


class DocumentFinder:
    """Documents in a request without hints (`prompts.find_documents`), as the
    deployment's settings and the request's `x-prism-extract` header allow; remembers
    what it found for the metrics. `find` may run in a worker thread."""

    __slots__ = ("evidence", "hinted", "layout", "layouts", "outcome", "reorder")

    def __init__(self, request: web.Request, hinted: bool) -> None:
        config = request.app[state.CONFIG]
        self.evidence = request.app[state.EVIDENCE]
        self.reorder = config.extraction_reorder
        self.layouts = config.extraction_layouts
        opt = request.headers.get(EXTRACT_HEADER)
        if opt is not None:
            opt = opt.strip().lower()
            if opt not in ("on", "off"):
                raise ApiError(
                    400, f"{EXTRACT_HEADER}: expected 'on' or 'off'", param=EXTRACT_HEADER
                )
            if opt == "off":
                self.layouts = ()
        self.hinted = hinted
        self.outcome = "hinted" if hinted else ("none" if self.layouts else "off")
        self.layout = ""

    @property
    def searching(self) -> bool:
        """Whether this request may be segmented (no hints, extraction on for it)."""
        return not self.hinted and bool(self.layouts)

    def find(self, text: str, system: str | None) -> Finding | None:
        finding = find_documents(
            text, system=system, layouts=self.layouts, reorder=self.reorder, evidence=self.evidence
        )
        if finding is not None:
            self.outcome, self.layout = finding.outcome, finding.layout
        return finding

    def count(self, request: web.Request) -> None:
        count_origin(request, self.outcome, self.layout)


def _chat_turns(tokenizer: Tokenizer, forwarded: dict[str, Any]) -> TokenJob | None:
    """The turns of a chat the engine's own endpoint serves, rendered (tools included)
    as that endpoint renders it (`conversation`), or None when the proxy cannot render
    it as the engine would."""
    if forwarded.get("chat_template_kwargs") or forwarded.get("reasoning_effort") is not None:
        return None  # template variables the proxy does not pass
    try:
        messages = template_messages(forwarded["messages"], content_format(tokenizer.chat_template))
        tools = template_tools(forwarded.get("tools"), forwarded.get("tool_choice"))
        return turns_job(find_turns(tokenizer, messages, tools))
    except NotRenderable:
        return None


async def chat_relay(
    request: web.Request, body: ChatCompletionRequest, raw: dict[str, Any], size: PromptSize
) -> web.StreamResponse:
    """A chat only the engine's own endpoint serves (tools and tool calls, `n`,
    logprobs, response formats...): it renders the prompt and parses the answer, so the
    client gets exactly the engine's answer. The proxy renders the same prompt to find
    its turns: QAS schedules it and DART gets its anchors like any other request."""
    forwarded = body.forwarded(raw)
    tokenizer = request.app[state.TOKENIZER]
    job = None
    if DocumentFinder(request, hinted=False).searching:
        try:
            job = await off_loop(size, lambda: _chat_turns(tokenizer, forwarded))
        except ChatTemplateError:
            job = None
    if job is None or job.head_tokens == 0:
        count_origin(request, "forwarded")
        job = None
    else:
        count_origin(request, "turns", "messages")
    path = "/v1/chat/completions"
    set_rid = (body.n or 1) == 1
    group = body.prompt_cache_key or ""
    return await passthrough(request, path, forwarded, set_rid=set_rid, job=job, group=group)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    request[ENDPOINT] = "chat"
    body, raw = await read_body(request, ChatCompletionRequest)
    size = body.prompt_size()
    check_prompt_size(request, size)
    if body.passthrough_reason() is not None:
        return await chat_relay(request, body, raw, size)
    tokenizer = request.app[state.TOKENIZER]
    serializer = request.app[state.SERIALIZER]
    finder = DocumentFinder(request, body.prism is not None)

    def build() -> TokenJob:
        if body.prism is not None:
            system, suffix = chat_defaults(body.messages)
            return hinted_job(serializer, body.prism, system=system, suffix=suffix, chat=True)
        try:
            found = chat_job(
                serializer,
                body.forwarded(raw)["messages"],
                layouts=finder.layouts,
                reorder=finder.reorder,
                evidence=finder.evidence,
            )
        except NotRenderable:  # a continuation of the assistant's last message
            messages = [{"role": m.role, "content": message_text(m)} for m in body.messages]
            ids = tokenizer.encode_chat(tokenizer.render_chat(messages))
            return private_job({"input_ids": ids}, len(ids))
        finder.outcome, finder.layout = found.outcome, found.layout
        return found.job

    try:
        job = await make_job(size, build)
        finder.count(request)
    except ChatTemplateError:
        # No usable chat template here: let the backend render the chat itself.
        count_origin(request, "forwarded")
        return await passthrough(request, "/v1/chat/completions", body.forwarded(raw), set_rid=True)
    rid = new_rid()
    return await token_path(
        request,
        job,
        size=size,
        rid=rid,
        sampling_params=body.sampling_params(body.max_new_tokens),
        stream=body.stream,
        fmt=_format(ChatFormat, body.rid or rid, "chatcmpl", body.model, body.include_usage),
        extra_fields=body.generate_fields(),
        group=body.prompt_cache_key or "",
    )


async def completions(request: web.Request) -> web.StreamResponse:
    request[ENDPOINT] = "completions"
    body, raw = await read_body(request, CompletionRequest)
    size = body.prompt_size()
    check_prompt_size(request, size)
    if body.passthrough_reason() is not None:
        forwarded = body.forwarded(raw)
        count_origin(request, "forwarded")
        group = body.prompt_cache_key or ""
        return await passthrough(
            request, "/v1/completions", forwarded, set_rid=(body.n or 1) == 1, group=group
        )
    prompt = body.single_prompt()
    serializer = request.app[state.SERIALIZER]
    finder = DocumentFinder(request, body.prism is not None)

    def build() -> TokenJob:
        if body.prism is not None:
            text = prompt if isinstance(prompt, str) else None
            return hinted_job(serializer, body.prism, system=None, suffix=text, chat=False)
        if isinstance(prompt, str):
            if (finding := finder.find(prompt, None)) is not None:
                return segmented_job(serializer, finding.prompt, chat=False)
            return private_job({"text": prompt}, None)
        return private_job({"input_ids": prompt}, len(prompt))  # checked in read_body

    job = await make_job(size, build)
    finder.count(request)
    rid = new_rid()
    return await token_path(
        request,
        job,
        size=size,
        rid=rid,
        sampling_params=body.sampling_params(body.max_tokens),
        stream=body.stream,
        fmt=_format(CompletionFormat, body.rid or rid, "cmpl", body.model, body.include_usage),
        extra_fields=body.generate_fields(),
        group=body.prompt_cache_key or "",
    )


async def generate(request: web.Request) -> web.StreamResponse:
    request[ENDPOINT] = "generate"
    body, raw = await read_body(request, GenerateRequest)
    size = body.prompt_size()
    check_prompt_size(request, size)
    if body.passthrough_reason() is not None:
        count_origin(request, "forwarded")
        return await passthrough(request, "/generate", body.forwarded(raw), set_rid=False)
    serializer = request.app[state.SERIALIZER]
    finder = DocumentFinder(request, body.prism is not None)

    def build() -> TokenJob:
        if body.prism is not None:
            text = body.text if isinstance(body.text, str) else None
            return hinted_job(serializer, body.prism, system=None, suffix=text, chat=False)
        if body.input_ids is not None:  # checked in read_body
            return private_job({"input_ids": body.input_ids}, len(body.input_ids))
        if isinstance(body.text, str):
            if (finding := finder.find(body.text, None)) is not None:
                return segmented_job(serializer, finding.prompt, chat=False)
            return private_job({"text": body.text}, None)
        raise PromptError("text", "either text or input_ids is required")

    job = await make_job(size, build)
    finder.count(request)
    rid = new_rid()
    return await token_path(
        request,
        job,
        size=size,
        rid=rid,
        sampling_params=body.backend_sampling_params(),
        stream=body.stream,
        fmt=_format(GenerateFormat, body.rid or rid, "", "", False),
        extra_fields=body.generate_fields(),
    )


async def models(request: web.Request) -> web.Response:
    try:
        return json_answer(await request.app[state.BACKEND].get_json("/v1/models"))
    except BackendError as exc:
        raise backend_failure(exc) from None


async def health(request: web.Request) -> web.Response:
    """Liveness of the proxy itself (200 while it serves); the body reports the rest."""
    app = request.app
    admission = app[state.ADMISSION]
    return json_answer(
        {
            "status": "ok",
            "backend_up": bool(app[state.BACKEND].up),
            "queue_depth": admission.queue_depth,
            "inflight": admission.inflight,
            "policy": app[state.CONFIG].policy,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[state.METRICS].render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


LANE_HEADER = "x-prism-lane"


async def lane_header(request: web.Request, response: web.StreamResponse) -> None:
    """Tell the client which lane released its request (`hot`, `cold`, `passthrough`),
    so load generators can report per-lane numbers; nothing when it never got one."""
    lane = request.get(LANE)
    if lane is not None and lane != "none":
        response.headers[LANE_HEADER] = lane


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/generate", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    if app[state.CONFIG].metrics_listen is None:  # else on the admin listener only
        app.router.add_get("/metrics", metrics)
    app.on_response_prepare.append(lane_header)
