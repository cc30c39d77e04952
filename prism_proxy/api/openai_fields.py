"""The fields chat and completions share (OpenAI's, with SGLang's extensions), and what
the token path makes of them: SGLang `sampling_params`, the token ids and grammars to
check, and the reason a request goes to the engine's own endpoint instead.

Each body model declares the fields of SGLang 0.5.23's own body that the proxy serves,
with their types and the bounds that keep the engine up (`prism_proxy.api.sglang_fields`
says which fields are served, owned by the proxy or refused, and why). What a request
forwards (`forwarded`) is only what was declared and checked; fields SGLang does not
know are kept aside (`extra="allow"`) and dropped. Token ids are checked against the
served vocabulary by the handlers (`token_ids`, `top_ks`), which know it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from prism_proxy.api.field_types import (
    STRICT,
    BoundedJson,
    Choices,
    Grammar,
    LogitBias,
    MinP,
    ModelName,
    Penalty,
    RepetitionPenalty,
    Seed,
    StopStrings,
    Tag,
    Temperature,
    TokenCount,
    TopK,
    TopP,
    check_token_range,
    logit_bias_ids,
)
from prism_proxy.api.hints import PrismHint
from prism_proxy.api.sglang_fields import PROXY_OWNED


def _is_set(value: Any) -> bool:
    """Whether a field asks for something (present and not null, false or empty)."""
    return value is not None and value is not False and value != {} and value != []


class OpenAIFields(BaseModel):
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
