"""The OpenAI Responses API (`/v1/responses`) as a chat completion, and back.

A Responses request is translated into the proxy's own chat request (`to_chat`), which
then takes the chat endpoint's path (its checks, QAS scheduling, the token path or the
engine's chat endpoint with its tool-call parser); the chat answer is translated back
into a Response object (`to_response`) or, streamed, into the Responses events
(`ResponseEvents`). Everything here is pure: ids and timestamps come in as arguments.

Served: `input` as a string or a list of items (messages with text parts,
`function_call` and `function_call_output` items; `reasoning` items are dropped, as the
chat template never sees them), `instructions`, function `tools`, `tool_choice`,
`parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`, `stream`, `metadata`
(echoed), `store` (nothing is stored), `text.format`, `user`, `prompt_cache_key`.
Refused with a 400 naming the field: what needs stored responses or conversations
(`previous_response_id`, `conversation`, `item_reference` items), hosted tools, media
inputs, and fields that ask for what a chat completion cannot give (`include`,
`reasoning`, `truncation: auto`, ...). Fields the Responses API does not know are
dropped, as the chat endpoint drops fields SGLang does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from prism_proxy.api.field_types import STRICT, BoundedJson, ModelName
from prism_proxy.api.field_types import Tag as ShortText
from prism_proxy.api.segments import Temperature, TokenCount, TopP

# OpenAI's own bounds on `metadata`: 16 pairs, keys of 64 characters, values of 512.
MAX_METADATA_PAIRS = 16
MetadataKey = Annotated[str, Field(max_length=64)]
MetadataValue = Annotated[str, Field(max_length=512)]


class TextPart(BaseModel):
    """A text part of a message: `input_text` (the client's), `output_text` (an earlier
    answer sent back), `refusal`. Other parts (images, files, audio) are refused."""

    model_config = ConfigDict(extra="allow", **STRICT)

    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str | None = None
    refusal: str | None = None

    def content(self) -> str:
        return self.text if self.text is not None else (self.refusal or "")


def chat_content(content: str | list[TextPart]) -> str | list[dict[str, str]]:
    """A message's content as a chat message carries it: a string, one part as its
    text, several as the chat's text parts (joined as the chat endpoint joins them)."""
    if isinstance(content, str):
        return content
    if len(content) == 1:
        return content[0].content()
    return [{"type": "text", "text": part.content()} for part in content]


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="allow", **STRICT)

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]

    def chat_content(self) -> str | list[dict[str, str]]:
        return chat_content(self.content)


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="allow", **STRICT)

    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    name: Annotated[str, Field(min_length=1, max_length=256)]
    arguments: str


class FunctionOutputItem(BaseModel):
    model_config = ConfigDict(extra="allow", **STRICT)

    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    output: str | list[TextPart]

    def chat_content(self) -> str | list[dict[str, str]]:
        return chat_content(self.output)


class ReasoningItem(BaseModel):
    """An earlier answer's reasoning, sent back: dropped (no chat template renders it)."""

    model_config = ConfigDict(extra="allow", **STRICT)

    type: Literal["reasoning"]


def _item_type(item: Any) -> str:
    """An input item's type; a message may leave it out."""
    if isinstance(item, dict):
        return str(item.get("type", "message"))
    return str(getattr(item, "type", "message"))


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(BaseModel):
    """A function tool in the Responses API's flat shape."""

    model_config = ConfigDict(extra="allow", **STRICT)

    type: Literal["function"]
    name: Annotated[str, Field(min_length=1, max_length=256)]
    description: str | None = None
    parameters: BoundedJson = None
    strict: bool | None = None

    def to_chat(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        for key in ("description", "parameters", "strict"):
            if getattr(self, key) is not None:
                function[key] = getattr(self, key)
        return {"type": "function", "function": function}


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", **STRICT)

    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """`text.format`: plain text, a JSON object, or a JSON schema."""

    model_config = ConfigDict(extra="allow", **STRICT)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: BoundedJson = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _schema(self) -> Self:
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise ValueError("a json_schema format needs its name and schema")
        return self

    def to_chat(self) -> dict[str, Any] | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        schema: dict[str, Any] = {"name": self.name, "schema": self.schema_}
        for key in ("strict", "description"):
            if getattr(self, key) is not None:
                schema[key] = getattr(self, key)
        return {"type": "json_schema", "json_schema": schema}


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="allow", **STRICT)

    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


