"""Prefill pacing limits: `B` (requests pending prefill) and the concurrency backstop
(SPEC §2, dispatch wave).

    B        = clamp(round(prefill budget / uncached tokens per request), 1, backstop)
    backstop = the backend's max_running_requests

* **Prefill budget**: the tokens one backend prefill batch takes: SGLang's
  `chunked_prefill_size`, or `max_prefill_tokens` when chunking is off (`-1`), read
  from `/server_info`; 8192 until the backend has said.
* **Uncached tokens per request**: an exponential moving average (weight 1/16) of
  `prompt_tokens − cached_tokens` that the backend reports with each first token;
  1024 before the first report, so B starts at 8 for an 8k budget.
* **Backstop**: requests released and not finished; the backend's
  `max_running_requests` (1024 until it has said).

A flag fixes either number (`--prefill-batch`, `--max-inflight`); 0 means "follow
the rule". Behind a gateway in front of `replicas` engines (`--backend-replicas`, or
one per DART control RPC) the backend's reported budget and backstop are one engine's:
each counts `replicas` times, since every replica prefills its own batch. Pure
bookkeeping: the driver feeds it what the backend reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_PREFILL_BUDGET_TOKENS = 8192
DEFAULT_UNCACHED_TOKENS = 1024.0
DEFAULT_BACKSTOP = 1024
UNCACHED_EWMA_WEIGHT = 1.0 / 16.0


@dataclass(frozen=True, slots=True)
class BackendLimits:
    """What the backend reports about its batches (None: not reported)."""

    prefill_budget_tokens: int | None = None
    max_running_requests: int | None = None

    @classmethod
    def from_server_info(cls, info: Mapping[str, Any]) -> BackendLimits:
        """Read SGLang's (or prism-sim's) `/get_server_info`.

        `chunked_prefill_size` ≤ 0 means chunking is off: the batch budget is then
        `max_prefill_tokens`. `max_running_requests` is a server argument that may be
        null; the scheduler's resolved value is `internal_states[0]
        .effective_max_running_requests_per_dp` (SGLang 0.5.23, prism-sim alike).
        """
        states = info.get("internal_states")
        state = states[0] if isinstance(states, list) and states else {}
        state = state if isinstance(state, Mapping) else {}

        def positive(*values: Any) -> int | None:
            for value in values:
                if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                    return int(value)
            return None

        chunk = info.get("chunked_prefill_size")
        budget = positive(chunk) if positive(chunk) else positive(info.get("max_prefill_tokens"))
        running = positive(
            state.get("effective_max_running_requests_per_dp"), info.get("max_running_requests")
        )
        return cls(budget, running)


class PrefillPacing:
    """The current `B` and backstop; `observe` and `learn` update them."""

    def __init__(self, prefill_batch: int = 0, max_inflight: int = 0, replicas: int = 1) -> None:
        if prefill_batch < 0 or max_inflight < 0:
            raise ValueError("prefill_batch and max_inflight must be >= 0 (0: automatic)")
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        self.replicas = replicas
        self.fixed_batch = prefill_batch or None
        self.fixed_backstop = max_inflight or None
        self.backend = BackendLimits()
        self.uncached_tokens = DEFAULT_UNCACHED_TOKENS

    def learn(self, limits: BackendLimits) -> None:
        """Take the backend's reported limits (keeps what it did not report)."""
        self.backend = BackendLimits(
            limits.prefill_budget_tokens or self.backend.prefill_budget_tokens,
            limits.max_running_requests or self.backend.max_running_requests,
        )

    def observe(self, uncached_tokens: int) -> None:
        """One request's first token reported this many prompt tokens not cached."""
        sample = max(1, uncached_tokens)
        self.uncached_tokens += UNCACHED_EWMA_WEIGHT * (sample - self.uncached_tokens)

    @property
    def prefill_budget_tokens(self) -> int:
        """Tokens the backend prefills per batch round, over all its replicas."""
        per_engine = self.backend.prefill_budget_tokens or DEFAULT_PREFILL_BUDGET_TOKENS
        return self.replicas * per_engine

    @property
    def backstop(self) -> int:
        per_engine = self.backend.max_running_requests or DEFAULT_BACKSTOP
        return self.fixed_backstop or self.replicas * per_engine

    @property
    def prefill_batch(self) -> int:
        """B: how many released requests may wait for their first token at once."""
        if self.fixed_batch is not None:
            return self.fixed_batch
        rule = round(self.prefill_budget_tokens / self.uncached_tokens)
        return max(1, min(rule, self.backstop))
