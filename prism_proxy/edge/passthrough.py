"""Passthrough (SPEC §2, §4): what the token path cannot serve is admitted the same way,
then sent unchanged (minus `prism`) to the backend's own endpoint and relayed line by
line, or, for a client that did not ask to stream, streamed from the engine anyway and
assembled into one answer (`edge.assemble`). Every OpenAI stream asks the engine for its
usage: a streamed client that did not ask for it is not sent it (`_ask_usage`).

A client that leaves while queued is withdrawn; one that leaves after its request was
sent triggers `/abort_request`.

With the session features on, a chat with tools (passthrough with turns) is followed by
the proxy's `SessionKeeper` through its admission (`admit.Admitted`): when it arrives,
from which client (`accounts.client_key`: what a client's sessions earn is its own),
when its first chunk comes back, when it becomes a tool call, and how it ended: in a
tool call (the session pauses, and DART keeps it if its account earned that) or not. A
continuation of a paused session is queued with its program's start.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from prism_proxy.backend.errors import BackendError
from prism_proxy.edge import tracing
from prism_proxy.edge.admit import Admitted, new_rid
from prism_proxy.edge.assemble import AnswerTooLarge, GenerateAnswer, OpenAIAnswer
from prism_proxy.edge.errors import CLIENT_CLOSED, STATUS
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.openai_format import SSE_DONE, TokenUsage, json_bytes, sse, stream_error
from prism_proxy.edge.relay import (
    OFFLOAD_ANSWER_BYTES,
    ONE_CHUNK_AFTER_FIRST,
    sse_response,
    too_large,
)
from prism_proxy.prompts.conversation import dispatch_check
from prism_proxy.prompts.jobs import TokenJob
from prism_proxy.prompts.sharing import tenant_key
from prism_proxy.qas.types import QueuedRequest
from prism_wire import CUSTOM_PARAMS_KEY, make_kv_hints

# Lines of a stream at least this long are parsed in a worker thread.
OFFLOAD_LINE_BYTES = 256 * 1024
# Fields SGLang's OpenAI endpoints refuse to stream: such a request is forwarded as it
# is, and its first token cannot be seen (so it never holds a place in prefill pacing).
UNSTREAMABLE = ("return_meta_info", "return_prompt_token_ids", "return_token_ids")
# An OpenAI chunk or answer that ends in a tool call (SGLang writes no space; others may).
TOOL_CALL_END = re.compile(rb'"finish_reason"\s*:\s*"tool_calls"')
# A tool call's function name in an answer's JSON (inside a string, such as a call's
# arguments, the quotes are escaped and do not match). Bounded: the session keeper
# learns return delays per tool (`admission.returns`), so only a few short names count.
TOOL_NAME = re.compile(rb'"name"\s*:\s*"([A-Za-z0-9_.:-]{1,64})"')
MAX_TOOL_NAMES = 8
# The last chunk of one of a `/generate` stream's answers: its `meta_info` ends the
# answer with a finish reason object (before, `"finish_reason": null`), and holds the
# answer's prompt, completion and cached tokens.
GENERATE_END = re.compile(rb'"finish_reason"\s*:\s*\{')


def tool_names(data: bytes, known: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`known` and the tool names in `data` (an answer, or one line of its stream)."""
    if b'"tool_calls"' not in data:
        return known
    names = list(known)
    for match in TOOL_NAME.finditer(data):
        name = match.group(1).decode()
        if name not in names and len(names) < MAX_TOOL_NAMES:
            names.append(name)
    return tuple(names)


def _called(answer: OpenAIAnswer) -> tuple[str, ...]:
    """The tool names an assembled answer has called so far (as `tool_names` bounds them)."""
    return tuple(
        str(call["name"])[:64]
        for choice in answer.choices.values()
        for call in choice.calls.values()
        if call.get("name")
    )[:MAX_TOOL_NAMES]


class _ClientGone(Exception):
    """The client's connection broke while we relayed; not a backend failure.

    (aiohttp's ClientConnectionResetError is also a ClientConnectionError, which the
    backend client would otherwise take for a backend failure.)"""


