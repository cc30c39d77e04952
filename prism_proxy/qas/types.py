"""Plain data the scheduling policies take and return (SPEC §2, §5).

Policies are pure: they see a snapshot of the queue and of the backend's active set,
and return a `RoundPlan`. Time enters only through each request's `arrival`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Lane(StrEnum):
    """Which lane of a wave released a request (SPEC §2, dispatch wave)."""

    HOT = "hot"
    COLD = "cold"


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A request waiting in QAS.

    `segments` is the request's skeleton Π_i: reusable-segment ids in the order the
    client sent them. `reorder` says whether they are order-insensitive (SPEC §1).
    `prefix_key` identifies the serialized head (system prompt + template) so that the
    baselines' approximate cache view never matches across different heads;
    `segment_tokens` gives each segment's token length (weights for prefix-match
    lengths; 1 each when unknown), `head_tokens` the head's. `ttft_slo_s` is the
    client's time-to-first-token target, if it sent one; `deadline` (same clock as
    `arrival`) is when its admission wait runs out: the admission core sets it from
    the SLO or `cold_deadline_ms` (inf: none), and `enqueued` to when it queued the
    request (NaN until then): its admission wait counts from there.

    `fixed` (segments found in an unmodified client's text whose boundaries the proxy
    could not justify) keep their relative order, and a leading run of `pinned` ones
    their place in front; `glued` ones travel with the segment before them in request
    order (blocks of one document), so the others move as units (`split_fixed`).

    `head` names the request's system head for DART's table (its entry is
    keyed `counters.head_key(head)`): the `prefix_key` when the head has tokens, None
    when there is no head (an unhinted, private request, or an empty head).

    `group` is the client's grouping hint (OpenAI's `prompt_cache_key`): requests in
    which nothing reusable was found share a bucket when they share it ("" for none).

    `program_start` is set when the request continues an agent session the proxy saw
    pause on a tool call (`admission.sessions`): when that program's first call arrived
    (same clock as `arrival`). None: not a known continuation.

    `account` is who sent it (the edge's `accounts.client_key`: an API key's account,
    or the client's address without keys; "" when unknown, as in the twin): the
    admission core shares each round's releases between accounts
    (`admission.fair_share`).
    """

    rid: str
    arrival: float
    segments: tuple[str, ...] = ()
    reorder: bool = True
    prefix_key: str = ""
    head_tokens: int = 0
    segment_tokens: tuple[int, ...] | None = None
    ttft_slo_s: float | None = None
    deadline: float = math.inf
    enqueued: float = math.nan
    fixed: frozenset[str] = frozenset()
    pinned: frozenset[str] = frozenset()
    glued: frozenset[str] = frozenset()
    group: str = ""
    program_start: float | None = None
    account: str = ""

    def segment_length(self, index: int) -> int:
        return 1 if self.segment_tokens is None else self.segment_tokens[index]

    def split_fixed(self) -> tuple[list[str], list[tuple[str, ...]], list[str]]:
        """(lead, units, rest) in request order. A reorderable request's `fixed`
        segments (boundaries the proxy could not justify) keep their order: the leading
        `pinned` ones stay in front (an instruction, "Context:"), the others follow the
        movable ones, which a policy may order as it likes as whole units (a segment and
        the `glued` ones after it)."""
        lead: list[str] = []
        if self.fixed:
            for segment in self.segments:
                if segment not in self.pinned:
                    break
                lead.append(segment)
        others = self.segments[len(lead) :]
        units: list[list[str]] = []
        previous = None
        for segment in others:
            if segment not in self.fixed:
                if units and segment in self.glued and units[-1][-1] == previous:
                    units[-1].append(segment)
                else:
                    units.append([segment])
            previous = segment
        return lead, [tuple(u) for u in units], [s for s in others if s in self.fixed]

    @property
    def head(self) -> str | None:
        return self.prefix_key if self.head_tokens > 0 and self.prefix_key else None


@dataclass(frozen=True, slots=True)
class ActiveRequest:
    """A request released to the backend and not finished yet (Q_active); `head` as
    `QueuedRequest.head`."""

    rid: str
    segments: tuple[str, ...] = ()
    head: str | None = None


@dataclass(frozen=True, slots=True)
class BucketView:
    """One bucket of a round, for reporting (scan order is the list order)."""

    signature: tuple[str, ...]
    rids: tuple[str, ...]
    score: float


@dataclass(frozen=True, slots=True)
class WaveEntry:
    rid: str
    lane: Lane


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """What one round decides.

    * `priorities`: P_t(r; ∅) for every segment seen in the queue or the active set.
    * `skeletons`: per queued rid, the segment order to serialize (Π*_i for `prism`).
    * `signatures`: per queued rid, its bucket signature (empty = cold only).
    * `buckets`: hot-lane candidate buckets in scan order (policies without buckets
      report none).
    * `wave`: released requests in release order, at most `wave_size` of them.
    * `dispatch_priorities`: P̂_t(r) = P_t(r; B_dispatch_t) (SPEC §3), and the same
      demand of every system head, keyed by its DART owner (`counters.head_key`).
    """

    priorities: dict[str, float] = field(default_factory=dict)
    skeletons: dict[str, tuple[str, ...]] = field(default_factory=dict)
    signatures: dict[str, tuple[str, ...]] = field(default_factory=dict)
    buckets: list[BucketView] = field(default_factory=list)
    wave: list[WaveEntry] = field(default_factory=list)
    dispatch_priorities: dict[str, float] = field(default_factory=dict)


def fifo_order(queue: Sequence[QueuedRequest]) -> list[QueuedRequest]:
    """Queue in arrival order; equal arrivals keep their input order (stable)."""
    return sorted(queue, key=lambda q: q.arrival)


def program_order(queue: Sequence[QueuedRequest]) -> list[QueuedRequest]:
    """Program-level FCFS: by the start of the program each request belongs to (its own
    arrival when it starts one), then by arrival (stable)."""
    return sorted(
        queue,
        key=lambda q: (q.arrival if q.program_start is None else q.program_start, q.arrival),
    )
