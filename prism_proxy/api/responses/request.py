"""A `/v1/responses` body: its input items, tools and text format as pydantic models, and
what of a raw body is refused before it is validated (`refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from prism_proxy.api.field_types import (
    STRICT,
    BoundedJson,
    ModelName,
    Temperature,
    TokenCount,
    TopP,
)
from prism_proxy.api.field_types import Tag as ShortText

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
    """A `/v1/responses` body: the fields served (`api.responses`). Unknown fields are
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

    # What `intake.read_body` checks of every body (`costs.CheckedBody`): a Responses
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
