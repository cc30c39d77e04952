"""A request inside the simulated engine: what came in and how far it got (SPEC §7).

Mutable on purpose: it is the scheduler's per-request state (like SGLang's `Req`).
`kv_hints` is kept exactly as received (DART parses its anchors out of it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prism_sim.radix_cache import TreeNode


class Status(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"  # admitted, prompt not fully prefilled yet (chunked)
    RUNNING = "running"  # decoding
    FINISHED = "finished"


@dataclass(eq=False)
class SimRequest:
    """One generation request and its progress; times are modeled seconds.

    Compared by identity (`eq=False`): the scheduler keeps requests in lists and
    removes them often; field-wise equality would be both wrong and slow.
    """

    rid: str
    input_ids: list[int]
    max_new_tokens: int
    arrival_s: float
    kv_hints: dict[str, Any] | None = None
    # SGLang's `sampling_params.custom_params`: where anchors ride on the chat endpoint
    custom_params: dict[str, Any] | None = None
    priority: int | None = None
    stream: bool = False  # for metric labels (`is_streaming`)
    # The tokens to generate, in order, ending with a stop token (a tool call forced by
    # the request, `prism_sim.tool_calls`); None: filler up to `max_new_tokens`.
    output_script: list[int] | None = None
    # Called (synchronously, by the scheduler) after every new token and at finish.
    listener: Callable[[SimRequest], None] | None = None

    status: Status = Status.WAITING
    cached_tokens: int = 0  # matched prefix length at admission (meta_info.cached_tokens)
    fill_len: int = 0  # prompt tokens whose KV is computed (cached prefix included)
    protected_len: int = 0  # leading tokens inserted in the tree and locked by us
    cache_inserted_len: int = 0  # longest key this request inserted (LFU hit counting)
    held_tokens: int = 0  # KV slots allocated to us outside the tree
    host_hit_tokens: int = 0  # of `cached_tokens`, loaded back from the host tier
    host_loading_tokens: int = 0  # held slots a load-back fills, until the first chunk
    last_node: TreeNode | None = None  # end of our locked path (None: no lock held)
    output_ids: list[int] = field(default_factory=list)
    arrival_processed_tokens: int = 0  # HRRN's token clock at arrival
    abort_requested: bool = False
    admitted_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    finish_reason: dict[str, Any] | None = None

    def timeline(self) -> dict[str, Any]:
        """This request as the engine saw it, in modeled seconds (the twin's
        `--save-calls` records, and the real engine's `PRISM_SIM_REQUEST_LOG`)."""
        return {
            "rid": self.rid,
            "arrival_s": self.arrival_s,
            "admitted_s": self.admitted_s,
            "first_token_s": self.first_token_s,
            "finish_s": self.finish_s,
            "prompt_tokens": len(self.input_ids),
            "cached_tokens": self.cached_tokens,
            "output_tokens": len(self.output_ids),
            "max_new_tokens": self.max_new_tokens,
        }

    @property
    def prompt_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def kv_committed_tokens(self) -> list[int]:
        """Tokens whose KV exists: the prefilled prompt, then every output but the last."""
        if self.fill_len < len(self.input_ids):
            return self.input_ids[: self.fill_len]
        return self.input_ids + self.output_ids[:-1]

    @property
    def remaining_decode_tokens(self) -> int:
        """KV slots this request will still need to finish (reserved at admission)."""
        return max(0, self.max_new_tokens - max(1, len(self.output_ids)))

    @property
    def unallocated_prompt_tokens(self) -> int:
        """Prompt tokens of a chunked request still to be allocated by later chunks."""
        held_for_prompt = self.held_tokens - self.host_loading_tokens
        return max(0, len(self.input_ids) - self.fill_len - held_for_prompt)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def notify(self) -> None:
        if self.listener is not None:
            self.listener(self)
