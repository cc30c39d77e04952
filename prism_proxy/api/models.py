"""Pydantic models of the client-facing HTTP bodies (the proxy's edge).

Each body model declares the fields of SGLang 0.5.23's own body that the proxy serves,
with their types and the bounds that keep the engine up (`prism_proxy.api.sglang_fields`
says which fields are served, owned by the proxy or refused, and why). What a request
forwards (`forwarded`) is only what was declared and checked; fields SGLang does not
know are kept aside (`extra="allow"`) and dropped. Token ids are checked against the
served vocabulary by the handlers (`token_ids`, `top_ks`), which know it. The optional
`prism` object carries segment hints (SPEC §1):
`{"system", "segments": [{"id", "text"}], "suffix", "reorder", "chat"}`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Protocol, Self

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from prism_proxy.api.segments import (
    MinP,
    Penalty,
    RepetitionPenalty,
    Seed,
    Temperature,
    TokenCount,
    TopK,
    TopP,
    check_token_range,
    field_parts,
)
from prism_proxy.api.sglang_fields import (
    CHAT_TEMPLATE_RESERVED,
    MAX_BATCH,
    MAX_CHOICES,
    MAX_GRAMMAR_CHARS,
    MAX_SCHEMA_DEPTH,
    MAX_TAG_CHARS,
    MAX_TOP_LOGPROBS,
    MESSAGE_FIELDS,
    PROXY_OWNED,
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


@dataclass(frozen=True, slots=True)
class Sequences:
    """Sequences of one request that ask for the same decode: how many, their
    `max_new_tokens` (None: unset, the engine's context bounds it), the tokens each is
    made to generate (`min_new_tokens`, or all of `max_new_tokens` with `ignore_eos`),
    and the logprob entries each output token carries (0: none; 1 + top logprobs)."""

    count: int
    max_new_tokens: int | None
    forced_tokens: int | None = 0  # None: all it may generate (ignore_eos, unset max)
    logprob_entries: int = 0


@dataclass(frozen=True, slots=True)
class DecodeAsk:
    """What a request asks the engine to generate (`edge.limits` bounds it)."""

    groups: tuple[Sequences, ...]
    prompt_logprob_entries: int = 0

    @property
    def sequences(self) -> int:
        return sum(group.count for group in self.groups)


def _forced(ignore_eos: bool | None, min_new: int | None, max_new: int | None) -> int | None:
    if ignore_eos:
        return max_new  # None: until the context ends
    return min_new or 0


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


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value (a scalar is 0)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend(
                (child, depth) for child in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def _bounded_json(value: Any) -> Any:
    """A schema or other JSON the engine compiles: at most `MAX_GRAMMAR_CHARS` encoded
    and `MAX_SCHEMA_DEPTH` deep (a 500-level schema took the engine 7.5 s)."""
    if value is None:
        return value
    if _json_chars(value) > MAX_GRAMMAR_CHARS:
        raise ValueError(f"larger than {MAX_GRAMMAR_CHARS} characters of JSON")
    if _depth(value) > MAX_SCHEMA_DEPTH:
        raise ValueError(f"nested deeper than {MAX_SCHEMA_DEPTH} levels")
    return value


def _no_lora(model: str) -> str:
    if ":" in model:
        raise ValueError(
            "'name:adapter' selects a LoRA adapter in SGLang; adapters are not served through PRISM"
        )
    return model


# SGLang's own bounds where they stop a crash, and PRISM's where SGLang has none
# (`prism_proxy.api.sglang_fields`).
Grammar = Annotated[str, Field(max_length=MAX_GRAMMAR_CHARS)]
Tag = Annotated[str, Field(max_length=MAX_TAG_CHARS)]
TopLogprobs = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]
Choices = Annotated[int, Field(ge=1, le=MAX_CHOICES)]
BoundedJson = Annotated[Any, AfterValidator(_bounded_json)]
Text = Annotated[str, Field(min_length=1)]  # an empty prompt stops the engine
TokenIds = Annotated[list[int], Field(min_length=1)]
StopStrings = Annotated[list[str], Field(max_length=32)]  # SGLang's own limit
LogitBias = dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]]  # OpenAI's range
ModelName = Annotated[str, AfterValidator(_no_lora)]

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
        return len(self.text or "") + _json_chars(self.model_extra)


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
        return size + _json_chars(self.tool_calls) + _json_chars(self.tools)

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


class CheckedBody(Protocol):
    """What the handlers check of any body against the served model (`check_served`)."""

    def token_ids(self) -> Iterator[tuple[str, list[int]]]:
        """(field, ids) of every token-id list the body carries."""
        ...

    def top_ks(self) -> Iterator[tuple[str, int]]:
        """(field, value) of every `top_k` it sets."""
        ...

    def prompt_logprob_entries(self) -> int:
        """Prompt positions times logprobs per position it asks for."""
        ...

    def grammars(self) -> Iterator[tuple[str, str, str]]:
        """(field, kind, text) of every grammar besides JSON schemas it asks the engine
        to follow: kind `ebnf`, `regex` or `structural_tag` (`api.grammars`)."""
        ...

    def decode_ask(self) -> DecodeAsk:
        """What it asks the engine to generate, over all its sequences."""
        ...


def _is_set(value: Any) -> bool:
    """Whether a field asks for something (present and not null, false or empty)."""
    return value is not None and value is not False and value != {} and value != []


class _OpenAIFields(BaseModel):
    """Fields shared by chat and completions (OpenAI + SGLang extensions). Fields that
    SGLang does not know are kept aside (`model_extra`) and never forwarded."""

    model_config = ConfigDict(extra="allow", **STRICT)

    # Served on the token path too.
    TOKEN_PATH: ClassVar[frozenset[str]] = frozenset(
        {
            "model", "stream", "stream_options", "max_tokens", "temperature", "top_p",
            "top_k", "min_p", "n", "stop", "stop_token_ids", "presence_penalty",
            "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos",
            "skip_special_tokens", "seed", "user", "rid", "prism", "priority",
            "extra_key", "cache_salt", "prompt_cache_key",
        }
    )  # fmt: skip

    model: ModelName = ""
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    # OpenAI's grouping hint for requests that share a prefix: used by QAS, never sent on
    prompt_cache_key: str | None = Field(default=None, max_length=1024)
    max_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    n: Choices | None = None
    stop: str | StopStrings | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    min_tokens: TokenCount | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    seed: Seed | None = None
    logit_bias: LogitBias | None = None
    user: Tag | None = None
    regex: Grammar | None = None
    ebnf: Grammar | None = None
    response_format: BoundedJson = None
    return_cached_tokens_details: bool | None = None
    return_token_ids: bool | None = None
    extra_key: Tag | None = None
    cache_salt: Tag | None = None
    rid: str | None = None
    priority: Seed | None = None
    prism: PrismHint | None = None

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_tokens

    @model_validator(mode="after")
    def _min_below_max(self) -> Self:
        check_token_range(self.min_tokens, self.max_new_tokens)
        return self

    def forwarded_fields(self, raw: dict[str, Any]) -> dict[str, Any]:
        """What passthrough sends: the served fields of `raw` (validated: the model is
        strict, so `raw` holds exactly what was checked), none of the proxy's own."""
        known = type(self).model_fields
        return {key: value for key, value in raw.items() if key in known and key not in PROXY_OWNED}

    def extra_fields_reason(self) -> str | None:
        """Served fields the token path does not serve, set by the client: the request
        goes to the backend's own endpoint, which honours them. A request with hints
        takes the token path whatever they say (they are ignored there)."""
        if self.prism is not None:
            return None
        known = type(self).model_fields
        fields = sorted(
            name
            for name in self.model_fields_set
            if name in known and name not in self.TOKEN_PATH and _is_set(getattr(self, name))
        )
        return "fields " + ",".join(fields) if fields else None

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

    def generate_fields(self) -> dict[str, Any]:
        """Fields of the token path's `/generate` besides the prompt and sampling: the
        cache partition the client asked for."""
        fields = {"extra_key": self.extra_key, "cache_salt": self.cache_salt}
        return {key: value for key, value in fields.items() if value is not None}

    def token_ids(self) -> Iterator[tuple[str, list[int]]]:
        """(field, ids) of every token-id list the body carries (checked against the
        served vocabulary before anything is forwarded)."""
        if self.stop_token_ids:
            yield "stop_token_ids", self.stop_token_ids
        if self.logit_bias:
            yield "logit_bias", logit_bias_ids(self.logit_bias)

    def top_ks(self) -> Iterator[tuple[str, int]]:
        if self.top_k is not None:
            yield "top_k", self.top_k

    def prompt_logprob_entries(self) -> int:
        return 0

    def grammars(self) -> Iterator[tuple[str, str, str]]:
        if self.ebnf is not None:
            yield "ebnf", "ebnf", self.ebnf
        if self.regex is not None:
            yield "regex", "regex", self.regex
        response_format = self.response_format
        if isinstance(response_format, dict) and response_format.get("type") == "structural_tag":
            yield "response_format", "structural_tag", orjson.dumps(response_format).decode()


def logit_bias_ids(bias: dict[str, float]) -> list[int]:
    """The token ids a `logit_bias` names (its keys, decimal integers)."""
    ids = []
    for key in bias:
        if not key.isdecimal():
            raise ValueError(f"logit_bias: key {key!r} is not a token id")
        ids.append(int(key))
    return ids


ToolChoice = Literal["none", "auto", "required"] | dict[str, Any]


class ChatCompletionRequest(_OpenAIFields):
    # Served on the token path, or named by a reason of `passthrough_reason`.
    TOKEN_PATH = _OpenAIFields.TOKEN_PATH | {
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
        chars = sum(m.chars() for m in self.messages) + _json_chars(self.tools)
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
            self.n or 1, max_new, _forced(self.ignore_eos, self.min_tokens, max_new), entries
        )
        return DecodeAsk((group,))


Prompt = Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_BATCH)] | TokenIds
BatchIds = Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_BATCH)]


