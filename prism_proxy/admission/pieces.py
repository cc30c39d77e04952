"""Long prefills in pieces, so that short requests are not held behind them.

Neither SGLang nor prism-sim preempts a prefill, and a chunked prefill does not let a
new request in either: SGLang's scheduler gives the whole prefill budget of each step
to the unfinished chunk, so a short chat that arrives while a 2,000-token prompt
prefills waits for all of it, whatever the proxy released first (issue 34, the pacing
squat: one such prompt is already 3.5× a short chat's TTFT on this CPU).

The proxy sends token ids, and the engine caches every prefix it prefilled. So a
prompt whose uncached part is long can be prefilled in pieces: `/generate` of
`ids[:end]` for a few growing `end`s with one new token each, then the request itself,
which finds all but its last piece cached. Each piece is one short engine call: a
request released meanwhile is prefilled after the piece, not after the whole prompt.

A prompt is *long* when more of it is uncached than one piece (the engine's prefill
step by default); past two pieces it is cut. Two rules keep the engine's queue short:

* **turns**: at most one long prompt per engine replica at the engine at a time
  (`PrefillTurns`), first come first served (in the order released prompts ask for
  one), so long prompts finish one after another
  instead of all together at the end (SGLang prefills one chunked prompt at a time
  anyway);
* **parked**: a long prompt waiting for its turn is not *pending prefill* (it holds
  no place in the engine), so it does not use up `B` and hold short requests in the
  queue (`AdmissionCore.park`).

Pieces are cut only where the proxy expects the tokens uncached (past the longest
prefix it sent before); after the first, only while other requests are queued or in
flight, so a prompt alone costs one extra engine call (`edge.pieces`).
"""

from __future__ import annotations

import asyncio
from collections import deque

from prism_proxy.admission.core import DEFAULT_PREFILL_BUDGET_TOKENS

# Piece ends are multiples of this: the sharing table's block (`prompts.sharing`), and
# a multiple of any paged KV cache's page size, so every piece is cached whole.
PIECE_ALIGN = 64
MIN_PIECE_TOKENS = PIECE_ALIGN


def piece_size(setting: int | None, engine_budget: int | None) -> int:
    """Tokens per piece: the setting, or (auto, None) the engine's prefill budget per
    step (SGLang's `chunked_prefill_size`), which keeps the engine's own step size:
    only prompts longer than two steps are cut, and one piece fills one step."""
    if setting is not None:
        return setting
    return engine_budget or DEFAULT_PREFILL_BUDGET_TOKENS


def piece_ends(length: int, known: int, piece_tokens: int) -> list[int]:
    """Where the pieces of a `length`-token prompt end, when its first `known` tokens
    may already be cached: every `piece_tokens` tokens past `known` (rounded to
    `PIECE_ALIGN`), leaving the request itself at least `piece_tokens` and fewer than
    `2 × piece_tokens` uncached tokens. Empty when there is nothing to cut
    (`piece_tokens` 0 turns pieces off)."""
    if piece_tokens <= 0 or length <= 0:
        return []
    step = max(MIN_PIECE_TOKENS, -(-piece_tokens // PIECE_ALIGN) * PIECE_ALIGN)
    start = max(0, min(known, length)) // PIECE_ALIGN * PIECE_ALIGN
    return list(range(start + step, length - step + 1, step))


class PrefillTurns:
    """Turns at the engine for pieced prompts: `capacity` at once, first come first
    served.

    `acquire()` waits until fewer than `capacity` turns are held and every earlier
    waiter got its turn; `release()` gives the turn back. A cancelled waiter leaves the
    line."""

    def __init__(self, capacity: int = 1) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.held = 0
        self._line: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for future in self._line if not future.done())

    async def acquire(self) -> None:
        if self.held < self.capacity and not self._line:
            self.held += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.append(future)
        self._wake()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # granted in the same instant as cancelled: give it back
            else:
                self._line.remove(future)
                self._wake()
            raise

    def release(self) -> None:
        if self.held < 1:
            raise RuntimeError("release without a turn held")
        self.held -= 1
        self._wake()

    def _wake(self) -> None:
        line = self._line
        while line and self.held < self.capacity:
            future = line.popleft()
            if future.done():
                continue
            self.held += 1
            future.set_result(None)