# Fields of the Responses API a chat completion cannot serve: a 400 says why.
NOT_SERVED: dict[str, str] = {
    "previous_response_id": "the proxy stores no responses; send the whole input",
    "conversation": "the proxy stores no conversations; send the whole input",
    "prompt": "stored prompts are not served through PRISM",
    "include": "no extra output data is served through PRISM",
    "reasoning": "reasoning settings are not served on /v1/responses",
    "max_tool_calls": "not served on /v1/responses",
    "top_logprobs": "logprobs are not served on /v1/responses",
    "context_management": "not served on /v1/responses",
}


class ResponsesRequest(BaseModel):
    """A `/v1/responses` body: the fields served (module docstring). Unknown fields are
    kept aside and dropped; what is not served is refused first (`refusal`)."""

    model_config = ConfigDict(extra="allow", **STRICT)

    model: ModelName = ""
    input: Annotated[str, Field(min_length=1)] | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool = False
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None, max_length=MAX_METADATA_PAIRS
    )
    store: bool | None = None
    text: TextConfig | None = None
    truncation: Literal["disabled", "auto"] | None = None
    user: ShortText | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=1024)

    # What `intake.read_body` checks of every body (`models.CheckedBody`): a Responses
    # body carries no token ids, `top_k` or grammar of its own; its chat is checked
    # again as a chat.
    def token_ids(self) -> Any:
        return iter(())

    def top_ks(self) -> Any:
        return iter(())

    def grammars(self) -> Any:
        return iter(())

    def prompt_logprob_entries(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a Responses body is not served: its status, the field, the message."""

    status: int
    param: str
    message: str


SERVED_ITEMS = ("message", "function_call", "function_call_output", "reasoning")
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def refusal(raw: dict[str, Any], max_items: int) -> Refusal | None:
    """What of a raw Responses body is not served, before it is validated: a field of
    `NOT_SERVED` that asks for something, `truncation: auto`, a tool other than a
    function, an input item or part other than text, or more than `max_items` input
    items or content parts (the proxy's `max_messages`, as for a chat's messages)."""
    for name, reason in NOT_SERVED.items():
        value = raw.get(name)
        if value is not None and value != [] and value != {}:
            return Refusal(400, name, f"{name}: not accepted: {reason}")
    if raw.get("truncation") == "auto":
        return Refusal(400, "truncation", "truncation: 'auto' is not served (nothing is cut)")
    tools = raw.get("tools")
    for index, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            param = f"tools.{index}.type"
            return Refusal(400, param, f"{param}: {kind!r}: only function tools are served")
    items = raw.get("input")
    if not isinstance(items, list):
        return None
    if len(items) > max_items:
        message = f"input: {len(items)} items exceed the limit of {max_items}"
        return Refusal(413, "input", message)
    part_count = 0
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind not in SERVED_ITEMS:
            param = f"input.{index}.type"
            why = "the proxy stores no items" if kind == "item_reference" else "not a text item"
            return Refusal(400, param, f"{param}: {kind!r} items are not served ({why})")
        where = "content" if kind == "message" else "output"
        parts = item.get(where)
        part_count += len(parts) if isinstance(parts, list) else 0
        if part_count > max_items:
            message = f"input: {part_count} content parts exceed the limit of {max_items}"
            return Refusal(413, "input", message)
        for part_index, part in enumerate(parts if isinstance(parts, list) else ()):
            part_type = part.get("type") if isinstance(part, dict) else None
            if part_type not in TEXT_PARTS:
                param = f"input.{index}.{where}.{part_index}.type"
                return Refusal(400, param, f"{param}: {part_type!r}: only text parts are served")
    return None


def _chat_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The chat messages of a Responses input: `instructions` first as the system
    message; consecutive function calls (and the assistant text before them) in one
    assistant message; each function output as a tool message."""
    messages: list[dict[str, Any]] = []
    if body.instructions is not None:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
        return messages
    for item in body.input:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.chat_content()})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if not last.get("content"):
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionOutputItem):
            message = {"role": "tool", "tool_call_id": item.call_id}
            messages.append({**message, "content": item.chat_content()})
        # reasoning items: dropped (module docstring)
    return messages


