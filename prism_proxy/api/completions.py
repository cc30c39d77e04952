"""The body of `/v1/completions` (OpenAI's, with SGLang's extensions; the fields it
shares with chat are in `api.openai_fields`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import Field

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
    BatchIds,
    Choices,
    Grammar,
    Text,
    TokenCount,
    TokenIds,
    TopLogprobs,
)
from prism_proxy.api.openai_fields import OpenAIFields
from prism_proxy.api.sglang_fields import MAX_BATCH

Prompt = Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_BATCH)] | TokenIds


class CompletionRequest(OpenAIFields):
    TOKEN_PATH = OpenAIFields.TOKEN_PATH | {
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
        yield from prompt_ids("prompt", self.prompt)

    def decode_ask(self) -> DecodeAsk:
        prompts = 1
        if isinstance(self.prompt, list) and self.prompt and not isinstance(self.prompt[0], int):
            prompts = len(self.prompt)
        count = prompts * max(self.n or 1, self.best_of or 1)
        entries = 1 + self.logprobs if self.logprobs is not None else 0
        max_new = self.max_tokens
        group = Sequences(
            count, max_new, forced_tokens_of(self.ignore_eos, self.min_tokens, max_new), entries
        )
        return DecodeAsk((group,), self.prompt_logprob_entries())

    def prompt_logprob_entries(self) -> int:
        """Prompt positions times logprobs per position that `echo` with `logprobs`
        asks for (an upper bound: a token holds at least one byte of text)."""
        if not self.echo or self.logprobs is None:
            return 0
        return prompt_positions(self.prompt) * max(1, self.logprobs)
