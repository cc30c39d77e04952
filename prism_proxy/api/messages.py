"""A chat message and its content parts, as the chat endpoint takes them."""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, model_validator

from prism_proxy.api.field_types import STRICT, BoundedJson, json_chars
from prism_proxy.api.sglang_fields import MESSAGE_FIELDS

MEDIA_PARTS = ("image_url", "video_url", "audio_url")
OTHER_PARTS = ("input_audio", "thinking", "reasoning", "tool_reference")  # SGLang's others


class ContentPart(BaseModel):
    """One part of a message's content: text, or media given inline as a `data:` URI
    (a URL would make the engine fetch it: a request to any host it can reach)."""

    model_config = ConfigDict(extra="allow", **STRICT)

    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _known(self) -> Self:
        extra = self.model_extra or {}
        if self.type == "text":
            if self.text is None:
                raise ValueError("a text part needs its text")
        elif self.type in MEDIA_PARTS:
            media = extra.get(self.type)
            url = media.get("url") if isinstance(media, dict) else None
            if not isinstance(url, str) or not url.startswith("data:"):
                raise ValueError(f"{self.type}: only inline data: URIs are served through PRISM")
        elif self.type not in OTHER_PARTS:
            raise ValueError(f"unknown content part type {self.type!r}")
        return self

    def chars(self) -> int:
        return len(self.text or "") + json_chars(self.model_extra)


class ChatMessage(BaseModel):
    """A chat message; fields SGLang does not know are dropped when forwarded
    (`sglang_fields.MESSAGE_FIELDS`)."""

    model_config = ConfigDict(extra="allow", **STRICT)

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    tools: list[BoundedJson] | None = None  # a system message's own tools
    phase: Literal["commentary", "final_answer"] | None = None
    prefix: bool | None = None

    def chars(self) -> int:
        """Characters of its text, and of the other fields a template renders (tool
        calls, names)."""
        content = self.content
        if isinstance(content, str):
            size = len(content)
        else:
            size = sum(part.chars() for part in content or ())
        size += len(self.name or "") + len(self.reasoning_content or "")
        return size + json_chars(self.tool_calls) + json_chars(self.tools)

    def items(self) -> int:
        """The message and its content parts."""
        return 1 + (len(self.content) if isinstance(self.content, list) else 0)

    def is_text(self) -> bool:
        """Whether the token path can render it: text only, no tool calls."""
        if self.tool_calls or self.tool_call_id is not None or self.reasoning_content:
            return False
        if self.tools or self.phase is not None or self.prefix:
            return False
        parts = self.content if isinstance(self.content, list) else ()
        return all(part.type == "text" for part in parts)

    def forwarded(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The message as forwarded: its known fields only."""
        return {key: value for key, value in raw.items() if key in MESSAGE_FIELDS}
