"""`/v1/responses`: the OpenAI Responses API, served as a chat completion.

The body is checked (`api.responses.request.refusal`, then its model), translated into the
proxy's own chat request (`api.responses.to_chat`) and checked again as a chat, then
served by the chat endpoint's own path (`edge.chat.serve_chat`: the same limits, QAS
scheduling, the token path, or the engine's chat endpoint and its tool-call parser).
Its answer comes back as a Response object (`to_response`) or, streamed, as the
Responses events: the chat stream's bytes pass through `ChatToResponses` as they are
written (`relay.REWRITER`). Errors name the Responses field (`input`, not `messages`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.api.responses.answer import ResponseIds, to_response
from prism_proxy.api.responses.events import ResponseEvents
from prism_proxy.api.responses.request import ResponsesRequest, refusal
from prism_proxy.api.responses.to_chat import response_param, to_chat
from prism_proxy.edge.admit import new_rid
from prism_proxy.edge.chat import serve_chat
from prism_proxy.edge.errors import ENDPOINT, ApiError, json_answer
from prism_proxy.edge.gateway import Gateway, with_gateway
from prism_proxy.edge.intake import checked_body, engine_size, read_raw, sized_body
from prism_proxy.edge.limits import answer_bytes
from prism_proxy.edge.openai_format import json_bytes
from prism_proxy.edge.relay import OFFLOAD_ANSWER_BYTES, REWRITER


def event_bytes(event: dict[str, Any]) -> bytes:
    """One Responses server-sent event: its type as the SSE event name, then its JSON."""
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + json_bytes(event) + b"\n\n"


class ChatToResponses:
    """A chat stream's bytes (`data:` lines of chat chunks, then `[DONE]`) to the
    Responses events of `ResponseEvents` (a `relay.StreamRewriter`)."""

    def __init__(self, events: ResponseEvents) -> None:
        self.events = events
        self.started = False
        self.pending = b""  # the start of a line not yet complete

    def rewrite(self, data: bytes) -> bytes:
        out: list[dict[str, Any]] = []
        if not self.started:
            self.started = True
            out += self.events.start()
        *lines, self.pending = (self.pending + data).split(b"\n")
        for line in lines:
            out += self._line(line)
        return b"".join(map(event_bytes, out))

    def _line(self, line: bytes) -> list[dict[str, Any]]:
        line = line.strip()
        if not line.startswith(b"data:"):
            return []
        data = line[5:].strip()
        if data == b"[DONE]":
            return self.events.end()
        if not data:
            return []
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return self.events.fail({"message": "the engine sent an invalid chunk"})
        return self.events.feed(chunk) if isinstance(chunk, dict) else []

    def close(self) -> bytes:
        out = self._line(self.pending) if self.pending else []
        self.pending = b""
        return b"".join(map(event_bytes, [*out, *self.events.end()]))


def _renamed(exc: ApiError) -> ApiError:
    """An error about the translated chat, naming the Responses field it came from."""
    param = response_param(exc.param)
    if param == exc.param:
        return exc
    message = exc.message
    if exc.param and message.startswith(exc.param):
        message = str(param) + message[len(exc.param) :]
    return ApiError(exc.status, message, param=param, kind=exc.kind, headers=exc.headers)


def _check_held_answer(gateway: Gateway, chat: ChatCompletionRequest) -> None:
    """A streamed Response keeps its whole answer for its `response.completed` event:
    bounded by `max_answer_bytes`, as an answer the proxy assembles is (400)."""
    limit = gateway.config.max_answer_bytes
    size = answer_bytes(chat.decode_ask(), engine_size(gateway))
    if size > limit:
        raise ApiError(
            400,
            f"max_output_tokens: the answer may reach about {size} bytes, more than this "
            f"deployment's max_answer_bytes ({limit}), and a streamed response keeps all of "
            "it for its response.completed event: ask for fewer tokens",
            param="max_output_tokens",
        )


async def responses(request: web.Request, gateway: Gateway) -> web.StreamResponse:
    request[ENDPOINT] = "responses"
    raw = await read_raw(request, gateway)
    refused = refusal(raw, gateway.config.max_messages)
    if refused is not None:
        raise ApiError(refused.status, refused.message, param=refused.param)
    body = await checked_body(gateway, ResponsesRequest, raw)
    chat_raw = to_chat(body)
    ids = ResponseIds("resp_" + new_rid(), int(time.time()))
    if body.stream:
        request[REWRITER] = ChatToResponses(ResponseEvents(body, ids))
    try:
        chat, size = await sized_body(gateway, ChatCompletionRequest, chat_raw)
        if body.stream:
            _check_held_answer(gateway, chat)
        answer = await serve_chat(request, gateway, chat, chat_raw, size)
    except ApiError as exc:
        raise _renamed(exc) from None
    chat_answer = answer.body if isinstance(answer, web.Response) else None
    if body.stream or answer.status != 200 or not isinstance(chat_answer, bytes):
        return answer  # streamed through the rewriter, or the engine's own error
    if len(chat_answer) >= OFFLOAD_ANSWER_BYTES:
        return await asyncio.to_thread(_response_answer, body, ids, chat_answer)
    return _response_answer(body, ids, chat_answer)


def _response_answer(body: ResponsesRequest, ids: ResponseIds, chat_answer: bytes) -> web.Response:
    return json_answer(to_response(body, ids, orjson.loads(chat_answer)))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/responses", with_gateway(responses))
