"""OpenAI-compatible endpoints of the simulated engine, as SGLang 0.5.23 serves them.

`usage.prompt_tokens_details.cached_tokens` is always reported (SGLang does so with
`--enable-cache-report`). Streams send deltas, an optional usage chunk
(`stream_options.include_usage`), then `data: [DONE]`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from prism_sim.api_models import ChatCompletionIn, CompletionIn
from prism_sim.engine import RequestHandle, SimEngine
from prism_sim.http_common import (
    ENGINE_KEY,
    BadRequest,
    IncrementalText,
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
from prism_sim.tool_calls import (
    ForcedCall,
    call_id,
    forced_call,
    message_text,
    tool_call_json,
)
from prism_tokens.chat import content_format, template_messages, template_tools
from prism_tokens.tokenizer import Tokenizer

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
    call: ForcedCall | None = None,
) -> web.StreamResponse:
    created = int(time.time())
    prefix = "chatcmpl-" if chat else "cmpl-"
    ident = prefix + handle.req.rid
    base = {"id": ident, "created": created, "model": model}
    try:
        if not stream:
            req = await handle.wait()
            text = engine.decode(req.output_ids)
            reason = finish_reason_name(req)
            if chat:
                message = {"role": "assistant", "content": text, "reasoning_content": None,
                           "tool_calls": None}  # fmt: skip
                if call is not None and reason == "stop":
                    # the array parsed; cut short ("length", "abort") it would not, and
                    # SGLang answers with the text as content
                    message.update(content="", tool_calls=[tool_call_json(call, call_id())])
                    reason = "tool_calls"
                choice: dict[str, Any] = {"index": 0, "message": message}
            else:
                choice = {"index": 0, "text": text, "logprobs": None}
            choice.update(finish_reason=reason, matched_stop=None)
            obj = "chat.completion" if chat else "text_completion"
            return web.json_response(
                {**base, "object": obj, "choices": [choice], "usage": _usage(handle.req)}
            )
        response = await open_sse(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        base["object"] = obj
        if chat:
            # As SGLang's chat stream: its first chunk (the role) comes with the engine's
            # first output, after the prefill, not when the stream opens (a proxy counts
            # the request as pending prefill until that first line).
            async with contextlib.aclosing(handle.progress()) as progress:
                await anext(progress, None)
            first = {"index": 0, "delta": {"role": "assistant", "content": ""},
                     "logprobs": None, "finish_reason": None}  # fmt: skip
            await send_sse(response, {**base, "choices": [first]})
        if call is None:
            await _stream_text(response, base, handle, engine, chat=chat)
        else:
            await _stream_call(response, base, handle, engine, call)
        if include_usage:
            usage_chunk = {**base, "choices": [], "usage": _usage(handle.req)}
            await send_sse(response, usage_chunk)
        await send_sse(response, "[DONE]")
        await response.write_eof()
        return response
    finally:
        handle.abort()


async def _stream_text(
    response: web.StreamResponse,
    base: dict[str, Any],
    handle: RequestHandle,
    engine: SimEngine,
    *,
    chat: bool,
) -> None:
    """One chunk per generated token; the last one carries the finish reason."""
    text = IncrementalText(engine.decode)
    async for req in handle.progress():
        reason = finish_reason_name(req)
        delta = text.delta(req.output_ids, final=reason is not None)
        if chat:
            choice = {"index": 0, "delta": {"content": delta}, "logprobs": None}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None}
        choice["finish_reason"] = reason
        if reason is not None:
            choice["matched_stop"] = None
        await send_sse(response, {**base, "choices": [choice]})


async def _stream_call(
    response: web.StreamResponse,
    base: dict[str, Any],
    handle: RequestHandle,
    engine: SimEngine,
    call: ForcedCall,
) -> None:
    """A forced call's chunks as SGLang streams them (`JsonArrayParser`): the call's id
    and name once the generated text holds the name, its arguments once the array is
    complete, then a chunk with only the finish reason ("tool_calls" after a parsed
    call)."""

    def delta(**fields: Any) -> dict[str, Any]:
        message = {"role": None, "content": None, "reasoning_content": None, **fields}
        choice = {"index": 0, "delta": message, "logprobs": None, "finish_reason": None,
                  "matched_stop": None}  # fmt: skip
        return {**base, "choices": [choice], "usage": None}

    ident, named, reason = call_id(), False, None
    async for req in handle.progress():
        reason = finish_reason_name(req)
        if not named and len(engine.decode(req.output_ids)) >= call.name_end:
            named = True
            await send_sse(
                response, delta(tool_calls=[tool_call_json(call, ident, arguments=False)])
            )
        if reason == "stop":
            await send_sse(response, delta(tool_calls=[tool_call_json(call, None, name=False)]))
            reason = "tool_calls"
    final = {"index": 0, "delta": {"reasoning_content": None}, "logprobs": None,
             "finish_reason": reason, "matched_stop": None}  # fmt: skip
    await send_sse(response, {**base, "choices": [final]})


async def _completion_prompt(engine: SimEngine, body: CompletionIn) -> tuple[list[int], int | None]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return await encode(engine, prompt), body.max_tokens
    if prompt and all(isinstance(x, int) for x in prompt):
        return check_token_ids(engine, [int(x) for x in prompt]), body.max_tokens
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return await encode(engine, prompt[0]), body.max_tokens
    raise BadRequest("prompt must be a string, one string or a list of token ids")


def chat_text(
    tokenizer: Tokenizer, raw: dict[str, Any], add_generation_prompt: bool | None = None
) -> str:
    """A chat body's prompt as SGLang's endpoint renders it: the template given SGLang's
    message and tool dumps (`prism_tokens.chat`), so tools and tool calls render too.
    `add_generation_prompt` None: as a chat completion, which opens the assistant's turn
    and, like SGLang, makes a last assistant message with text content a user one."""
    try:
        fmt = content_format(tokenizer.chat_template)
        messages = template_messages(raw.get("messages") or [], fmt, final_assistant=True)
        if add_generation_prompt is None:
            add_generation_prompt = True
            last = messages[-1] if messages else {}
            if last.get("role") == "assistant" and isinstance(last.get("content"), str):
                messages[-1] = {"role": "user", "content": last["content"]}
        tools = template_tools(raw.get("tools"), raw.get("tool_choice"))
        return tokenizer.render_chat(
            messages, add_generation_prompt=add_generation_prompt, tools=tools
        )
    except ValueError as exc:
        raise BadRequest(f"chat template failed: {exc}") from None


async def _chat_prompt(engine: SimEngine, body: ChatCompletionIn) -> tuple[list[int], int | None]:
    text = chat_text(engine.tokenizer, body.raw)
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
        call, script = None, None
        if isinstance(body, ChatCompletionIn):
            try:
                context = message_text(body.messages[-1].content)
                call = forced_call(body.tools, body.tool_choice, context)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        stop = engine.tokenizer.eos_token_id
        if call is not None:
            # the call's tokens, then the stop token that ends a constrained answer
            script = engine.tokenizer.encode(call.text) + ([] if stop is None else [stop])
        elif chat and engine.config.answer_text:  # a brief answer (`SimConfig.answer_text`)
            answer = engine.tokenizer.encode(engine.config.answer_text, False)
            script = answer + ([] if stop is None else [stop])
        ids, max_tokens = await prompt_of(engine, body)
        handle = start_request(
            engine,
            ids,
            max_tokens,
            field="max_tokens",
            rid=body.rid,
            priority=body.priority,
            stream=body.stream,
            output_script=script,
            custom_params=body.custom_params if isinstance(body, ChatCompletionIn) else None,
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
        call=call,
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
