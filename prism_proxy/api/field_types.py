"""Field types of the client-facing bodies: strict JSON, and the bounds that keep the
engine up (SGLang's own where they stop a crash, PRISM's where SGLang has none;
`prism_proxy.api.sglang_fields` says which fields are served and why), with the sampling
ranges (`Temperature`, `TopP`, ...) every body carrying sampling fields shares, and
`SamplingBounds`: the sampling fields both `sampling_params` models (`/generate`'s and
`api.segments`') declare alike.
"""

from __future__ import annotations

from typing import Annotated, Any, Self

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from prism_proxy.api.sglang_fields import (
    MAX_BATCH,
    MAX_CHOICES,
    MAX_GRAMMAR_CHARS,
    MAX_SCHEMA_DEPTH,
    MAX_TAG_CHARS,
    MAX_TOP_LOGPROBS,
)

# Client bodies are JSON: types are checked strictly ("stream": "yes" is not a boolean,
# 1 is not a string) and numbers must be finite.
STRICT = ConfigDict(strict=True, allow_inf_nan=False)


def json_chars(value: Any) -> int:
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
    if json_chars(value) > MAX_GRAMMAR_CHARS:
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


def logit_bias_ids(bias: dict[str, float]) -> list[int]:
    """The token ids a `logit_bias` names (its keys, decimal integers)."""
    ids = []
    for key in bias:
        if not key.isdecimal():
            raise ValueError(f"logit_bias: key {key!r} is not a token id")
        ids.append(int(key))
    return ids


BatchIds = Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_BATCH)]


def _top_k(value: int) -> int:
    if value == 0:
        raise ValueError("must be -1 (disabled) or >= 1")
    return value


# SGLang's own bounds (`srt/sampling/sampling_params.py: verify`), shared by every body
# that carries sampling fields; all finite (the models set allow_inf_nan=False).
Temperature = Annotated[float, Field(ge=0.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=-1), AfterValidator(_top_k)]
MinP = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
RepetitionPenalty = Annotated[float, Field(gt=0.0, le=2.0)]
TokenCount = Annotated[int, Field(ge=0)]
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


def check_token_range(min_new_tokens: int | None, max_new_tokens: int | None) -> None:
    """SGLang refuses a minimum above the maximum."""
    if (
        min_new_tokens is not None
        and max_new_tokens is not None
        and (min_new_tokens > max_new_tokens)
    ):
        raise ValueError(
            f"min_new_tokens ({min_new_tokens}) must not exceed max_new_tokens ({max_new_tokens})"
        )


class SamplingBounds(BaseModel):
    """The sampling fields SGLang's `sampling_params` takes that every model of them
    declares alike, in SGLang's order, with the minimum checked against the maximum;
    each subclass sets its own `model_config` and adds the rest."""

    max_new_tokens: TokenCount | None = None
    min_new_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None

    @model_validator(mode="after")
    def _min_below_max(self) -> Self:
        check_token_range(self.min_new_tokens, self.max_new_tokens)
        return self