class CompletionRequest(_OpenAIFields):
    TOKEN_PATH = _OpenAIFields.TOKEN_PATH | {
        "prompt", "echo", "suffix", "best_of", "logprobs", "logit_bias",
    }  # fmt: skip

    prompt: Prompt | BatchIds
    max_tokens: TokenCount | None = 16
    echo: bool | None = None
    suffix: str | None = None
    best_of: Choices | None = None
    logprobs: TopLogprobs | None = None
    json_schema: Grammar | None = None

    def passthrough_reason(self) -> str | None:
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
        batch = isinstance(self.prompt, list) and not isinstance(self.prompt[0], int)
        if batch and len(self.prompt) != 1:
            return "batch prompt"
        return self.extra_fields_reason()

    def forwarded(self, raw: dict[str, Any]) -> dict[str, Any]:
        return self.forwarded_fields(raw)

    def prompt_size(self) -> PromptSize:
        return prompt_size(self.prompt, self.prism)

    def single_prompt(self) -> str | list[int]:
        """The one prompt of a non-batch request (text or token ids)."""
        prompt = self.prompt
        if isinstance(prompt, list) and not isinstance(prompt[0], int):
            return prompt[0]  # type: ignore[return-value]
        return prompt  # type: ignore[return-value]

    def token_ids(self) -> Iterator[tuple[str, list[int]]]:
        yield from super().token_ids()
        yield from _prompt_ids("prompt", self.prompt)

    def decode_ask(self) -> DecodeAsk:
        prompts = 1
        if isinstance(self.prompt, list) and self.prompt and not isinstance(self.prompt[0], int):
            prompts = len(self.prompt)
        count = prompts * max(self.n or 1, self.best_of or 1)
        entries = 1 + self.logprobs if self.logprobs is not None else 0
        max_new = self.max_tokens
        group = Sequences(
            count, max_new, _forced(self.ignore_eos, self.min_tokens, max_new), entries
        )
        return DecodeAsk((group,), self.prompt_logprob_entries())

    def prompt_logprob_entries(self) -> int:
        """Prompt positions times logprobs per position that `echo` with `logprobs`
        asks for (an upper bound: a token holds at least one byte of text)."""
        if not self.echo or self.logprobs is None:
            return 0
        return _prompt_positions(self.prompt) * max(1, self.logprobs)


