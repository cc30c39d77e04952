"""To the engine and back (SPEC §1, §2, §4).

Token path: `TokenJob` → queued in QAS → released in a wave → serialized in the released
order → backend `/generate` with `input_ids`, `rid`, `sampling_params` and the anchors in
`kv_hints` (`prism_wire.make_kv_hints`) → OpenAI (or native) response, streamed or
assembled. Passthrough (what the token path cannot serve): admitted the same way, then
sent unchanged (minus `prism`) to the backend's own endpoint and relayed line by line.

A client that leaves while queued is withdrawn; one that leaves after its request was
sent triggers `/abort_request`.

A chat stream may reach its client in another shape: `/v1/responses` sets a
`StreamRewriter` (`REWRITER`) that every write of the stream passes through.

With the session features on, a chat with tools (passthrough with turns) tells the
proxy's `SessionKeeper` when it arrives, from which client (`accounts.client_key`: what
a client's sessions earn is its own), when its first chunk comes back, and how it ended:
in a tool call (the session pauses, and DART keeps it if its account earned that) or
not. A continuation of a paused session is queued with its program's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web

from prism_proxy.admission.sessions import SessionKeeper
from prism_proxy.api.costs import PromptSize
from prism_proxy.backend.errors import BackendError
from prism_proxy.edge import state, tracing
from prism_proxy.edge.accounts import charge, client_key
from prism_proxy.edge.admit import Admitted, new_rid, off_loop
from prism_proxy.edge.assemble import AnswerTooLarge, GenerateAnswer, OpenAIAnswer
from prism_proxy.edge.errors import CLIENT_CLOSED, STARTED, STATUS, ApiError, json_answer
from prism_proxy.edge.openai_format import (
    SSE_DONE,
    ResponseFormat,
    TokenUsage,
    json_bytes,
    sse,
    stream_error,
)
from prism_proxy.prompts.conversation import dispatch_check
from prism_proxy.prompts.jobs import TokenJob
from prism_proxy.prompts.sharing import prefix_digests, tenant_key
from prism_proxy.qas.types import QueuedRequest
from prism_wire import CUSTOM_PARAMS_KEY, make_kv_hints

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
# `stream_interval` of a request the proxy assembles: SGLang sends the first token at
# once (the end of its pending prefill), then nothing until the end, so the engine
# never resends a growing answer in every chunk.
ONE_CHUNK_AFTER_FIRST = 1 << 30
# Lines of a stream at least this long are parsed in a worker thread.
OFFLOAD_LINE_BYTES = 256 * 1024
# Answers at least this large are encoded in a worker thread.
OFFLOAD_ANSWER_BYTES = 1 << 20
# Fields SGLang's OpenAI endpoints refuse to stream: such a request is forwarded as it
# is, and its first token cannot be seen (so it never holds a place in prefill pacing).
UNSTREAMABLE = ("return_meta_info", "return_prompt_token_ids", "return_token_ids")


class StreamRewriter(Protocol):
    """Turns the bytes of a chat stream into the stream its client asked for (the
    Responses events of `/v1/responses`), as they are written."""

    def rewrite(self, data: bytes) -> bytes: ...

    def close(self) -> bytes:
        """The bytes that end the stream (once; nothing after)."""
        ...


# Set on a request whose stream reaches its client through a `StreamRewriter`.
REWRITER = web.RequestKey("stream_rewriter", StreamRewriter)


class _RewrittenStream(web.StreamResponse):
    """An SSE response whose every write passes through the request's rewriter."""

    def __init__(self, rewriter: StreamRewriter, status: int) -> None:
        super().__init__(status=status, headers=SSE_HEADERS)
        self._rewriter = rewriter

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        rewritten = self._rewriter.rewrite(bytes(data))
        if rewritten:
            await super().write(rewritten)

    async def write_eof(self, data: bytes = b"") -> None:
        await super().write_eof(self._rewriter.close() + data)


