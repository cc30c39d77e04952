"""Signature buckets, their scores (SPEC §2, bucket score), and the wave drawn from them.

With R_b the distinct segments of bucket b, T[b] its queued requests (FIFO) and
B_hot_b the first min(|T[b]|, M − q_cold) of them:

    U(b)     = (1/|R_b|) · Σ_{r ∈ R_b} P_t(r; B_hot_b)
    Score(b) = α_size·|T[b]| + β_util·U(b)

Every segment of a request in B_hot_b lies in R_b, so
Σ_{r ∈ R_b} n_t(r; B_hot_b) = Σ_{q ∈ B_hot_b} |R(q)|: one pass over the bucket's
segment occurrences scores it, O(S) for the whole round.

The dispatch wave's hot and cold lanes (SPEC §2, dispatch wave), filled from the buckets:

    wave of M slots
    ┌──────────── hot: M − q_cold ────────────┬── cold: q_cold ──┐
    │ bucket 1 (FIFO) │ bucket 2 │ …          │ oldest unchosen  │
    └─────────────────────────────────────────┴──────────────────┘

Unused hot slots go to the cold lane (which takes the oldest requests not chosen); the
cold lane can only run short when the queue is exhausted, so the wave always holds
min(M, |queue|) requests.

Continuations first: with `first` (continuations of paused agent sessions, oldest
program first, at most a share of the hot lane: `QasParams.continuation_share`), the hot
lane takes them before any bucket; the rest of it and the cold lane are filled as
above.

Deadline lane: requests past their admission deadline (`urgent`, earliest
deadline first) head the cold lane, ahead of the FIFO order; the caller grows q_cold
while they wait (`QasParams.cold_quota`). With one deadline target for all, earliest
deadline first is oldest first, so the deadline lane never passes over an older request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prism_proxy.qas.counters import SegmentCounters
from prism_proxy.qas.types import Lane, WaveEntry


@dataclass(frozen=True, slots=True)
class Member:
    """A queued request as the round sees it: FIFO rank, aligned skeleton, signature."""

    rid: str
    rank: int
    arrival: float
    skeleton: tuple[str, ...]
    signature: tuple[str, ...]
    deadline: float = math.inf


@dataclass(slots=True)
class Bucket:
    signature: tuple[str, ...]
    members: list[Member] = field(default_factory=list)
    score: float = 0.0

    @property
    def oldest_rank(self) -> int:
        return self.members[0].rank


def group_by_signature(members: Iterable[Member]) -> list[Bucket]:
    """Buckets of equal non-empty signatures; members must come in FIFO order.

    Requests with the empty signature are cold-only and join no bucket.
    """
    buckets: dict[tuple[str, ...], Bucket] = {}
    for member in members:
        if member.signature:
            bucket = buckets.get(member.signature)
            if bucket is None:
                bucket = buckets[member.signature] = Bucket(member.signature)
            bucket.members.append(member)
    return list(buckets.values())


def bucket_score(
    bucket: Bucket, counters: SegmentCounters, hot_capacity: int
) -> tuple[float, float]:
    """(Score(b), U(b)) for a bucket given the hot-lane capacity M − q_cold."""
    params = counters.params
    # insertion-ordered, so the float sum is identical across runs and hash seeds
    distinct = dict.fromkeys(segment for member in bucket.members for segment in member.skeleton)
    base = sum(counters.base_priority(segment) for segment in distinct)
    hot_batch = bucket.members[: max(0, hot_capacity)]
    next_total = sum(len(set(member.skeleton)) for member in hot_batch)
    # a bucket of the client's grouping hint alone has no segments: U(b) = 0
    utility = (base + params.w_n * next_total) / len(distinct) if distinct else 0.0
    return params.alpha_size * len(bucket.members) + params.beta_util * utility, utility


def scan_order(buckets: list[Bucket], counters: SegmentCounters, hot_capacity: int) -> list[Bucket]:
    """Score each bucket once; descending score, ties to the older oldest request."""
    for bucket in buckets:
        bucket.score, _ = bucket_score(bucket, counters, hot_capacity)
    return sorted(buckets, key=lambda b: (-b.score, b.oldest_rank))


def fill_wave(
    fifo: Sequence[Member],
    scan: Sequence[Bucket],
    wave_size: int,
    q_cold: int,
    urgent: Sequence[Member] = (),
    first: Sequence[Member] = (),
) -> list[WaveEntry]:
    """Release order: hot lane `first` then bucket by bucket, then the cold lane:
    `urgent` first (in the order given), then the oldest."""
    wave_size = max(0, wave_size)
    hot_capacity = max(0, wave_size - q_cold)
    chosen: set[str] = set()
    wave: list[WaveEntry] = []
    for member in first[:hot_capacity]:
        wave.append(WaveEntry(member.rid, Lane.HOT))
        chosen.add(member.rid)
    for bucket in scan:
        for member in bucket.members:
            if len(wave) >= hot_capacity:
                break
            if member.rid not in chosen:
                wave.append(WaveEntry(member.rid, Lane.HOT))
                chosen.add(member.rid)
        if len(wave) >= hot_capacity:
            break
    for member in (*urgent, *fifo):
        if len(wave) >= wave_size:
            break
        if member.rid not in chosen:
            wave.append(WaveEntry(member.rid, Lane.COLD))
            chosen.add(member.rid)
    return wave
