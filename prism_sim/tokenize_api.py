"""`/v1/tokenize` and `/v1/detokenize` (and their unversioned names), as SGLang 0.5.23
serves them (`serving_tokenize.py`), over the simulated engine's tokenizer.

Tokenize: `{"prompt": str | [str], "add_special_tokens"}` → the ids of each text (with
the tokenizer's special tokens unless `add_special_tokens` is false); `{"messages",
"tools", "tool_choice"}` → the ids of the chat as a chat completion renders it (no
special tokens added), or, with `add_generation_prompt` given, rendered with it and
encoded with `add_special_tokens` only when the body sets it. Answer `{"tokens",
"count", "max_model_len"}`. Detokenize: `{"tokens": [int] | [[int]],
"skip_special_tokens"}` → `{"text"}`. The proxy asks these to check that its tokenizer
is the engine's (`prism_tokens.verify`); tests/sglang/test_live_tokenizer.py holds them
against SGLang's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from prism_sim.api_models import DetokenizeIn, TokenizeIn
from prism_sim.http_common import ENGINE_KEY, OFFLOAD_CHARS, BadRequest, error_response, parse_body
from prism_sim.openai_api import chat_text
from prism_tokens.tokenizer import Tokenizer


async def _encode(tokenizer: Tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    if len(text) >= OFFLOAD_CHARS:
        return await asyncio.to_thread(tokenizer.encode, text, add_special_tokens)
    return tokenizer.encode(text, add_special_tokens)


async def _chat_ids(tokenizer: Tokenizer, body: TokenizeIn) -> list[int]:
    if not body.messages:
        raise BadRequest("Messages cannot be empty.")
    if body.continue_final_message:
        raise BadRequest("continue_final_message: not served by the simulated engine")
    text = chat_text(tokenizer, body.raw, body.add_generation_prompt)
    if body.add_generation_prompt is None:  # as a chat completion
        return await _encode(tokenizer, text, False)
    add_special = "add_special_tokens" in body.model_fields_set and body.add_special_tokens
    return await _encode(tokenizer, text, add_special)


async def tokenize(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    tokenizer = engine.tokenizer
    try:
        body = await parse_body(request, TokenizeIn)
        tokens: list[int] | list[list[int]]
        count: int | list[int]
        if body.messages is not None:
            tokens = await _chat_ids(tokenizer, body)
            count = len(tokens)
        elif isinstance(body.prompt, str):
            tokens = await _encode(tokenizer, body.prompt, body.add_special_tokens)
            count = len(tokens)
        else:
            prompts = body.prompt or []
            tokens = [await _encode(tokenizer, text, body.add_special_tokens) for text in prompts]
            count = [len(ids) for ids in tokens]
    except BadRequest as exc:
        return error_response(str(exc))
    answer = {"tokens": tokens, "count": count, "max_model_len": engine.profile.context_length}
    return web.json_response(answer)


async def detokenize(request: web.Request) -> web.Response:
    tokenizer = request.app[ENGINE_KEY].tokenizer
    try:
        body = await parse_body(request, DetokenizeIn)
    except BadRequest as exc:
        return error_response(str(exc))
    skip = body.skip_special_tokens
    text: Any
    try:
        if not body.tokens:
            text = ""
        elif isinstance(body.tokens[0], int):
            text = tokenizer.decode(body.tokens, skip_special_tokens=skip)  # type: ignore[arg-type]
        else:
            lists: list[list[int]] = body.tokens  # type: ignore[assignment]
            text = [tokenizer.decode(ids, skip_special_tokens=skip) for ids in lists]
    except OverflowError as exc:  # a negative id: SGLang's tokenizer fails the same way
        message = f"Internal server error during detokenization: {exc}"
        return error_response(message, status=500)
    return web.json_response({"text": text})


def add_routes(app: web.Application) -> None:
    for prefix in ("/v1", ""):
        app.router.add_post(prefix + "/tokenize", tokenize)
        app.router.add_post(prefix + "/detokenize", detokenize)
