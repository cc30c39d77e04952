"""Bodies of the engine's own endpoints the proxy forwards as they are:
`/v1/embeddings`, `/v1/tokenize`, `/v1/detokenize` (SGLang 0.5.23's `EmbeddingRequest`,
`TokenizeRequest`, `DetokenizeRequest`).

As for the chat endpoint (`api.chat`): each field SGLang reads is served (declared,
checked, forwarded), owned by the proxy (`rid`, `priority`: never forwarded) or refused
with a 400 naming it (`sglang_fields.REFUSED`: embedding overrides, LoRA); fields SGLang
does not know are dropped. Inputs are bounded like prompts: at most `MAX_BATCH` of them,
their characters (token ids one each) within `max_prompt_chars`, token ids within the
served vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prism_proxy.api.chat import ToolChoice
from prism_proxy.api.costs import DecodeAsk, PromptSize, prompt_size
from prism_proxy.api.engine_info import DROP, model_name
from prism_proxy.api.field_types import (
    STRICT,
    BoundedJson,
    ModelName,
    Tag,
    Text,
    TokenIds,
    json_chars,
)
from prism_proxy.api.messages import ChatMessage
from prism_proxy.api.sglang_fields import CHAT_TEMPLATE_RESERVED, MAX_BATCH, PROXY_OWNED

# Longest embedding a request may ask for (`dimensions`): SGLang checks it against the
# model only after the prompt ran.
MAX_DIMENSIONS = 65_536

Texts = Annotated[list[Text], Field(min_length=1, max_length=MAX_BATCH)]
IdLists = Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_BATCH)]


class _ForwardedBody(BaseModel):
    """What every forwarded body shares: its declared fields only are forwarded, and
    it asks the engine to generate nothing."""

    model_config = ConfigDict(extra="allow", **STRICT)

    model: ModelName = ""

    def forwarded(self, raw: dict[str, Any]) -> dict[str, Any]:
        known = type(self).model_fields
        return {k: v for k, v in raw.items() if k in known and k not in PROXY_OWNED}

    def token_ids(self) -> Iterator[tuple[str, list[int]]]:
        return iter(())

    def top_ks(self) -> Iterator[tuple[str, int]]:
        return iter(())

    def grammars(self) -> Iterator[tuple[str, str, str]]:
        return iter(())

    def prompt_logprob_entries(self) -> int:
        return 0

    def decode_ask(self) -> DecodeAsk:
        return DecodeAsk(())


def _id_lists(param: str, value: Any) -> Iterator[tuple[str, list[int]]]:
    """(field, ids) of token ids given flat or as a list of lists."""
    if isinstance(value, list) and value and isinstance(value[0], int):
        yield param, value
    elif isinstance(value, list):
        for index, ids in enumerate(value):
            if isinstance(ids, list):
                yield f"{param}.{index}", ids


class EmbeddingRequest(_ForwardedBody):
    input: Text | Texts | TokenIds | IdLists
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1, le=MAX_DIMENSIONS)] | None = None
    user: Tag | None = None
    rid: str | None = None
    priority: int | None = None

    @property
    def batch(self) -> bool:
        """Whether it holds several inputs (a list of texts or of id lists)."""
        return isinstance(self.input, list) and not isinstance(self.input[0], int)

    def prompt_size(self) -> PromptSize:
        return prompt_size(self.input, None)

    def token_ids(self) -> Iterator[tuple[str, list[int]]]:
        return _id_lists("input", self.input)


class TokenizeRequest(_ForwardedBody):
    """Text (`prompt`, one or several) or a chat (`messages`, with its `tools`) to token
    ids, as the engine's tokenizer and chat template make them."""

    prompt: Text | Texts | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    tools: list[BoundedJson] | None = None
    tool_choice: ToolChoice | None = None
    reasoning_effort: str | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: BoundedJson = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None

    @model_validator(mode="after")
    def _one_input(self) -> Self:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        kwargs = self.chat_template_kwargs
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ValueError("chat_template_kwargs: expected an object")
        if kwargs and (taken := sorted(CHAT_TEMPLATE_RESERVED & kwargs.keys())):
            raise ValueError(f"chat_template_kwargs: {', '.join(taken)} cannot be set")
        return self

    def forwarded(self, raw: dict[str, Any]) -> dict[str, Any]:
        body = super().forwarded(raw)
        if self.messages is not None:
            body["messages"] = [
                message.forwarded(item)
                for message, item in zip(self.messages, raw["messages"], strict=True)
            ]
        return body

    def prompt_size(self) -> PromptSize:
        if self.messages is None:
            return prompt_size(self.prompt, None)
        chars = sum(m.chars() for m in self.messages) + json_chars(self.tools)
        return PromptSize(chars, sum(m.items() for m in self.messages) + len(self.tools or ()))


class DetokenizeRequest(_ForwardedBody):
    tokens: TokenIds | IdLists
    skip_special_tokens: bool | None = None

    def prompt_size(self) -> PromptSize:
        return prompt_size(self.tokens, None)

    def token_ids(self) -> Iterator[tuple[str, list[int]]]:
        return _id_lists("tokens", self.tokens)


def embedding_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """What a client is told of the engine's embeddings answer: its vectors and usage;
    `model` as a served name, never a path (SGLang 0.5.23 answers with the model's path,
    `engine_info.model_name`)."""
    name = model_name(answer.get("model"))
    return {
        "object": "list",
        "data": answer.get("data"),
        "model": "" if name is DROP or name is None else name,
        "usage": answer.get("usage"),
    }