def to_chat(body: ResponsesRequest) -> dict[str, Any]:
    """The chat completion request a Responses request asks for (a raw body, checked
    as a chat by the caller). Streamed, the chat's last chunk carries its usage."""
    chat: dict[str, Any] = {"messages": _chat_messages(body), "stream": body.stream}
    if body.model:
        chat["model"] = body.model
    if body.stream:
        chat["stream_options"] = {"include_usage": True}
    if body.tools:
        chat["tools"] = [tool.to_chat() for tool in body.tools]
    choice = body.tool_choice
    if isinstance(choice, NamedFunction):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        chat["tool_choice"] = choice
    simple = {
        "parallel_tool_calls": body.parallel_tool_calls,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "user": body.user,
        "prompt_cache_key": body.prompt_cache_key,
    }
    chat.update((key, value) for key, value in simple.items() if value is not None)
    if body.text is not None and body.text.format is not None:
        response_format = body.text.format.to_chat()
        if response_format is not None:
            chat["response_format"] = response_format
    return chat


# Chat fields named in a 400 of the translated chat, and the Responses field they come from.
CHAT_PARAMS = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
}


def response_param(param: str | None) -> str | None:
    """The Responses field a chat field named in an error came from."""
    if param is None:
        return None
    head, dot, rest = param.partition(".")
    if head == "messages":  # its index counts chat messages, not input items
        return "input"
    return CHAT_PARAMS[head] + dot + rest if head in CHAT_PARAMS else param


@dataclass(frozen=True, slots=True)
class ResponseIds:
    """The ids and time one response is told by (the handler makes them)."""

    response_id: str
    created_at: int

    def item(self, kind: str, index: int) -> str:
        return f"{kind}_{self.response_id.removeprefix('resp_')}_{index}"


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(details.get("cached_tokens") or 0)},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(
    body: ResponsesRequest,
    ids: ResponseIds,
    *,
    output: list[dict[str, Any]],
    status: str,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """A Response object: the request's settings echoed, its output and usage."""
    text_format = body.text.format if body.text is not None else None
    choice = body.tool_choice
    tool_choice = choice.model_dump() if isinstance(choice, NamedFunction) else choice or "auto"
    return {
        "id": ids.response_id,
        "object": "response",
        "created_at": ids.created_at,
        "status": status,
        "error": None,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": body.model,
        "output": output,
        "parallel_tool_calls": (
            body.parallel_tool_calls if body.parallel_tool_calls is not None else True
        ),
        "previous_response_id": None,
        "store": False,
        "temperature": body.temperature,
        "text": {
            "format": (
                text_format.model_dump(by_alias=True, exclude_none=True)
                if text_format is not None
                else {"type": "text"}
            )
        },
        "tool_choice": tool_choice,
        "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or ()],
        "top_p": body.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": body.user,
        "metadata": body.metadata or {},
    }


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content if status == "completed" else [],
    }


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _status(finish_reason: Any) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def to_response(body: ResponsesRequest, ids: ResponseIds, chat: dict[str, Any]) -> dict:
    """The Response object of a (non-streamed) chat completion answer: its text as a
    message item, each tool call as a `function_call` item."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, str) and content:
        output.append(_message_item(ids.item("msg", 0), content, "completed"))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        index = len(output)
        output.append(
            _call_item(
                ids.item("fc", index),
                str(call.get("id") or ids.item("call", index)),
                str(function.get("name") or ""),
                str(function.get("arguments") or ""),
                "completed",
            )
        )
    status = _status(choice.get("finish_reason"))
    return response_object(body, ids, output=output, status=status, usage=_usage(chat.get("usage")))


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
            added = _message_item(item.item_id, "", "in_progress")
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            return [
                self._event("response.output_item.added", output_index=item.index, item=added),
                self._event(
                    "response.content_part.added",
                    item_id=item.item_id, output_index=item.index, content_index=0, part=part,
                ),
            ]  # fmt: skip
        added = _call_item(item.item_id, item.call_id, item.name, "", "in_progress")
        return [self._event("response.output_item.added", output_index=item.index, item=added)]

    def _done(self, item: _OpenItem) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The finished item and its closing events."""
        where = {"item_id": item.item_id, "output_index": item.index}
        if item.kind == "message":
            done = _message_item(item.item_id, item.text, "completed")
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
        done = _call_item(item.item_id, item.call_id, item.name, item.text, "completed")
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
            self.usage = _usage(chunk["usage"])
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
        status = _status(self.finish_reason)
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
