"""What a checked body asks of the proxy and the engine: its prompt's size (`PromptSize`,
for the prompt-size limit and whether to parse off the loop), the sequences it asks the
engine to decode (`DecodeAsk`, bounded by `edge.limits`), and `CheckedBody`, what the
handlers check of every body model against the served model.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prism_proxy.api.hints import PrismHint

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


def forced_tokens_of(
    ignore_eos: bool | None, min_new: int | None, max_new: int | None
) -> int | None:
    if ignore_eos:
        return max_new  # None: until the context ends
    return min_new or 0


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


def prompt_ids(param: str, prompt: Any) -> Iterator[tuple[str, list[int]]]:
    """(field, ids) of a prompt given as token ids, flat or batched."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        yield param, prompt
    elif isinstance(prompt, list):
        for index, item in enumerate(prompt):
            if isinstance(item, list):
                yield f"{param}.{index}", item


def prompt_positions(prompt: Any) -> int:
    """Most tokens a prompt can hold, batches summed: its ids, or its UTF-8 bytes."""
    if isinstance(prompt, str):
        return len(prompt.encode("utf-8", "surrogatepass"))
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    return sum(prompt_positions(item) for item in prompt or ())


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
