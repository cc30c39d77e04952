"""Segment counters and the shared priority score P_t (SPEC §2).

    g_t(r)    = |{q ∈ Q_queue  : r ∈ R(q)}|
    a_t(r)    = |{q ∈ Q_active : r ∈ R(q)}|
    n_t(r; B) = |{q ∈ B        : r ∈ R(q)}|
    c_t(r)    = 1 if r is resident in the backend's cache, else 0
    P_t(r; B) = w_a·a_t(r) + w_n·n_t(r; B) + w_c·c_t(r) + w_g·g_t(r)

Raw counts rank within one round only; they are never compared across rounds. The
paper's P_t is the case w_c = 0. DART's table P̂_t leaves c_t out: DART knows residency
better than the proxy, and a bonus shared by every resident segment would not change
its order.

System heads (a deviation from SPEC §3, whose system prompt ranks "always the
highest"): each head h (a request's `QueuedRequest.head`) is counted exactly like a
segment, a_t(h), n_t(h; B), g_t(h) over the requests that carry it, and
w_a·a_t(h) + w_n·n_t(h; B) + w_g·g_t(h) joins DART's table under the head's DART owner
(`head_key`), so a head earns protection by demand alone. Heads are kept apart from the
segment counters: they never enter P_t(r; ∅), alignment, signatures or buckets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prism_proxy.qas.params import QasParams
from prism_proxy.qas.types import ActiveRequest, QueuedRequest
from prism_wire import system_owner


def count_segments(skeletons: Iterable[Sequence[str]]) -> Counter[str]:
    """Number of requests holding each segment (a request counts a segment once)."""
    counts: Counter[str] = Counter()
    for skeleton in skeletons:
        # Once per request, in a stable order; an iterator (not a mapping) takes
        # Counter's C counting path instead of its Python loop over items.
        counts.update(iter(dict.fromkeys(skeleton)))
    return counts


def head_key(head: str) -> str:
    """The key of system head `head` (a `prefix_key`) in DART's table: its DART owner,
    in a namespace no segment id can enter."""
    return system_owner(head)


@dataclass(frozen=True, slots=True)
class SegmentCounters:
    """g_t, a_t and c_t for one round's snapshot, with the weights that combine them;
    g_t and a_t of the system heads apart (`queued_heads`, `active_heads`)."""

    queued: Counter[str]
    active: Counter[str]
    params: QasParams
    resident: frozenset[str] = frozenset()
    queued_heads: Counter[str] = field(default_factory=Counter)
    active_heads: Counter[str] = field(default_factory=Counter)

    @classmethod
    def snapshot(
        cls,
        queue: Sequence[QueuedRequest],
        active: Sequence[ActiveRequest],
        params: QasParams,
        resident: frozenset[str] = frozenset(),
    ) -> SegmentCounters:
        return cls(
            queued=count_segments(q.segments for q in queue),
            active=count_segments(a.segments for a in active),
            params=params,
            resident=resident if params.w_c > 0 else frozenset(),
            queued_heads=Counter(q.head for q in queue if q.head is not None),
            active_heads=Counter(a.head for a in active if a.head is not None),
        )

    def demand(self, segment: str) -> float:
        """w_a·a_t(r) + w_g·g_t(r): P_t(r; ∅) without residency."""
        return self.params.w_a * self.active[segment] + self.params.w_g * self.queued[segment]

    def base_priority(self, segment: str) -> float:
        """P_t(r; ∅) = w_a·a_t(r) + w_c·c_t(r) + w_g·g_t(r)."""
        bonus = self.params.w_c if segment in self.resident else 0.0
        return self.demand(segment) + bonus

    def priority(self, segment: str, next_count: int = 0) -> float:
        """P_t(r; B) given n_t(r; B) = `next_count`."""
        return self.base_priority(segment) + self.params.w_n * next_count

    def segments(self) -> list[str]:
        """Every segment seen in the queue or the active set, in a stable order."""
        seen = dict.fromkeys(self.queued)
        seen.update(dict.fromkeys(self.active))
        return list(seen)

    def base_priorities(self) -> dict[str, float]:
        return {r: self.base_priority(r) for r in self.segments()}

    def batch_priorities(self, batch: Iterable[Sequence[str]]) -> dict[str, float]:
        """P_t(r; B) for every known segment, B given by its members' skeletons.

        With B = B_dispatch_t this is DART's table P̂_t (SPEC §3), without c_t.
        """
        next_counts = count_segments(batch)
        w_n = self.params.w_n
        return {r: self.demand(r) + w_n * next_counts[r] for r in self.segments()}

    def head_priorities(self, batch_heads: Iterable[str | None]) -> dict[str, float]:
        """w_a·a_t(h) + w_n·n_t(h; B) + w_g·g_t(h) for every head seen in the queue or
        the active set, keyed by `head_key`; B given by its members' heads."""
        next_counts = Counter(h for h in batch_heads if h is not None)
        params, queued, active = self.params, self.queued_heads, self.active_heads
        heads = dict.fromkeys(queued)
        heads.update(dict.fromkeys(active))
        return {
            head_key(h): params.w_a * active[h]
            + params.w_n * next_counts[h]
            + params.w_g * queued[h]
            for h in heads
        }

    def dispatch_table(
        self, batch: Iterable[Sequence[str]], batch_heads: Iterable[str | None]
    ) -> dict[str, float]:
        """DART's table P̂_t for the dispatch batch B_dispatch_t (SPEC §3): every
        segment's `batch_priorities` and every head's `head_priorities`."""
        return {**self.batch_priorities(batch), **self.head_priorities(batch_heads)}
