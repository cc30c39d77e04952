"""HTTP request bodies of the simulated engine (SGLang 0.5.23 shapes, extras ignored)."""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class _KeepsRaw(_Lenient):
    """A body that also keeps the JSON object as sent (`raw`): a chat template renders
    messages and tools as the client gave them, key order and extras included."""

    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_raw(cls, data: Any, handler: Any) -> Self:
        model = handler(data)
        if isinstance(data, dict):
            model._raw = data
        return model

    @property
    def raw(self) -> dict[str, Any]:
        """The body as sent (key order included: templates render tools as given)."""
        return self._raw


class SamplingParamsIn(_Lenient):
    max_new_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = None
    ignore_eos: bool = False


class GenerateIn(_Lenient):
    """`GenerateReqInput`: exactly one of `text` / `input_ids` (single or batch)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SamplingParamsIn | list[SamplingParamsIn] | None = None
    stream: bool = False
    rid: str | list[str] | None = None
    kv_hints: dict[str, Any] | list[dict[str, Any] | None] | None = None
    priority: int | None = None
    return_logprob: bool = False


class StreamOptions(_Lenient):
    include_usage: bool = False


class CompletionIn(_Lenient):
    model: str | None = None
    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(default=16, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    rid: str | None = None
    priority: int | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class FunctionIn(_Lenient):
    name: str
    parameters: dict[str, Any] | None = None  # a JSON Schema


class ToolIn(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionIn


class ToolChoiceFunction(_Lenient):
    name: str


class ToolChoiceIn(_Lenient):
    """A named function: `{"type": "function", "function": {"name": ...}}`."""

    type: Literal["function"] = "function"
    function: ToolChoiceFunction


class ChatCompletionIn(_KeepsRaw):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    # Forced calls are answered as SGLang does (`prism_sim.tool_calls`); the prompt is
    # rendered from the request as sent (`raw`), tools included, as SGLang renders it.
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceIn | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    rid: str | None = None
    priority: int | None = None
    # SGLang's `sampling_params.custom_params`: where DART's anchors ride on this
    # endpoint (`prism_wire.CUSTOM_PARAMS_KEY`).
    custom_params: dict[str, Any] | None = None


class AbortIn(_Lenient):
    rid: str = ""
    abort_all: bool = False


class TokenizeIn(_KeepsRaw):
    """SGLang's `TokenizeRequest`: exactly one of `prompt` (a text or a list of texts)
    and `messages` (rendered by the chat template, as a chat completion renders them
    unless `add_generation_prompt` is given)."""

    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceIn | None = None
    continue_final_message: bool = False
    add_special_tokens: bool = True
    add_generation_prompt: bool | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeIn:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("Exactly one of 'prompt' or 'messages' must be provided.")
        return self


class DetokenizeIn(_Lenient):
    """SGLang's `DetokenizeRequest`."""

    model: str | None = None
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True


class EmbeddingIn(_Lenient):
    """`EmbeddingRequest`: text, texts, token ids or lists of them."""

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=8192)