def sse_response(request: web.Request, status: int) -> web.StreamResponse:
    """The response a stream is written to: through the request's `REWRITER`, if set."""
    rewriter = request.get(REWRITER)
    if rewriter is not None:
        return _RewrittenStream(rewriter, status)
    return web.StreamResponse(status=status, headers=SSE_HEADERS)


def too_large(exc: AnswerTooLarge) -> ApiError:
    return ApiError(400, str(exc), param="stream")


# An OpenAI chunk or answer that ends in a tool call (SGLang writes no space; others may).
TOOL_CALL_END = re.compile(rb'"finish_reason"\s*:\s*"tool_calls"')


def _record_tokens(request: web.Request, lane: str, usage: TokenUsage | None) -> None:
    if usage is None:
        return
    tracing.tokens(request, usage.prompt_tokens, usage.completion_tokens)
    metrics = request.app[state.METRICS]
    metrics.child(metrics.prompt_tokens, lane).inc(usage.prompt_tokens)
    metrics.child(metrics.cached_tokens, lane).inc(usage.cached_tokens)
    charge(request, usage.prompt_tokens + usage.completion_tokens)


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
    limit_bytes = app[state.CONFIG].max_answer_bytes
    if not stream:
        sampling_params = {**sampling_params, "stream_interval": ONE_CHUNK_AFTER_FIRST}
    sharing = _Sharing(request, fmt, extra_fields or {})
    async with Admitted(request, job.queued(rid, time.monotonic(), group)) as release:
        lane = release.lane.value
        payload = await off_loop(
            size,
            lambda: job.payload(
                release.skeleton,
                rid=rid,
                priorities=release.priorities,
                sampling_params=sampling_params,
                extra_fields=extra_fields,
                see=sharing.see,
            ),
        )
        headers = tracing.engine_headers(request)
        turn = await app[state.PIECES].send(payload, rid, sharing.known(), headers)
        batches = backend.generate_batches(payload, headers)
        if turn is not None and turn.reused is not None:
            batches = turn.clamped(batches)
        async with contextlib.aclosing(batches):
            try:
                try:
                    first = await anext(batches, None)
                finally:
                    if turn is not None:
                        turn.give_back()
                if first is None:
                    raise BackendError(502, "backend stream ended without a chunk")
                _first_token(request, rid, lane, first[0])
                sharing.first_token()
                if stream:
                    response = await _relay_stream(request, first, batches, fmt, lane, rid)
                    sharing.done()
                    return response
                assembled = fmt.assembled
                for chunk in first:
                    assembled.feed(chunk)
                async for batch in batches:
                    for chunk in batch:
                        assembled.feed(chunk)
                    if assembled.size_bytes > limit_bytes:
                        backend.abort(rid)
                        raise too_large(AnswerTooLarge(limit_bytes))
            except asyncio.CancelledError:
                backend.abort(rid)  # the client left while the backend was working
                raise
        _record_tokens(request, lane, TokenUsage.from_meta(fmt.assembled.meta_info))
        sharing.done()
        whole = fmt.whole()
        if fmt.assembled.size_bytes >= OFFLOAD_ANSWER_BYTES:
            return await asyncio.to_thread(json_answer, whole)
        return json_answer(whole)


