"""Helpers shared by the simulated engine's HTTP handlers: app keys, bodies, SSE."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from prism_sim.api_models import DEFAULT_MAX_NEW_TOKENS
from prism_sim.engine import RequestHandle, SimEngine
from prism_sim.request import SimRequest

ENGINE_KEY = web.AppKey("prism_sim_engine", SimEngine)
ModelT = TypeVar("ModelT", bound=BaseModel)


def error_response(message: str, status: int = 400) -> web.Response:
    """SGLang's error body: `{"error": {"message": ..., "code": status}}`."""
    body = {"error": {"message": message, "type": "BadRequestError", "code": status}}
    return web.json_response(body, status=status)


class BadRequest(Exception):
    """Raised by `parse_body`; the handler answers 400 with the message."""


async def parse_body(request: web.Request, model: type[ModelT]) -> ModelT:
    """Strict JSON (orjson: no lone surrogates, no NaN, nesting <= 1024) into `model`."""
    try:
        raw = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise BadRequest(str(exc)) from None


# Prompt texts at least this long are tokenized in a worker thread (the tokenizer
# releases the GIL for long texts): a large prompt does not stall the engine's loop.
OFFLOAD_CHARS = 32_768


async def encode(engine: SimEngine, text: str) -> list[int]:
    if len(text) >= OFFLOAD_CHARS:
        return await asyncio.to_thread(engine.tokenizer.encode, text)
    return engine.tokenizer.encode(text)


def check_token_ids(engine: SimEngine, ids: list[int]) -> list[int]:
    """SGLang's model would index its embedding with these: 0 <= id < vocab size."""
    vocab_size = engine.tokenizer.vocab_size
    for index, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise BadRequest(
                f"input_ids[{index}]: token id {token} is outside the vocabulary [0, {vocab_size})"
            )
    return ids


def start_request(
    engine: SimEngine, ids: list[int], max_new_tokens: int | None, *, field: str, **kwargs: Any
) -> RequestHandle:
    """`engine.start` for a handler: SGLang's default length when `max_new_tokens` is
    None, `BadRequest` for what the engine refuses (`field` names the length in the
    message), 503 once the engine loop has crashed."""
    max_new = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
    if max_new < 1:
        raise BadRequest(f"{field} must be at least 1 in the simulated engine")
    try:
        return engine.start(ids, max_new, **kwargs)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    except RuntimeError as exc:  # the engine loop crashed
        raise web.HTTPServiceUnavailable(text=str(exc)) from None


class IncrementalText:
    """A growing list of output ids to text, a few ids at a time, as SGLang's
    detokenizer does (`DetokenizerManager`: decode from a read offset with a little
    context before it, hold back an incomplete character): a stream costs the
    tokenizer linear time, not quadratic. `text` is the whole decoded so far."""

    def __init__(self, decode: Any) -> None:
        self._decode = decode
        self._prefix = 0
        self._read = 0
        self.text = ""

    def delta(self, ids: list[int], final: bool = False) -> str:
        """The text the ids added since the last call (empty while a character is
        incomplete, unless `final`)."""
        if len(ids) == self._read and not final:
            return ""
        window = self._decode(ids[self._prefix :])
        before = self._decode(ids[self._prefix : self._read]) if self._read > self._prefix else ""
        if window.endswith("\ufffd") and not final:
            return ""
        piece = window[len(before) :] if window.startswith(before) else window
        self._prefix, self._read = self._read, len(ids)
        self.text += piece
        return piece


async def open_sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    return response


async def send_sse(response: web.StreamResponse, payload: Any) -> None:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    await response.write(f"data: {data}\n\n".encode())


def finish_reason_name(req: SimRequest) -> str | None:
    """OpenAI's `finish_reason` string for a finished request."""
    if req.finish_reason is None:
        return None
    kind = str(req.finish_reason.get("type"))
    return {"length": "length", "stop": "stop", "abort": "abort"}.get(kind, kind)
