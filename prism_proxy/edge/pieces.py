"""A released prompt's long uncached part sent in pieces before it (`admission.pieces`).

    released ─► short (≤ one piece uncached): send the request as always
                   │ long
                   ▼ park ─► turn ─► for each end of piece_ends(...) (after the first,
                   │                 while others wait or run):
                   │                unpark ─► /generate ids[:end], 1 token ─► park
                   ▼ unpark ─► the request itself ··· first token ─► turn back

A piece carries what names the engine's cache entry (the ids, the partition key, the
segment anchors up to its end) and nothing the client asked for: its one token is
never shown. A failed piece only costs the reuse: the request is then sent whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prism_proxy.admission.driver import AdmissionController
from prism_proxy.admission.pieces import PrefillTurns, piece_ends, piece_size
from prism_proxy.backend.client import BackendClient
from prism_proxy.backend.errors import BackendError
from prism_proxy.metrics import ProxyMetrics
from prism_wire import make_kv_hints, parse_kv_hints

log = logging.getLogger(__name__)

# The body fields that name a prompt's cache entry besides its ids (SGLang 0.5.23's
# partition keys); everything else of the client's request stays out of a piece.
CACHE_FIELDS = ("extra_key", "cache_salt")
PIECE_SAMPLING = {"max_new_tokens": 1, "temperature": 0.0}


def piece_body(payload: Mapping[str, Any], end: int, rid: str) -> dict[str, Any]:
    """The `/generate` body that prefills `payload`'s first `end` token ids."""
    body: dict[str, Any] = {
        "input_ids": list(payload["input_ids"][:end]),
        "rid": rid,
        "sampling_params": dict(PIECE_SAMPLING),
    }
    for name in CACHE_FIELDS:
        if name in payload:
            body[name] = payload[name]
    hints = parse_kv_hints(payload.get("kv_hints"))
    if hints is not None:
        anchors = [a for a in hints.anchors if a.offset <= end]
        if anchors:
            body["kv_hints"] = make_kv_hints(anchors, hints.priorities, message_id=rid)
    return body


class Turn:
    """A pieced prompt's turn at the engine, held until its first token. `reused`: the
    tokens the engine held cached before the first piece (None: no piece went)."""

    __slots__ = ("_turns", "held", "reused")

    def __init__(self, turns: PrefillTurns, reused: int | None) -> None:
        self._turns = turns
        self.held = True
        self.reused = reused

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self._turns.release()

    async def clamped(
        self, batches: AsyncIterator[list[dict[str, Any]]]
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """The request's chunks with `cached_tokens` no more than `reused`: the engine
        also counts the pieces sent for this very request, which are no reuse (and a
        client is not told of them, nor do the hit-rate metrics or the B rule count
        them)."""
        reused = self.reused
        async with contextlib.aclosing(batches):
            async for batch in batches:
                if reused is not None:
                    for chunk in batch:
                        meta = chunk.get("meta_info")
                        cached = meta.get("cached_tokens") if isinstance(meta, dict) else None
                        if isinstance(cached, int) and cached > reused:
                            meta["cached_tokens"] = reused
                yield batch


@dataclass(frozen=True, slots=True)
class PieceSender:
    """Sends released prompts' long uncached parts in pieces (one per proxy).
    `setting`: `prefill_piece_tokens` (None: auto, 0: off)."""

    admission: AdmissionController
    backend: BackendClient
    metrics: ProxyMetrics
    setting: int | None

    async def send(
        self,
        payload: Mapping[str, Any],
        rid: str,
        known: Callable[[], int],
        headers: Mapping[str, str] | None,
    ) -> Turn | None:
        """A long prompt (more uncached tokens past `known()`, the tokens the engine
        may hold cached, asked only of a prompt longer than one piece) waits,
        parked, for its turn, and holds it until its first token; over two pieces
        uncached, it is prefilled in pieces first. After the first piece, the next go
        only while other requests are queued or in flight (alone, the rest goes with the
        request: a prompt alone costs one extra engine call). None for a short prompt
        (or pieces off): it is sent as always, without a turn."""
        ids = payload.get("input_ids")
        if self.setting == 0 or not isinstance(ids, list):
            return None
        admission = self.admission
        size = piece_size(self.setting, admission.pacing.backend.prefill_budget_tokens)
        if len(ids) <= size:
            return None
        cached = min(known(), len(ids))
        if len(ids) - cached <= size:
            return None
        ends = piece_ends(len(ids), cached, size)
        turns = admission.turns
        admission.park(rid)
        try:
            await turns.acquire()
            turn = Turn(turns, None)
            try:
                for index, end in enumerate(ends):
                    if index and not _contended(admission):
                        break  # alone: the rest goes with the request
                    cached = await self._piece(payload, rid, index, end, headers)
                    if cached is None:
                        break
                    if turn.reused is None:
                        turn.reused = cached
            except BaseException:
                turn.give_back()
                raise
            return turn
        finally:
            admission.unpark(rid)

    async def _piece(
        self,
        payload: Mapping[str, Any],
        rid: str,
        index: int,
        end: int,
        headers: Mapping[str, str] | None,
    ) -> int | None:
        """Prefill piece `index` of request `rid`, which is pending prefill meanwhile:
        the tokens the engine found cached, or None when it refused the piece (the
        request then goes whole)."""
        piece_rid = f"{rid}-piece{index}"
        self.admission.unpark(rid)
        try:
            cached = await self.backend.prefill(piece_body(payload, end, piece_rid), headers)
        except asyncio.CancelledError:
            self.backend.abort(piece_rid)
            raise
        except BackendError as exc:
            log.info("prompt piece %s failed (%s): its request goes whole", piece_rid, exc)
            return None
        finally:
            self.admission.park(rid)
        self.metrics.prefill_pieces.inc()
        return cached


def _contended(admission: AdmissionController) -> bool:
    """Others are queued or in flight besides this request."""
    return admission.queue_depth > 0 or admission.inflight > 1