class _Sharing:
    """What a token-path request may learn of the cache (`prompts.sharing`): sent as
    token ids, in the shared partition, told at most its visible prefix is cached:
    others' prefixes once several clients sent them (decided from what was recorded
    before it was sent), and its own reuse exactly, looked up when its first token
    comes back (the engine may have matched it against the client's requests sent
    meanwhile; it is recorded then, so it never matches itself). Else (a text prompt
    the engine tokenizes, a partition the client chose) in its client's own partition.
    `see` runs where the payload is built (maybe a worker thread)."""

    __slots__ = (
        "client", "extra_fields", "fmt", "ids", "own", "shared", "shared_sent", "shared_visible",
    )  # fmt: skip

    def __init__(
        self, request: web.Request, fmt: ResponseFormat, extra_fields: dict[str, Any]
    ) -> None:
        self.client = client_key(request)
        self.shared = request.app[state.SHARING]
        self.own = request.app[state.OWN]
        self.fmt = fmt
        self.extra_fields = extra_fields
        self.ids: Sequence[int] = ()
        self.shared_visible = 0
        self.shared_sent = 0

    def see(self, input_ids: Sequence[int], offsets: list[int]) -> dict[str, Any]:
        chosen = self.extra_fields.get("extra_key")
        if not input_ids or chosen is not None or self.extra_fields.get("cache_salt"):
            return {"extra_key": tenant_key(self.client, chosen)}
        prefixes = prefix_digests(input_ids, offsets)
        self.shared_sent = self.shared.sent(prefixes)
        self.shared_visible = self.shared.see(self.client, prefixes)
        self.fmt.visible_tokens = self.shared_visible
        self.ids = input_ids
        return {}

    def known(self) -> int:
        """Tokens of the prompt the engine may hold cached: the longest prefix any
        client sent before, or this client's own reuse (its answers included)."""
        if not self.ids:
            return 0
        return max(self.shared_sent, self.own.own_prefix(self.client, self.ids))

    def first_token(self) -> None:
        if self.ids:
            own = self.own.own_prefix(self.client, self.ids)
            self.fmt.visible_tokens = max(self.shared_visible, own)
            self.own.record(self.client, self.ids)

    def done(self) -> None:
        generated = self.fmt.assembled.output_ids
        if self.ids and generated:
            self.own.record(self.client, [*self.ids, *generated])


def _first_token(request: web.Request, rid: str, lane: str, chunk: dict[str, Any]) -> None:
    """The backend's first chunk: the request leaves pending prefill; TTFT is observed."""
    meta_info = chunk.get("meta_info") or {}
    uncached: int | None = None
    prompt, cached = meta_info.get("prompt_tokens"), meta_info.get("cached_tokens")
    if isinstance(prompt, int) and isinstance(cached, int):
        uncached = prompt - cached
    request.app[state.ADMISSION].first_token(rid, uncached)
    tracing.first_token(request)
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
    response = sse_response(request, 200)
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
    rid = new_rid() if set_rid else None
    if rid is not None:
        body["rid"] = rid
    # the engine renders or tokenizes it: the proxy cannot name its prefixes, so it is
    # matched only against its own client's requests (`prompts.sharing`)
    body["extra_key"] = tenant_key(client_key(request), body.get("extra_key"))
    arrival = time.monotonic()
    # agent sessions: chats that offer tools, whose answers may end in a tool call
    keeper = request.app.get(state.SESSIONS) if job is not None and body.get("tools") else None
    if job is None:
        queued = QueuedRequest(rid=rid or new_rid(), arrival=arrival, group=group)
    else:
        queued = job.queued(rid or new_rid(), arrival, group)
    if keeper is not None:
        queued = _session_arrival(request, keeper, queued, job)
    try:
        return await _passthrough(request, path, body, queued, job, rid, keeper)
    except BaseException:
        if keeper is not None:
            keeper.forget(queued.rid)
        raise


def _session_arrival(
    request: web.Request, keeper: SessionKeeper, queued: QueuedRequest, job: TokenJob | None
) -> QueuedRequest:
    """Tell the keeper a chat with tools arrived; mark a continuation with its program's
    start."""
    assert job is not None
    tokens = len(job.build(()).prompt_fields.get("input_ids", ())) - job.head_tokens
    start = keeper.arrive(queued.rid, job.segments, job.prefix_key, tokens, client_key(request))
    metrics = request.app[state.METRICS]
    metrics.child(metrics.session_calls, "new" if start is None else "continued").inc()
    return queued if start is None else replace(queued, program_start=start)