def _prompt_ids(param: str, prompt: Any) -> Iterator[tuple[str, list[int]]]:
    """(field, ids) of a prompt given as token ids, flat or batched."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        yield param, prompt
    elif isinstance(prompt, list):
        for index, item in enumerate(prompt):
            if isinstance(item, list):
                yield f"{param}.{index}", item


def _prompt_positions(prompt: Any) -> int:
    """Most tokens a prompt can hold, batches summed: its ids, or its UTF-8 bytes."""
    if isinstance(prompt, str):
        return len(prompt.encode("utf-8", "surrogatepass"))
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    return sum(_prompt_positions(item) for item in prompt or ())


class NativeSamplingParams(BaseModel):
    """`/generate`'s `sampling_params`, as SGLang 0.5.23's `SamplingParams` takes them;
    every field checked (unknown ones refused, as SGLang does)."""

    model_config = ConfigDict(extra="forbid", **STRICT)

    max_new_tokens: TokenCount | None = None
    min_new_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    stop: str | StopStrings | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    stream_interval: Annotated[int, Field(ge=1)] | None = None
    n: Choices | None = None
    sampling_seed: Seed | None = None
    json_schema: Grammar | None = None
    regex: Grammar | None = None
    ebnf: Grammar | None = None
    structural_tag: Grammar | None = None
    logit_bias: LogitBias | None = None

    @model_validator(mode="after")
    def _min_below_max(self) -> Self:
        check_token_range(self.min_new_tokens, self.max_new_tokens)
        return self

    def to_sglang(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)

    def grammars(self, param: str) -> Iterator[tuple[str, str, str]]:
        for kind in ("ebnf", "regex", "structural_tag"):
            text = getattr(self, kind)
            if text is not None:
                yield f"{param}.{kind}", kind, text

    def token_ids(self, param: str) -> Iterator[tuple[str, list[int]]]:
        if self.stop_token_ids:
            yield f"{param}.stop_token_ids", self.stop_token_ids
        if self.logit_bias:
            yield f"{param}.logit_bias", logit_bias_ids(self.logit_bias)


class GenerateRequest(BaseModel):
    """SGLang-native `/generate`: the served fields of `GenerateReqInput` (fields SGLang
    does not know are dropped; `sglang_fields.REFUSED` ones are answered 400)."""

    model_config = ConfigDict(extra="allow", **STRICT)

    text: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_BATCH)] | None = None
    input_ids: TokenIds | BatchIds | None = None
    sampling_params: (
        NativeSamplingParams
        | Annotated[list[NativeSamplingParams], Field(min_length=1, max_length=MAX_BATCH)]
        | None
    ) = None
    stream: bool = False
    return_logprob: bool | None = None
    logprob_start_len: Annotated[int, Field(ge=-1)] | None = None
    top_logprobs_num: TopLogprobs | None = None
    token_ids_logprob: TokenIds | None = None
    return_text_in_logprobs: bool | None = None
    return_prompt_token_ids: bool | None = None
    extra_key: Tag | None = None
    cache_salt: Tag | None = None
    rid: str | None = None
    priority: Seed | None = None
    kv_hints: Any = None
    log_metrics: bool | None = None
    received_time: float | None = None
    prism: PrismHint | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> Self:
        if self.text is not None and self.input_ids is not None:
            raise ValueError("give either text or input_ids, not both")
        batch = self.batch_size()
        if isinstance(self.sampling_params, list) and len(self.sampling_params) != batch:
            raise ValueError(
                f"sampling_params: a list needs one entry per prompt ({batch}), "
                f"got {len(self.sampling_params)}"
            )
        return self

    def batch_size(self) -> int:
        """Prompts in the request (1 unless `text` or `input_ids` is a batch)."""
        if isinstance(self.text, list):
            return len(self.text)
        if self.input_ids and isinstance(self.input_ids[0], list):
            return len(self.input_ids)
        return 1

    def passthrough_reason(self) -> str | None:
        if isinstance(self.text, list) or (self.input_ids and isinstance(self.input_ids[0], list)):
            return "batch"
        if isinstance(self.sampling_params, list):
            return "batch"
        if self.sampling_params is not None and (self.sampling_params.n or 1) > 1:
            return "n"
        return None

    def forwarded(self, raw: dict[str, Any]) -> dict[str, Any]:
        known = type(self).model_fields
        return {k: v for k, v in raw.items() if k in known and k not in PROXY_OWNED}

    def generate_fields(self) -> dict[str, Any]:
        """The served fields besides the prompt, `sampling_params` and `stream`, for the
        token path's `/generate`."""
        skip = {"text", "input_ids", "sampling_params", "stream"}
        return {
            name: getattr(self, name)
            for name in type(self).model_fields
            if name not in skip and name not in PROXY_OWNED and getattr(self, name) is not None
        }

    def prompt_size(self) -> PromptSize:
        return prompt_size(self.text if self.text is not None else self.input_ids, self.prism)

    def backend_sampling_params(self) -> dict[str, Any]:
        """`sampling_params` for the backend: as given, SGLang's field names."""
        params = self.sampling_params
        return params.to_sglang() if isinstance(params, NativeSamplingParams) else {}

    def sampling_list(self) -> list[NativeSamplingParams]:
        params = self.sampling_params
        if params is None:
            return []
        return params if isinstance(params, list) else [params]

    def token_ids(self) -> Iterator[tuple[str, list[int]]]:
        yield from _prompt_ids("input_ids", self.input_ids)
        if self.token_ids_logprob:
            yield "token_ids_logprob", self.token_ids_logprob
        params = self.sampling_params
        for index, item in enumerate(self.sampling_list()):
            name = "sampling_params" if not isinstance(params, list) else f"sampling_params.{index}"
            yield from item.token_ids(name)

    def top_ks(self) -> Iterator[tuple[str, int]]:
        params = self.sampling_params
        for index, item in enumerate(self.sampling_list()):
            if item.top_k is not None:
                prefix = (
                    "sampling_params"
                    if not isinstance(params, list)
                    else f"sampling_params.{index}"
                )
                yield f"{prefix}.top_k", item.top_k

    def grammars(self) -> Iterator[tuple[str, str, str]]:
        params = self.sampling_params
        for index, item in enumerate(self.sampling_list()):
            name = "sampling_params" if not isinstance(params, list) else f"sampling_params.{index}"
            yield from item.grammars(name)

    def decode_ask(self) -> DecodeAsk:
        entries = 0
        if self.return_logprob:
            entries = 1 + (self.top_logprobs_num or 0) + len(self.token_ids_logprob or ())
        batch = self.batch_size()
        params = self.sampling_list() or [NativeSamplingParams()]
        per_prompt = batch if len(params) == 1 else 1  # a list has one entry per prompt
        groups = tuple(
            Sequences(
                per_prompt * (p.n or 1),
                # /generate's own default: SGLang's SamplingParams.max_new_tokens
                p.max_new_tokens if "max_new_tokens" in p.model_fields_set else 128,
                _forced(p.ignore_eos, p.min_new_tokens, p.max_new_tokens),
                entries,
            )
            for p in params
        )
        return DecodeAsk(groups, self.prompt_logprob_entries())

    def prompt_logprob_entries(self) -> int:
        """Prompt positions times logprobs per position asked for (`return_logprob`
        with `logprob_start_len` >= 0; an upper bound, see `_prompt_positions`)."""
        if not self.return_logprob or self.logprob_start_len is None or self.logprob_start_len < 0:
            return 0
        prompt = self.text if self.text is not None else self.input_ids
        positions = max(0, _prompt_positions(prompt) - self.logprob_start_len * self.batch_size())
        return positions * max(1, self.top_logprobs_num or 0)


def describe_validation_error(error: ValidationError) -> tuple[str, str]:
    """(`param`, message) naming the offending field, e.g. `messages.0.content`. Of a
    union's alternatives, the error that is not a plain type mismatch says what is
    wrong (`[[]]` as token ids: an empty list, not "a valid integer")."""
    errors = error.errors()
    first = next((e for e in errors if not str(e.get("type", "")).endswith("_type")), errors[0])
    param = ".".join(str(part) for part in field_parts(first.get("loc", ()))) or "body"
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return param, f"{param}: {message}"


def openai_error(message: str, *, kind: str, param: str | None = None, code: Any = None) -> dict:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
