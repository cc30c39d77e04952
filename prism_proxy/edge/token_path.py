"""The token path (SPEC §1, §2, §4): `TokenJob` → queued in QAS → released in a wave →
serialized in the released order → backend `/generate` with `input_ids`, `rid`,
`sampling_params` and the anchors in `kv_hints` (`prism_wire.make_kv_hints`) → OpenAI
(or native) response, streamed or assembled.

A client that leaves while queued is withdrawn; one that leaves after its request was
sent triggers `/abort_request`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from aiohttp import web

from prism_proxy.api.costs import PromptSize
from prism_proxy.backend.client import BackendClient
from prism_proxy.backend.errors import BackendError
from prism_proxy.edge import tracing
from prism_proxy.edge.admit import Admitted, off_loop
from prism_proxy.edge.assemble import AnswerTooLarge
from prism_proxy.edge.errors import CLIENT_CLOSED, STATUS, json_answer
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.openai_format import SSE_DONE, ResponseFormat, TokenUsage, sse, stream_error
from prism_proxy.edge.relay import (
    OFFLOAD_ANSWER_BYTES,
    ONE_CHUNK_AFTER_FIRST,
    sse_response,
    too_large,
)
from prism_proxy.prompts.jobs import TokenJob
from prism_proxy.prompts.sharing import prefix_digests, tenant_key


async def token_path(
    request: web.Request,
    gateway: Gateway,
    job: TokenJob,
    *,
    client: str,
    size: PromptSize,
    rid: str,
    sampling_params: dict[str, Any],
    stream: bool,
    fmt: ResponseFormat,
    extra_fields: dict[str, Any] | None = None,
    group: str = "",
) -> web.StreamResponse:
    """Admit, serialize in the released order, stream from the backend's `/generate`.
    `group`: the client's grouping hint (`prompt_cache_key`) for QAS; `client`: the
    caller's `accounts.client_key`.

    The proxy always streams from the backend, also for clients that did not ask to:
    the first chunk is the moment the request stops pending prefill (SPEC §2 pacing).
    Non-streaming clients get the chunks assembled into one response.
    """
    backend = gateway.backend
    limit_bytes = gateway.config.max_answer_bytes
    if not stream:
        sampling_params = {**sampling_params, "stream_interval": ONE_CHUNK_AFTER_FIRST}
    sharing = _Sharing(client, gateway, fmt, extra_fields or {})
    admitted = Admitted(request, gateway, job.queued(rid, time.monotonic(), group), client)
    async with admitted as release:
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
        turn = await gateway.pieces.send(payload, rid, sharing.known, headers)
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
                admitted.first_token(_uncached(first[0]))
                sharing.first_token()
                if stream:
                    response = await _relay_stream(request, admitted, backend, first, batches, fmt)
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
        admitted.finish(TokenUsage.from_meta(fmt.assembled.meta_info))
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
        self, client: str, gateway: Gateway, fmt: ResponseFormat, extra_fields: dict[str, Any]
    ) -> None:
        self.client = client
        self.shared = gateway.sharing
        self.own = gateway.own
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
        client sent before, or this client's own reuse (its answers included). Asked
        only of a prompt long enough to take turns (`PieceSender.send`): the own-prefix
        lookup walks the prompt."""
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


def _uncached(chunk: dict[str, Any]) -> int | None:
    """The prompt tokens the engine did not find cached, as its first chunk says."""
    meta_info = chunk.get("meta_info") or {}
    prompt, cached = meta_info.get("prompt_tokens"), meta_info.get("cached_tokens")
    if isinstance(prompt, int) and isinstance(cached, int):
        return prompt - cached
    return None


async def _relay_stream(
    request: web.Request,
    admitted: Admitted,
    backend: BackendClient,
    first: list[dict[str, Any]],
    batches: AsyncIterator[list[dict[str, Any]]],
    fmt: ResponseFormat,
) -> web.StreamResponse:
    """Relay `/generate` chunks as they come, one write per batch the backend's socket
    delivered (a chunk is never held back for a later one). Headers go out with the
    first chunk, so a backend that fails before answering still gets a proper 502/503
    status; a failure after that ends the stream with an error event."""
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
        backend.abort(admitted.rid)
        request[STATUS] = CLIENT_CLOSED
        return response
    admitted.finish(TokenUsage.from_meta(meta_info) if meta_info else None)
    await response.write_eof()
    return response
