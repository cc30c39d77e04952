"""Pydantic models of the client-facing HTTP bodies (the proxy's edge).

OpenAI chat/completions bodies accept what the `openai` client sends and keep unknown
fields (`extra="allow"`) so that passthrough requests reach the backend unchanged. The
optional `prism` object carries segment hints (SPEC §1):
`{"system", "segments": [{"id", "text"}], "suffix", "reorder", "chat"}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from prism_proxy.request_model import (
    MinP,
    Penalty,
    RepetitionPenalty,
    SamplingParams,
    Seed,
    Temperature,
    TokenCount,
    TopK,
    TopP,
    check_token_range,
    field_parts,
)

# What one message or segment costs the proxy beyond its characters (rendering it in the
# chat template, validating it), counted in characters: 100,000 empty messages cost
# far more than their characters say.
ITEM_CHARS = 64


@dataclass(frozen=True, slots=True)
class PromptSize:
    """What a request's prompt costs: its characters of text, token ids counting one
    each (the limit `max_prompt_chars` counts these), and its items (messages, content
    parts, tools, segments)."""

    chars: int
    items: int = 0

    @property
    def work(self) -> int:
        """Characters plus `ITEM_CHARS` per item: decides whether to leave the loop."""
        return self.chars + ITEM_CHARS * self.items


# Client bodies are JSON: types are checked strictly ("stream": "yes" is not a boolean,
# 1 is not a string) and numbers must be finite.
STRICT = ConfigDict(strict=True, allow_inf_nan=False)


class SegmentHint(BaseModel):
    model_config = ConfigDict(extra="forbid", **STRICT)

    id: str
    text: str


class PrismHint(BaseModel):
    """Segment hints; omitted `system`/`suffix` come from the chat messages or prompt.

    `chat` chooses chat-template serialization; its default depends on the endpoint
    (true for chat completions, false for completions and `/generate`).
    """

    model_config = ConfigDict(extra="forbid", **STRICT)

    system: str | None = None
    segments: list[SegmentHint] = Field(default_factory=list)
    suffix: str | None = None
    reorder: bool = True
    chat: bool | None = None

    def chars(self) -> int:
        """Characters of text the hint carries (for the prompt-size limit)."""
        pieces = (self.system or "", self.suffix or "", *(s.text for s in self.segments))
        return sum(map(len, pieces))


def prompt_size(prompt: Any, hint: PrismHint | None) -> PromptSize:
    """Characters of prompt text (token ids count one each), batches summed, plus the
    hint's text; items: the batch's prompts and the hint's segments."""
    chars = hint.chars() if hint is not None else 0
    items = len(hint.segments) if hint is not None else 0
    if not prompt:
        return PromptSize(chars, items)
    if isinstance(prompt, str) or isinstance(prompt[0], int):
        return PromptSize(chars + len(prompt), items)
    return PromptSize(chars + sum(len(p) for p in prompt), items + len(prompt))


def _json_chars(value: Any) -> int:
    """Characters of a JSON value the backend renders into the prompt (tools, tool
    calls)."""
    return len(orjson.dumps(value)) if value else 0


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", **STRICT)

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def chars(self) -> int:
        """Characters of its text, and of the other fields a template renders (tool
        calls, names)."""
        content = self.content
        if isinstance(content, str):
            size = len(content)
        else:
            size = sum(len(str(part.get("text", ""))) for part in content or ())
        return size + len(self.name or "") + _json_chars(self.model_extra)

    def items(self) -> int:
        """The message and its content parts."""
        return 1 + (len(self.content) if isinstance(self.content, list) else 0)


