"""A streamed chat answer as the Responses API's events (`ResponseEvents`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from prism_proxy.api.responses.answer import (
    ResponseIds,
    call_item,
    message_item,
    response_object,
    response_status,
    response_usage,
)
from prism_proxy.api.responses.request import (
    ResponsesRequest,
)


@dataclass(slots=True)
class _OpenItem:
    """An output item being streamed: a message's text, or a function call."""

    index: int
    item_id: str
    kind: Literal["message", "function_call"]
    call_id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.parts)


class ResponseEvents:
    """A chat completion's stream chunks, fed in order, to the Responses events the
    OpenAI SDK and the Agents SDK read: `response.created` and `response.in_progress`
    first; per output item `response.output_item.added`, its deltas
    (`response.output_text.delta` in a `content_part`, or
    `response.function_call_arguments.delta`); at the end each item's `.done` events and
    `response.output_item.done`, then `response.completed` (`response.incomplete` when
    cut by `max_output_tokens`) with the whole Response, or an `error` event when the
    chat stream failed. Items stay open until the end, so deltas of several tool calls
    may interleave. Each event carries its `sequence_number`."""

    def __init__(self, body: ResponsesRequest, ids: ResponseIds) -> None:
        self.body = body
        self.ids = ids
        self.sequence = 0
        self.items: list[_OpenItem] = []  # in output order
        self.message: _OpenItem | None = None  # the text being streamed
        self.calls: dict[int, _OpenItem] = {}  # by the chat's tool-call index
        self.finish_reason: Any = None
        self.usage: dict[str, Any] | None = None
        self.ended = False

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        snapshot = response_object(self.body, self.ids, output=[], status="in_progress", usage=None)
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def _open(self, kind: Literal["message", "function_call"], **fields: Any) -> _OpenItem:
        index = len(self.items)
        prefix = "msg" if kind == "message" else "fc"
        item = _OpenItem(index, self.ids.item(prefix, index), kind, **fields)
        self.items.append(item)
        return item

    def _added(self, item: _OpenItem) -> list[dict[str, Any]]:
        if item.kind == "message":
            added = message_item(item.item_id, "", "in_progress")
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            return [
                self._event("response.output_item.added", output_index=item.index, item=added),
                self._event(
                    "response.content_part.added",
                    item_id=item.item_id, output_index=item.index, content_index=0, part=part,
                ),
            ]  # fmt: skip
        added = call_item(item.item_id, item.call_id, item.name, "", "in_progress")
        return [self._event("response.output_item.added", output_index=item.index, item=added)]

    def _done(self, item: _OpenItem) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The finished item and its closing events."""
        where = {"item_id": item.item_id, "output_index": item.index}
        if item.kind == "message":
            done = message_item(item.item_id, item.text, "completed")
            return done, [
                self._event(
                    "response.output_text.done", **where, content_index=0, text=item.text,
                    logprobs=[],
                ),
                self._event(
                    "response.content_part.done", **where, content_index=0,
                    part=done["content"][0],
                ),
                self._event("response.output_item.done", output_index=item.index, item=done),
            ]  # fmt: skip
        done = call_item(item.item_id, item.call_id, item.name, item.text, "completed")
        return done, [
            self._event(
                "response.function_call_arguments.done", **where, name=item.name,
                arguments=item.text,
            ),
            self._event("response.output_item.done", output_index=item.index, item=done),
        ]  # fmt: skip

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat chunk (a `data:` object of the chat stream)."""
        if self.ended:
            return []
        if "error" in chunk:
            return self.fail(chunk["error"])
        if isinstance(chunk.get("usage"), dict):
            self.usage = response_usage(chunk["usage"])
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                message = self.message
                if message is None:
                    message = self.message = self._open("message")
                    events += self._added(message)
                message.parts.append(content)
                events.append(
                    self._event(
                        "response.output_text.delta", item_id=message.item_id,
                        output_index=message.index, content_index=0, delta=content,
                        logprobs=[],
                    )
                )  # fmt: skip
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    events += self._call_delta(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
        return events

    def _call_delta(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        key = call.get("index")
        key = key if isinstance(key, int) else len(self.calls)
        function = call.get("function") or {}
        events: list[dict[str, Any]] = []
        item = self.calls.get(key)
        if item is None:
            call_id = call.get("id") or self.ids.item("call", len(self.items))
            item = self._open(
                "function_call", call_id=str(call_id), name=str(function.get("name") or "")
            )
            self.calls[key] = item
            events += self._added(item)
        elif function.get("name") and not item.name:
            item.name = str(function["name"])
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            item.parts.append(arguments)
            events.append(
                self._event(
                    "response.function_call_arguments.delta", item_id=item.item_id,
                    output_index=item.index, delta=arguments,
                )
            )  # fmt: skip
        return events

    def end(self) -> list[dict[str, Any]]:
        """The closing events, once the chat stream ended."""
        if self.ended:
            return []
        self.ended = True
        events: list[dict[str, Any]] = []
        output: list[dict[str, Any]] = []
        for item in self.items:
            done, closing = self._done(item)
            output.append(done)
            events += closing
        status = response_status(self.finish_reason)
        whole = response_object(self.body, self.ids, output=output, status=status, usage=self.usage)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*events, self._event(kind, response=whole)]

    def fail(self, error: Any) -> list[dict[str, Any]]:
        """An `error` event for a chat stream that failed after it started."""
        self.ended = True
        error = error if isinstance(error, dict) else {"message": str(error)}
        code = error.get("code")
        return [
            self._event(
                "error",
                code=str(code) if code is not None else "backend_error",
                message=str(error.get("message") or "the engine's stream failed"),
                param=error.get("param"),
            )
        ]
