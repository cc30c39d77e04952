"""What the token path (`edge.token_path`) and passthrough (`edge.passthrough`) share
when they relay an answer back: the response a stream is written to and the sizes that
move work off the event loop (an answer's tokens are counted by `admit.Admitted`).

A chat stream may reach its client in another shape: `/v1/responses` sets a
`StreamRewriter` (`REWRITER`) that every write of the stream passes through.
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from prism_proxy.edge.assemble import AnswerTooLarge
from prism_proxy.edge.errors import ApiError

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
# `stream_interval` of a request the proxy assembles: SGLang sends the first token at
# once (the end of its pending prefill), then nothing until the end, so the engine
# never resends a growing answer in every chunk.
ONE_CHUNK_AFTER_FIRST = 1 << 30
# Answers at least this large are encoded in a worker thread.
OFFLOAD_ANSWER_BYTES = 1 << 20


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