def _assembly(path: str, body: dict[str, Any], limit_bytes: int) -> Any:
    """For a client that did not ask to stream: ask the engine to stream anyway, and
    return what assembles the answer (`edge.assemble`); None when the client streams
    or SGLang cannot stream what it asked for (`UNSTREAMABLE`)."""
    if body.get("stream") or not (path == "/generate" or path.endswith("completions")):
        return None  # streamed already, or an endpoint that does not stream (embeddings)
    if path == "/generate":
        params = body.get("sampling_params")
        if isinstance(params, list):
            body["sampling_params"] = [
                {**p, "stream_interval": ONE_CHUNK_AFTER_FIRST} for p in params
            ]
        else:
            body["sampling_params"] = {**(params or {}), "stream_interval": ONE_CHUNK_AFTER_FIRST}
        prompt = body.get("text", body.get("input_ids"))
        batch = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)
        several = isinstance(params, list) or (
            isinstance(params, dict) and int(params.get("n") or 1) > 1
        )
        body["stream"] = True
        return GenerateAnswer(batch or several, limit_bytes)
    if any(body.get(name) for name in UNSTREAMABLE):
        return None
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    return OpenAIAnswer("chat" if path.endswith("chat/completions") else "completion", limit_bytes)


async def _passthrough(
    request: web.Request,
    path: str,
    body: dict[str, Any],
    queued: QueuedRequest,
    job: TokenJob | None,
    rid: str | None,
    keeper: SessionKeeper | None,
) -> web.StreamResponse:
    backend = request.app[state.BACKEND]
    limit_bytes = request.app[state.CONFIG].max_answer_bytes
    streams = bool(body.get("stream"))
    answer = _assembly(path, body, limit_bytes)
    async with Admitted(request, queued, lane=None if job else "passthrough") as release:
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
        if answer is None and not streams:
            # its first token cannot be seen: it takes no place in prefill pacing
            request.app[state.ADMISSION].first_token(queued.rid)
        try:
            async with backend.forward(path, body, tracing.engine_headers(request)) as upstream:
                if upstream.content_type.startswith("text/event-stream"):
                    if answer is not None:
                        return await _assemble_lines(
                            request, upstream, answer, queued.rid, lane, keeper
                        )
                    return await _relay_lines(request, upstream, queued.rid, lane, keeper)
                data = await _read_bounded(upstream, limit_bytes, rid, backend)
                request.app[state.ADMISSION].first_token(queued.rid)
                tracing.first_token(request)
                _record_tokens(request, lane, _usage_of(data))
                if keeper is not None:
                    keeper.started(queued.rid)
                    ok = upstream.status == 200
                    keeper.finish(queued.rid, ok and TOOL_CALL_END.search(data) is not None)
                return web.Response(
                    body=data, status=upstream.status, content_type=upstream.content_type
                )
        except (asyncio.CancelledError, _ClientGone) as exc:
            if rid is not None:
                backend.abort(rid)
            if isinstance(exc, asyncio.CancelledError):
                raise
            request[STATUS] = CLIENT_CLOSED
            return web.StreamResponse()


async def _read_bounded(upstream: Any, limit_bytes: int, rid: str | None, backend: Any) -> bytes:
    """A whole answer, at most `limit_bytes` of it (then the request is aborted)."""
    parts: list[bytes] = []
    size = 0
    async for data in upstream.content.iter_any():
        size += len(data)
        if size > limit_bytes:
            if rid is not None:
                backend.abort(rid)
            raise too_large(AnswerTooLarge(limit_bytes))
        parts.append(data)
    return b"".join(parts)


