"""A fast SGLang-shaped stub backend for proxy benchmarks.

    python -m bench.stub_backend --port 31000 [--incremental] [--step-ms 10]

It answers at once, with no model: the benchmark then measures what sits between the
client and it (a proxy, a gateway, or nothing). With `--step-ms S` a streamed answer is
paced like a GPU's decode loop: every S ms one shared tick releases the next token of
every open stream (one timer for all streams, so the stub's own cost stays flat).

SGLang's own paths and shapes: `/generate` (streamed cumulative `text`/`output_ids`
like SGLang's default, or deltas with `--incremental` like
`--incremental-streaming-output`), the OpenAI `/v1/chat/completions` and
`/v1/completions` (streamed deltas), `/v1/models`, the info paths a gateway probes
(`/server_info`, `/get_server_info`, `/model_info`, `/get_model_info`, `/loads`),
`/health`, `/health_generate`, `/flush_cache` and `/abort_request`. An answer holds
`max_new_tokens` (or `max_tokens`) tokens, each the text " tok"; chunk bytes are built
once per length and reused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from loadgen.stack.processes import ServerProcess, run_server

MODEL = "stub-model"
TOKEN_TEXT = " tok"
TOKEN_ID = 1000
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
SERVER_INFO = {
    "model_path": MODEL,
    "served_model_name": MODEL,
    "chunked_prefill_size": 8192,
    "max_running_requests": 1024,
    "internal_states": [{"effective_max_running_requests_per_dp": 1024}],
    "version": "0.5.23",
}


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _meta(prompt_tokens: int, done: int, total: int) -> dict[str, Any]:
    finished = done == total
    return {
        "id": "stub",
        "prompt_tokens": prompt_tokens,
        "completion_tokens": done,
        "cached_tokens": 0,
        "finish_reason": {"type": "length", "length": total} if finished else None,
    }


@functools.lru_cache(maxsize=256)
def generate_chunks(total: int, prompt_tokens: int, incremental: bool) -> tuple[bytes, ...]:
    """The SSE events of one streamed `/generate` answer, then `[DONE]`."""
    events = []
    for done in range(1, total + 1):
        text = TOKEN_TEXT if incremental else TOKEN_TEXT * done
        ids = [TOKEN_ID] if incremental else [TOKEN_ID] * done
        events.append(
            _sse({"text": text, "output_ids": ids, "meta_info": _meta(prompt_tokens, done, total)})
        )
    events.append(b"data: [DONE]\n\n")
    return tuple(events)


@functools.lru_cache(maxsize=256)
def openai_chunks(total: int, chat: bool) -> tuple[bytes, ...]:
    """The SSE events of one streamed OpenAI answer (role, deltas, finish, usage)."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def event(choice: dict[str, Any], usage: dict[str, int] | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": "stub",
            "object": kind,
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, **choice}],
        }
        if usage is not None:
            body["usage"] = usage
        return _sse(body)

    def piece(text: str, finish: str | None) -> dict[str, Any]:
        if chat:
            return {"delta": {"content": text}, "finish_reason": finish}
        return {"text": text, "finish_reason": finish}

    events = []
    if chat:
        events.append(event({"delta": {"role": "assistant", "content": ""}, "finish_reason": None}))
    events.extend(event(piece(TOKEN_TEXT, None)) for _ in range(total))
    usage = {"prompt_tokens": 8, "completion_tokens": total, "total_tokens": total + 8}
    events.append(event(piece("", "length"), usage))
    events.append(b"data: [DONE]\n\n")
    return tuple(events)


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    return orjson.loads(raw) if raw else {}


class Ticker:
    """One decode step every `step_s`: `await tick()` returns at the next step."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self._next: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def tick(self) -> None:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._run())
        await asyncio.shield(self._next)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due += self.step_s
            await asyncio.sleep(max(0.0, due - loop.time()))
            current, self._next = self._next, loop.create_future()
            if current is not None:
                current.set_result(None)


async def _stream(request: web.Request, events: tuple[bytes, ...]) -> web.StreamResponse:
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    ticker = request.app[TICKER]
    for event in events:
        if ticker is not None:
            await ticker.tick()
        await response.write(event)
    await response.write_eof()
    return response


async def generate(request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    params = body.get("sampling_params") or {}
    total = max(1, int(params.get("max_new_tokens") or 16))
    ids = body.get("input_ids")
    prompt_tokens = len(ids) if isinstance(ids, list) else len(str(body.get("text", ""))) // 4
    if body.get("stream"):
        incremental = request.app[INCREMENTAL]
        return await _stream(request, generate_chunks(total, prompt_tokens, incremental))
    return web.json_response(
        {
            "text": TOKEN_TEXT * total,
            "output_ids": [TOKEN_ID] * total,
            "meta_info": _meta(prompt_tokens, total, total),
        },
        dumps=lambda o: orjson.dumps(o).decode(),
    )


async def openai(request: web.Request) -> web.StreamResponse:
    chat = request.path.endswith("/chat/completions")
    body = await _body(request)
    total = max(1, int(body.get("max_tokens") or body.get("max_completion_tokens") or 16))
    if body.get("stream"):
        return await _stream(request, openai_chunks(total, chat))
    text = TOKEN_TEXT * total
    choice = (
        {"message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        if chat
        else {"text": text, "finish_reason": "length"}
    )
    return web.json_response(
        {
            "id": "stub",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [{"index": 0, **choice}],
            "usage": {"prompt_tokens": 8, "completion_tokens": total, "total_tokens": total + 8},
        }
    )


def _static(payload: Any) -> Any:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(payload)

    return handler


async def health(request: web.Request) -> web.Response:
    return web.Response(text="")


INCREMENTAL = web.AppKey("incremental", bool)
TICKER = web.AppKey("ticker", Ticker | None)


def run_stub(
    log_dir: Path, *, incremental: bool = False, step_ms: float = 0.0, name: str = "stub"
) -> contextlib.AbstractContextManager[ServerProcess]:
    """The stub as a server process for a benchmark (`loadgen.stack.processes.run_server`)."""
    args = ["--incremental"] if incremental else []
    if step_ms:
        args += ["--step-ms", f"{step_ms:g}"]
    return run_server("bench.stub_backend", args, log_dir=log_dir, name=name)


def create_app(incremental: bool = False, step_ms: float = 0.0) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[INCREMENTAL] = incremental
    app[TICKER] = Ticker(step_ms / 1000.0) if step_ms > 0 else None
    models = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "sglang"}]}
    model_info = {"model_path": MODEL, "is_generation": True, "tokenizer_path": MODEL}
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/chat/completions", openai)
    app.router.add_post("/v1/completions", openai)
    app.router.add_get("/v1/models", _static(models))
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, _static(SERVER_INFO))
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, _static(model_info))
    for path in ("/loads", "/v1/loads"):
        app.router.add_get(path, _static({"loads": [{"dp_rank": 0, "num_reqs": 0}]}))
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, health)
    app.router.add_post("/flush_cache", health)
    app.router.add_get("/flush_cache", health)
    app.router.add_post("/abort_request", health)
    app.router.add_get("/version", _static({"version": "0.5.23"}))
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=31000)
    parser.add_argument("--incremental", action="store_true", help="stream /generate deltas")
    parser.add_argument("--step-ms", type=float, default=0.0, help="decode step (0: no pacing)")
    args = parser.parse_args(argv)
    import uvloop

    web.run_app(
        create_app(args.incremental, args.step_ms),
        host=args.host,
        port=args.port,
        loop=uvloop.new_event_loop(),
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
