"""Segment counters and the shared priority score P_t (SPEC §2).

    g_t(r)    = |{q ∈ Q_queue  : r ∈ R(q)}|
    a_t(r)    = |{q ∈ Q_active : r ∈ R(q)}|
    n_t(r; B) = |{q ∈ B        : r ∈ R(q)}|
    P_t(r; B) = w_a·a_t(r) + w_n·n_t(r; B) + w_g·g_t(r)

Raw counts rank within one round only; they are never compared across rounds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prism_proxy.qas.params import QasParams
from prism_proxy.qas.types import ActiveRequest, QueuedRequest


def count_segments(skeletons: Iterable[Sequence[str]]) -> Counter[str]:
    """Number of requests holding each segment (a request counts a segment once)."""
    counts: Counter[str] = Counter()
    for skeleton in skeletons:
        counts.update(dict.fromkeys(skeleton, 1))  # once per request, in a stable order
    return counts


@dataclass(frozen=True, slots=True)
class SegmentCounters:
    """g_t and a_t for one round's snapshot, with the weights that combine them."""

    queued: Counter[str]
    active: Counter[str]
    params: QasParams

    @classmethod
    def snapshot(
        cls,
        queue: Sequence[QueuedRequest],
        active: Sequence[ActiveRequest],
        params: QasParams,
    ) -> SegmentCounters:
        return cls(
            queued=count_segments(q.segments for q in queue),
            active=count_segments(a.segments for a in active),
            params=params,
        )

    def base_priority(self, segment: str) -> float:
        """P_t(r; ∅) = w_a·a_t(r) + w_g·g_t(r)."""
        return self.params.w_a * self.active[segment] + self.params.w_g * self.queued[segment]

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

        With B = B_dispatch_t this is DART's table P̂_t (SPEC §3).
        """
        next_counts = count_segments(batch)
        return {r: self.priority(r, next_counts[r]) for r in self.segments()}