async def _sse_objects(upstream: Any, rid: str, backend: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an upstream SSE stream (big ones parsed off the loop); an
    error event raises BackendError with its own status."""
    async for line in upstream.content:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            continue
        try:
            if len(data) >= OFFLOAD_LINE_BYTES:
                chunk = await asyncio.to_thread(orjson.loads, data)
            else:
                chunk = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            backend.abort(rid)
            raise BackendError(502, f"backend sent an invalid chunk: {exc}") from None
        if isinstance(chunk, dict) and "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            code = error.get("code") if isinstance(error, dict) else None
            status = code if isinstance(code, int) and 400 <= code < 500 else 502
            raise BackendError(status, backend.scrub(str(message))[:500])
        if isinstance(chunk, dict):
            yield chunk


async def _assemble_lines(
    request: web.Request,
    upstream: Any,
    answer: OpenAIAnswer | GenerateAnswer,
    rid: str,
    lane: str,
    keeper: SessionKeeper | None,
) -> web.Response:
    """A stream the client did not ask for, assembled into one answer: the first object
    ends the request's pending prefill."""
    backend = request.app[state.BACKEND]
    metrics = request.app[state.METRICS]
    first = True
    try:
        async for chunk in _sse_objects(upstream, rid, backend):
            if first:
                request.app[state.ADMISSION].first_token(rid)
                tracing.first_token(request)
                metrics.child(metrics.ttft, lane).observe(time.monotonic() - request[STARTED])
                first = False
                if keeper is not None:
                    keeper.started(rid)
            answer.feed(chunk)
    except AnswerTooLarge as exc:
        backend.abort(rid)
        if keeper is not None:
            keeper.forget(rid)
        raise too_large(exc) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        if keeper is not None:
            keeper.forget(rid)
        raise BackendError(502, f"backend stream broke: {type(exc).__name__}") from None
    except BackendError:
        if keeper is not None:
            keeper.forget(rid)
        raise
    if isinstance(answer, OpenAIAnswer):
        big = answer.size_bytes >= OFFLOAD_ANSWER_BYTES
        data = await asyncio.to_thread(answer.result) if big else answer.result()
        usage = TokenUsage.from_openai(answer.usage)
        tool_call = any(c.finish_reason == "tool_calls" for c in answer.choices.values())
    else:
        result = answer.result()
        big = sum(p.size_bytes for p in answer.parts.values()) >= OFFLOAD_ANSWER_BYTES
        data = await asyncio.to_thread(json_bytes, result) if big else json_bytes(result)
        metas = [p.meta_info for p in answer.parts.values()]
        usage = TokenUsage(
            sum(int(m.get("prompt_tokens") or 0) for m in metas),
            sum(int(m.get("completion_tokens") or 0) for m in metas),
            sum(int(m.get("cached_tokens") or 0) for m in metas),
        )
        tool_call = False
    if keeper is not None:
        keeper.finish(rid, tool_call)
    _record_tokens(request, lane, usage)
    return web.Response(body=data, content_type="application/json")


async def _relay_lines(
    request: web.Request, upstream: Any, rid: str, lane: str, keeper: SessionKeeper | None
) -> web.StreamResponse:
    """Copy an upstream SSE stream line by line as it comes."""
    metrics = request.app[state.METRICS]
    response = sse_response(request, upstream.status)
    usage: TokenUsage | None = None
    first = True
    tool_call = False
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
                if keeper is not None:
                    keeper.forget(rid)  # no pause follows a broken answer
                return response
            if first:
                request.app[state.ADMISSION].first_token(rid)
                tracing.first_token(request)
                elapsed = time.monotonic() - request[STARTED]
                metrics.child(metrics.ttft, lane).observe(elapsed)
                first = False
                if keeper is not None:
                    keeper.started(rid)
            if b'"usage"' in line:
                usage = _usage_of(line.strip()[5:]) or usage
            if keeper is not None and b'"finish_reason"' in line:
                tool_call = tool_call or TOOL_CALL_END.search(line) is not None
            await response.write(line)
        await response.write_eof()
    except ConnectionResetError as exc:
        raise _ClientGone() from exc
    if keeper is not None:
        keeper.finish(rid, tool_call and upstream.status == 200)
    _record_tokens(request, lane, usage)
    return response


def _usage_of(data: bytes) -> TokenUsage | None:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return TokenUsage.from_openai(body.get("usage")) if isinstance(body, dict) else None
