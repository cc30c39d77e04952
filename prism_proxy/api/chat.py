"""The body of `/v1/chat/completions` (OpenAI's, with SGLang's extensions; the fields
it shares with completions are in `api.openai_fields`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from prism_proxy.api.costs import DecodeAsk, PromptSize, Sequences, forced_tokens_of
from prism_proxy.api.field_types import BoundedJson, TokenCount, TokenIds, TopLogprobs, json_chars
from prism_proxy.api.messages import ChatMessage
from prism_proxy.api.openai_fields import OpenAIFields
from prism_proxy.api.sglang_fields import CHAT_TEMPLATE_RESERVED

ToolChoice = Literal["none", "auto", "required"] | dict[str, Any]


class ChatCompletionRequest(OpenAIFields):
    # Served on the token path, or named by a reason of `passthrough_reason`.
    TOKEN_PATH = OpenAIFields.TOKEN_PATH | {
        "messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools",
        "tool_choice", "response_format", "logit_bias",
    }  # fmt: skip

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: TokenCount | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[BoundedJson] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    reasoning: dict[str, str] | None = None
    thinking: BoundedJson = None
    task: str | None = None
    continue_final_message: bool | None = None
    separate_reasoning: bool | None = None
    stream_reasoning: bool | None = None
    chat_template_kwargs: BoundedJson = None
    return_meta_info: bool | None = None
    return_prompt_token_ids: bool | None = None
    input_ids: TokenIds | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, kwargs: Any) -> Any:
        """Refuse what the engine's template renderer sets itself (a 500 from SGLang):
        a 400 naming `chat_template_kwargs`."""
        if kwargs is None:
            return kwargs
        if not isinstance(kwargs, dict):
            raise ValueError("chat_template_kwargs: expected an object")
        if taken := sorted(CHAT_TEMPLATE_RESERVED & kwargs.keys()):
            raise ValueError(
                f"chat_template_kwargs: {', '.join(taken)} cannot be set (the template "
                "renderer sets them)"
            )
        return kwargs

    def passthrough_reason(self) -> str | None:
        """Why the token path cannot serve this request (None: it can)."""
        if self.tools or self.tool_choice not in (None, "none", "auto"):
            return "tools"
        if (self.n or 1) > 1:
            return "n"
        if self.logprobs or self.top_logprobs:
            return "logprobs"
        if isinstance(self.response_format, dict) and self.response_format.get("type") not in (
            None,
            "text",
        ):
            return "response_format"
        if self.logit_bias:
            return "logit_bias"
        for message in self.messages:
            if message.role not in ("system", "user", "assistant", "developer"):
                return f"role {message.role}"
            if not message.is_text():
                return "non-text content"
        return self.extra_fields_reason()

    def forwarded(self, raw: dict[str, Any]) -> dict[str, Any]:
        body = self.forwarded_fields(raw)
        body["messages"] = [
            message.forwarded(item)
            for message, item in zip(self.messages, raw["messages"], strict=True)
        ]
        return body

    @property
    def max_new_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:  # the newer name wins
            return self.max_completion_tokens
        return self.max_tokens

    def prompt_size(self) -> PromptSize:
        """Messages, tools and hints: their characters and items."""
        chars = sum(m.chars() for m in self.messages) + json_chars(self.tools)
        chars += len(self.input_ids or ())
        items = sum(m.items() for m in self.messages) + len(self.tools or ())
        if self.prism is not None:
            chars += self.prism.chars()
            items += len(self.prism.segments)
        return PromptSize(chars, items)

    def token_ids(self) -> Iterator[tuple[str, list[int]]]:
        yield from super().token_ids()
        if self.input_ids:
            yield "input_ids", self.input_ids

    def decode_ask(self) -> DecodeAsk:
        entries = 1 + (self.top_logprobs or 0) if self.logprobs else 0
        max_new = self.max_new_tokens
        group = Sequences(
            self.n or 1,
            max_new,
            forced_tokens_of(self.ignore_eos, self.min_tokens, max_new),
            entries,
        )
        return DecodeAsk((group,))