async def passthrough(
    request: web.Request,
    gateway: Gateway,
    client: str,
    path: str,
    body: dict[str, Any],
    *,
    set_rid: bool,
    job: TokenJob | None = None,
    group: str = "",
) -> web.StreamResponse:
    """Admit, then send `body` (the request's checked, served fields: its `forwarded`)
    to the backend's `path`, with a rid of the proxy's own when `set_rid`. The request
    counts as pending prefill until the backend's first body byte (SPEC §2). `client`:
    the caller's `accounts.client_key`.

    With a `job` (the turns the proxy found in a chat that the engine renders itself),
    QAS schedules its skeleton and the anchors ride in `custom_params`, with the
    `anchor_check` of the proxy's rendering: the engine places them only on a prompt
    that matches."""
    rid = new_rid() if set_rid else None
    if rid is not None:
        body["rid"] = rid
    # the engine renders or tokenizes it: the proxy cannot name its prefixes, so it is
    # matched only against its own client's requests (`prompts.sharing`)
    body["extra_key"] = tenant_key(client, body.get("extra_key"))
    arrival = time.monotonic()
    # agent sessions: chats that offer tools, whose answers may end in a tool call
    keeper = gateway.sessions if job is not None and body.get("tools") else None
    if job is None:
        queued = QueuedRequest(rid=rid or new_rid(), arrival=arrival, group=group)
    else:
        queued = job.queued(rid or new_rid(), arrival, group)
    backend = gateway.backend
    limit_bytes = gateway.config.max_answer_bytes
    streams = bool(body.get("stream"))
    answer = _assembly(path, body, limit_bytes)
    hide_usage = streams and _ask_usage(path, body)
    lane = None if job else "passthrough"
    admitted = Admitted(request, gateway, queued, client, lane=lane, keeper=keeper, job=job)
    async with admitted as release:
        if job is not None:
            dispatch = job.build(release.skeleton)
            hints = make_kv_hints(
                dispatch.anchors,
                release.priorities,
                message_id=admitted.rid,
                check=dispatch_check(dispatch),
            )
            body["custom_params"] = {CUSTOM_PARAMS_KEY: orjson.dumps(hints).decode()}
        if answer is None and not streams:
            admitted.unseen_first_token()  # it takes no place in prefill pacing
        try:
            async with backend.forward(path, body, tracing.engine_headers(request)) as upstream:
                if upstream.content_type.startswith("text/event-stream"):
                    if answer is not None:
                        return await _assemble_lines(gateway, upstream, answer, admitted)
                    return await _relay_lines(
                        request,
                        gateway,
                        upstream,
                        admitted,
                        hide_usage=hide_usage,
                        generate=path == "/generate",
                    )
                data = await _read_bounded(upstream, limit_bytes, rid, backend)
                admitted.first_token(timed=False)
                called = (
                    admitted.sessions
                    and upstream.status == 200
                    and TOOL_CALL_END.search(data) is not None
                )
                admitted.finish(_usage_of(data), called, tool_names(data) if called else ())
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


def _ask_usage(path: str, body: dict[str, Any]) -> bool:
    """Ask the engine for a streamed OpenAI answer's usage when its client did not;
    True when asked so (the usage chunk is then not relayed). The answer's tokens are
    what its client is charged (tokens per minute), what the token metrics count, and,
    for a chat the engine renders, the only word of its cache that prefill pacing gets
    (`Admitted.finish`): without them a client streaming without usage would go
    uncharged."""
    if not path.endswith("completions"):
        return False
    options = body.get("stream_options")
    options = options if isinstance(options, dict) else {}
    if options.get("include_usage"):
        return False
    body["stream_options"] = {**options, "include_usage": True}
    return True


