"""What one request may ask the engine to generate, and what one answer may weigh.

* **Decode per request** (`max_decode_tokens`; automatic: a quarter of the engine's KV
  pool): `n × max_tokens` over all of a request's sequences. SGLang bounds a single
  sequence by its memory, but not a request's sequences together: `n = 16` with
  `min_new_tokens = max_new_tokens = 8000` on a 16k-token pool ran 387 s, retracted
  and re-queued while every other client timed out. A request over the bound is a 400
  naming it; one that leaves `max_tokens` unset is counted at the engine's context
  length when it has several sequences (a single one is the engine's to bound).
* **Decode per client** (`max_client_decode_tokens`; automatic: the KV pool): what a
  client's requests in flight force the engine to generate (`ignore_eos`,
  `min_tokens`) or multiply (`n > 1`, batches), summed; beyond it a 429 with
  Retry-After. An ordinary request (one sequence that may stop at its end of text)
  reserves nothing.
* **Answer bytes** (`max_answer_bytes`): a non-streamed answer is assembled by the
  proxy (`edge.assemble`); one whose tokens, choices and logprobs cannot fit is refused
  up front with a 400 that says to stream it, and one that outgrows the bound anyway is
  cut off with the same advice.

The client is its address (`accounts.client_key`) until the proxy has API keys. Pure functions
and a sans-IO table; the edge applies them (`edge.intake`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prism_proxy.api.costs import DecodeAsk

# Without the engine's numbers (before its first server info).
DEFAULT_POOL_TOKENS = 131_072
DEFAULT_CONTEXT_TOKENS = 32_768
# What an answer's JSON costs per output token: its text, and each logprob entry of a
# token (chat's `{"token", "bytes", "logprob", "top_logprobs"}` entries run 40-70 bytes).
TEXT_BYTES_PER_TOKEN = 8
LOGPROB_ENTRY_BYTES = 48


class LimitError(Exception):
    """A request over a limit: `status` (400 or 429) and a message naming the limit."""

    def __init__(self, status: int, message: str, param: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class EngineSize:
    """The engine's KV pool and context, in tokens (None: not reported yet)."""

    pool_tokens: int | None = None
    context_tokens: int | None = None

    @property
    def pool(self) -> int:
        return self.pool_tokens or DEFAULT_POOL_TOKENS

    @property
    def context(self) -> int:
        return self.context_tokens or DEFAULT_CONTEXT_TOKENS


def request_limit(setting: int | None, engine: EngineSize) -> int:
    """`max_decode_tokens` in effect: the setting, else a quarter of the pool."""
    return setting if setting is not None else max(1, engine.pool // 4)


def client_limit(setting: int | None, engine: EngineSize) -> int:
    return setting if setting is not None else engine.pool


def decode_tokens(ask: DecodeAsk, engine: EngineSize) -> int:
    """Tokens the request may make the engine generate, all sequences together; an
    unset maximum counts as the context (bounded by the engine alone for one sequence,
    which `check_decode` lets through)."""
    return sum(g.count * (g.max_new_tokens or engine.context) for g in ask.groups)


def check_decode(ask: DecodeAsk, limit: int, engine: EngineSize) -> None:
    """LimitError(400) when the request's sequences together may generate more than
    `limit` tokens."""
    explicit = all(g.max_new_tokens is not None for g in ask.groups)
    if ask.sequences <= 1 and not explicit:
        return  # one sequence, its maximum unset: the engine caps it by context and memory
    total = decode_tokens(ask, engine)
    if total <= limit:
        return
    if explicit:
        message = (
            f"the request may generate {total} tokens over its {ask.sequences} sequence(s) "
            f"(n x max_tokens), more than this deployment's max_decode_tokens ({limit})"
        )
    else:
        message = (
            f"{ask.sequences} sequences without max_tokens may each run to the context "
            f"({engine.context} tokens), more than this deployment's max_decode_tokens "
            f"({limit}) together: set max_tokens to at most {limit // ask.sequences}"
        )
    raise LimitError(400, message, "max_tokens")


def reserved_tokens(ask: DecodeAsk, engine: EngineSize) -> int:
    """What the request holds of its client's share: the tokens it forces the engine
    to generate, or all it may generate when it has several sequences."""
    total = 0
    for group in ask.groups:
        if group.count > 1:
            total += group.count * (group.max_new_tokens or engine.context)
        elif group.forced_tokens is None:
            total += group.max_new_tokens or engine.context
        else:
            total += group.forced_tokens
    return total


def answer_bytes(ask: DecodeAsk, engine: EngineSize) -> int:
    """About the largest answer the request may get, as JSON."""
    total = LOGPROB_ENTRY_BYTES * ask.prompt_logprob_entries
    for group in ask.groups:
        tokens = group.count * (group.max_new_tokens or engine.context)
        total += tokens * (TEXT_BYTES_PER_TOKEN + LOGPROB_ENTRY_BYTES * group.logprob_entries)
    return total


def check_answer(ask: DecodeAsk, limit_bytes: int, engine: EngineSize) -> None:
    """LimitError(400) when a non-streamed answer may exceed `limit_bytes`."""
    size = answer_bytes(ask, engine)
    if size > limit_bytes:
        raise LimitError(
            400,
            f"the answer may reach about {size} bytes (tokens x choices x logprobs), more "
            f"than this deployment's max_answer_bytes ({limit_bytes}) for an answer the "
            "proxy assembles: ask for it as a stream (stream: true), or for fewer tokens, "
            "choices or logprobs",
            "stream",
        )


class ClientReservations:
    """Tokens reserved by each client's requests in flight (`reserved_tokens`); a
    client is dropped from the table when it holds nothing, so the table is bounded by
    the requests in flight."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def hold(self, client: str, tokens: int, limit: int) -> bool:
        """Reserve `tokens` for `client` if it stays within `limit` (or holds nothing
        yet: one request over the share alone is the per-request bound's to judge)."""
        if tokens <= 0:
            return True
        held = self._held.get(client, 0)
        if held and held + tokens > limit:
            return False
        self._held[client] = held + tokens
        return True

    def release(self, client: str, tokens: int) -> None:
        if tokens <= 0:
            return
        left = self._held.get(client, 0) - tokens
        if left > 0:
            self._held[client] = left
        else:
            self._held.pop(client, None)

    def held(self, client: str) -> int:
        return self._held.get(client, 0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)
