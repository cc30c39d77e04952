"""OpenAI-compatible endpoints of the simulated engine, as SGLang 0.5.23 serves them.

`usage.prompt_tokens_details.cached_tokens` is always reported (SGLang does so with
`--enable-cache-report`). Streams send deltas, an optional usage chunk
(`stream_options.include_usage`), then `data: [DONE]`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from prism_sim.api_models import ChatCompletionIn, CompletionIn
from prism_sim.engine import RequestHandle, SimEngine
from prism_sim.http_common import (
    ENGINE_KEY,
    BadRequest,
    check_token_ids,
    encode,
    error_response,
    finish_reason_name,
    open_sse,
    parse_body,
    send_sse,
    start_request,
)
from prism_sim.request import SimRequest

BodyT = TypeVar("BodyT", CompletionIn, ChatCompletionIn)


def _usage(req: SimRequest) -> dict[str, Any]:
    return {
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(req.output_ids),
        "total_tokens": len(req.input_ids) + len(req.output_ids),
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }


async def _serve(
    request: web.Request,
    engine: SimEngine,
    handle: RequestHandle,
    *,
    stream: bool,
    include_usage: bool,
    chat: bool,
    model: str,
) -> web.StreamResponse:
    created = int(time.time())
    prefix = "chatcmpl-" if chat else "cmpl-"
    ident = prefix + handle.req.rid
    base = {"id": ident, "created": created, "model": model}
    try:
        if not stream:
            req = await handle.wait()
            text = engine.decode(req.output_ids)
            if chat:
                message = {"role": "assistant", "content": text, "reasoning_content": None,
                           "tool_calls": None}  # fmt: skip
                choice: dict[str, Any] = {"index": 0, "message": message}
            else:
                choice = {"index": 0, "text": text, "logprobs": None}
            choice.update(finish_reason=finish_reason_name(req), matched_stop=None)
            obj = "chat.completion" if chat else "text_completion"
            return web.json_response(
                {**base, "object": obj, "choices": [choice], "usage": _usage(handle.req)}
            )
        response = await open_sse(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        sent = ""
        if chat:
            first = {"index": 0, "delta": {"role": "assistant", "content": ""},
                     "logprobs": None, "finish_reason": None}  # fmt: skip
            await send_sse(response, {**base, "object": obj, "choices": [first]})
        async for req in handle.progress():
            text = engine.decode(req.output_ids)
            delta, sent = text[len(sent) :], text
            reason = finish_reason_name(req)
            if chat:
                choice = {"index": 0, "delta": {"content": delta}, "logprobs": None}
            else:
                choice = {"index": 0, "text": delta, "logprobs": None}
            choice["finish_reason"] = reason
            if reason is not None:
                choice["matched_stop"] = None
            await send_sse(response, {**base, "object": obj, "choices": [choice]})
        if include_usage:
            usage_chunk = {**base, "object": obj, "choices": [], "usage": _usage(handle.req)}
            await send_sse(response, usage_chunk)
        await send_sse(response, "[DONE]")
        await response.write_eof()
        return response
    finally:
        handle.abort()


async def _completion_prompt(engine: SimEngine, body: CompletionIn) -> tuple[list[int], int | None]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return await encode(engine, prompt), body.max_tokens
    if prompt and all(isinstance(x, int) for x in prompt):
        return check_token_ids(engine, [int(x) for x in prompt]), body.max_tokens
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return await encode(engine, prompt[0]), body.max_tokens
    raise BadRequest("prompt must be a string, one string or a list of token ids")


def _content_text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(str(part.get("text", "")) for part in content if part.get("type") == "text")


async def _chat_prompt(engine: SimEngine, body: ChatCompletionIn) -> tuple[list[int], int | None]:
    messages = [{"role": m.role, "content": _content_text(m.content)} for m in body.messages]
    try:
        text = engine.tokenizer.render_chat(messages, add_generation_prompt=True)
    except ValueError as exc:
        raise BadRequest(f"chat template failed: {exc}") from None
    return await encode(engine, text), body.max_completion_tokens or body.max_tokens


async def _complete(
    request: web.Request,
    model: type[BodyT],
    prompt_of: Callable[[SimEngine, BodyT], Awaitable[tuple[list[int], int | None]]],
    *,
    chat: bool,
) -> web.StreamResponse:
    """Parse the body, queue its prompt (`prompt_of` gives the ids and max tokens), serve."""
    engine = request.app[ENGINE_KEY]
    try:
        body = await parse_body(request, model)
        ids, max_tokens = await prompt_of(engine, body)
        handle = start_request(
            engine,
            ids,
            max_tokens,
            field="max_tokens",
            rid=body.rid,
            priority=body.priority,
            stream=body.stream,
        )
    except BadRequest as exc:
        return error_response(str(exc))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    # As SGLang: the answer names the model the request named.
    model_name = body.model or engine.model_name
    return await _serve(
        request,
        engine,
        handle,
        stream=body.stream,
        include_usage=include_usage,
        chat=chat,
        model=model_name,
    )


async def completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, CompletionIn, _completion_prompt, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, ChatCompletionIn, _chat_prompt, chat=True)


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    card = {
        "id": engine.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": engine.model_path,
        "max_model_len": engine.profile.context_length,
    }
    return web.json_response({"object": "list", "data": [card]})