def _usage_chunk(chunk: Any) -> TokenUsage | None:
    """The usage an OpenAI stream's chunk carries (the last chunk with `include_usage`,
    which has no choices; every chunk with `continuous_usage_stats`)."""
    return TokenUsage.from_openai(chunk.get("usage")) if isinstance(chunk, dict) else None


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
    gateway: Gateway,
    upstream: Any,
    answer: OpenAIAnswer | GenerateAnswer,
    admitted: Admitted,
) -> web.Response:
    """A stream the client did not ask for, assembled into one answer: the first object
    ends the request's pending prefill."""
    backend = gateway.backend
    rid = admitted.rid
    first = True
    # the answer the keeper watches until it becomes a tool call
    watched = answer if admitted.sessions and isinstance(answer, OpenAIAnswer) else None
    try:
        async for chunk in _sse_objects(upstream, rid, backend):
            if first:
                admitted.first_token()
                first = False
            answer.feed(chunk)
            if watched is not None:
                names = _called(watched)
                if names:
                    admitted.tool_call(names)
                    watched = None
    except AnswerTooLarge as exc:
        backend.abort(rid)
        raise too_large(exc) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise BackendError(502, f"backend stream broke: {type(exc).__name__}") from None
    if isinstance(answer, OpenAIAnswer):
        big = answer.size_bytes >= OFFLOAD_ANSWER_BYTES
        data = await asyncio.to_thread(answer.result) if big else answer.result()
        usage = TokenUsage.from_openai(answer.usage)
        tool_call = any(c.finish_reason == "tool_calls" for c in answer.choices.values())
        names = _called(answer)
    else:
        result = answer.result()
        big = sum(p.size_bytes for p in answer.parts.values()) >= OFFLOAD_ANSWER_BYTES
        data = await asyncio.to_thread(json_bytes, result) if big else json_bytes(result)
        usage = TokenUsage.from_metas(p.meta_info for p in answer.parts.values())
        tool_call, names = False, ()
    admitted.finish(usage, tool_call, names)
    return web.Response(body=data, content_type="application/json")


async def _relay_lines(
    request: web.Request,
    gateway: Gateway,
    upstream: Any,
    admitted: Admitted,
    *,
    hide_usage: bool = False,
    generate: bool = False,
) -> web.StreamResponse:
    """Copy an upstream SSE stream line by line as it comes; with `hide_usage`, all but
    the usage chunk (and its blank line) that the proxy asked for and its client did not.
    The answer's usage: an OpenAI stream's usage chunk; on `/generate` (`generate`) the
    sum of each answer's last `meta_info` (a batch, or `n`)."""
    response = sse_response(request, upstream.status)
    usage: TokenUsage | None = None
    sessions = admitted.sessions
    first = True
    hidden = False  # the line before was the usage chunk, not relayed
    ended: list[dict[str, Any]] = []  # on /generate: each answer's last meta_info
    tool_call = False
    names: tuple[str, ...] = ()  # the tools called (`tool_names`), with sessions on
    lines = aiter(upstream.content)
    try:
        await response.prepare(request)
        while True:
            try:
                line = await anext(lines)
            except StopAsyncIteration:
                break
            except (aiohttp.ClientError, TimeoutError) as exc:
                # Headers are out: end the stream with an error event (the block's
                # exit without a finish tells the keeper no pause follows).
                request[STATUS] = 502
                message = f"backend stream broke: {exc!r}"
                await response.write(sse(stream_error(message, 502)) + SSE_DONE)
                return response
            if first:
                admitted.first_token()
                first = False
            if hidden:
                hidden = False
                if not line.strip():
                    continue
            if generate:
                if GENERATE_END.search(line):
                    chunk = _json_of(line.strip()[5:])
                    meta = chunk.get("meta_info") if isinstance(chunk, dict) else None
                    if isinstance(meta, dict):
                        ended.append(meta)
            elif b'"usage"' in line and b'"usage":null' not in line:  # SGLang's chunks
                chunk = _json_of(line.strip()[5:])
                found = _usage_chunk(chunk)
                usage = found or usage
                if hide_usage and found is not None and chunk.get("choices") == []:
                    hidden = True
                    continue
            if sessions:
                seen, names = names, tool_names(line, names)
                if names and not seen:
                    admitted.tool_call(names)
                if b'"finish_reason"' in line:
                    tool_call = tool_call or TOOL_CALL_END.search(line) is not None
            await response.write(line)
        await response.write_eof()
    except ConnectionResetError as exc:
        raise _ClientGone() from exc
    if generate:
        usage = TokenUsage.from_metas(ended)
    admitted.finish(usage, tool_call and upstream.status == 200, names)
    return response


def _json_of(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _usage_of(data: bytes) -> TokenUsage | None:
    return _usage_chunk(_json_of(data))
