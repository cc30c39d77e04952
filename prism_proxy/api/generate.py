"""The body of SGLang-native `/generate`, and its `sampling_params`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prism_proxy.api.costs import (
    DecodeAsk,
    PromptSize,
    Sequences,
    forced_tokens_of,
    prompt_ids,
    prompt_positions,
    prompt_size,
)
from prism_proxy.api.field_types import (
    STRICT,
    BatchIds,
    Choices,
    Grammar,
    LogitBias,
    SamplingBounds,
    Seed,
    StopStrings,
    Tag,
    Text,
    TokenIds,
    TopLogprobs,
    logit_bias_ids,
)
from prism_proxy.api.hints import PrismHint
from prism_proxy.api.sglang_fields import MAX_BATCH, PROXY_OWNED


class NativeSamplingParams(SamplingBounds):
    """`/generate`'s `sampling_params`, as SGLang 0.5.23's `SamplingParams` takes them;
    every field checked (unknown ones refused, as SGLang does)."""

    model_config = ConfigDict(extra="forbid", **STRICT)

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
        yield from prompt_ids("input_ids", self.input_ids)
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
                forced_tokens_of(p.ignore_eos, p.min_new_tokens, p.max_new_tokens),
                entries,
            )
            for p in params
        )
        return DecodeAsk(groups, self.prompt_logprob_entries())

    def prompt_logprob_entries(self) -> int:
        """Prompt positions times logprobs per position asked for (`return_logprob`
        with `logprob_start_len` >= 0; an upper bound, see `prompt_positions`)."""
        if not self.return_logprob or self.logprob_start_len is None or self.logprob_start_len < 0:
            return 0
        prompt = self.text if self.text is not None else self.input_ids
        positions = max(0, prompt_positions(prompt) - self.logprob_start_len * self.batch_size())
        return positions * max(1, self.top_logprobs_num or 0)