class _SamplingFields(BaseModel):
    """Sampling fields shared by chat and completions (OpenAI + SGLang extensions)."""

    model_config = ConfigDict(extra="allow", **STRICT)

    model: str = ""
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    n: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    min_tokens: TokenCount | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    seed: Seed | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    rid: str | None = None
    prism: PrismHint | None = None

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_tokens

    @model_validator(mode="after")
    def _min_below_max(self) -> Self:
        check_token_range(self.min_tokens, self.max_new_tokens)
        return self

    def unknown_fields_reason(self) -> str | None:
        """Fields the token path does not know (e.g. `chat_template_kwargs`) send a
        request without hints to the backend's own endpoint, which may honour them; a
        request with hints takes the token path and those fields are ignored."""
        if self.prism is None and self.model_extra:
            return "fields " + ",".join(sorted(self.model_extra))
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    def sampling_params(self, max_new_tokens: int | None) -> dict[str, Any]:
        """SGLang `sampling_params` for `/generate` (unset fields stay unset)."""
        params: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "min_new_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens,
            "sampling_seed": self.seed,
        }
        return {key: value for key, value in params.items() if value is not None}


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: TokenCount | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    functions: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    def passthrough_reason(self) -> str | None:
        """Why the token path cannot serve this request (None: it can)."""
        if reason := self.unknown_fields_reason():
            return reason
        if self.tools or self.functions or self.tool_choice not in (None, "none"):
            return "tools"
        if (self.n or 1) > 1:
            return "n"
        if self.logprobs or self.top_logprobs:
            return "logprobs"
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            return "response_format"
        if self.logit_bias:
            return "logit_bias"
        for message in self.messages:
            if message.role not in ("system", "user", "assistant", "developer"):
                return f"role {message.role}"
            if message.model_extra:
                return "message fields " + ",".join(sorted(message.model_extra))
            if isinstance(message.content, list) and any(
                part.get("type") != "text" for part in message.content
            ):
                return "non-text content"
        return None

    @property
    def max_new_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:  # the newer name wins
            return self.max_completion_tokens
        return self.max_tokens

    def prompt_size(self) -> PromptSize:
        """Messages, tools and hints: their characters and items."""
        chars = sum(m.chars() for m in self.messages) + _json_chars(self.tools)
        chars += _json_chars(self.functions)
        items = (
            sum(m.items() for m in self.messages)
            + len(self.tools or ())
            + len(self.functions or ())
        )
        if self.prism is not None:
            chars += self.prism.chars()
            items += len(self.prism.segments)
        return PromptSize(chars, items)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: TokenCount | None = 16
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None

    def passthrough_reason(self) -> str | None:
        if reason := self.unknown_fields_reason():
            return reason
        if (self.n or 1) > 1 or (self.best_of or 1) > 1:
            return "n"
        if self.logprobs is not None:
            return "logprobs"
        if self.echo:
            return "echo"
        if self.suffix:
            return "suffix"
        if self.logit_bias:
            return "logit_bias"
        if isinstance(self.prompt, list) and self.prompt and not isinstance(self.prompt[0], int):
            return "batch prompt" if len(self.prompt) != 1 else None
        return None

    def prompt_size(self) -> PromptSize:
        return prompt_size(self.prompt, self.prism)

    def single_prompt(self) -> str | list[int]:
        """The one prompt of a non-batch request (text or token ids)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            return prompt[0]  # type: ignore[return-value]
        return prompt  # type: ignore[return-value]


class NativeSamplingParams(SamplingParams):
    """`/generate`'s `sampling_params`: the fields the proxy knows are checked as SGLang
    checks them; the others (SGLang has more) go to the backend unchanged."""

    model_config = ConfigDict(extra="allow", frozen=False)

    n: int | None = Field(default=None, ge=1)


class GenerateRequest(BaseModel):
    """SGLang-native `/generate`; unknown fields are forwarded unchanged."""

    model_config = ConfigDict(extra="allow", **STRICT)

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: NativeSamplingParams | None = None
    stream: bool = False
    rid: str | None = None
    prism: PrismHint | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> Self:
        if self.text is not None and self.input_ids is not None:
            raise ValueError("give either text or input_ids, not both")
        return self

    def passthrough_reason(self) -> str | None:
        if isinstance(self.text, list) or (self.input_ids and isinstance(self.input_ids[0], list)):
            return "batch"
        if self.sampling_params is not None and (self.sampling_params.n or 1) > 1:
            return "n"
        return None

    def prompt_size(self) -> PromptSize:
        return prompt_size(self.text if self.text is not None else self.input_ids, self.prism)

    def backend_sampling_params(self) -> dict[str, Any]:
        """`sampling_params` for the backend: as given, SGLang's field names."""
        return {} if self.sampling_params is None else self.sampling_params.to_sglang()


def describe_validation_error(error: ValidationError) -> tuple[str, str]:
    """(`param`, message) naming the first offending field, e.g. `messages.0.content`."""
    first = error.errors()[0]
    param = ".".join(str(part) for part in field_parts(first.get("loc", ()))) or "body"
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return param, f"{param}: {message}"


def openai_error(message: str, *, kind: str, param: str | None = None, code: Any = None) -> dict:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
