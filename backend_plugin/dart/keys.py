"""Node metadata and the eviction keys of SPEC §3; smallest key is evicted first.

Pure functions: the caller passes the node's metadata, its last access time and hit
count, and the current priority state. Keys of one policy are mutually comparable.

    dart        (0, 0,            last)   private suffix or unannotated node
                (1, P̂_t(seg(u)), last)   reusable node, not protected
                (2, score(seg(u)), last)  reusable node whose owner is in R_t (retained)
                (3, P̂_t(seg(u)), last)   reusable node whose segment is in F_t
                an owner discarded (D_t: a finished session's own pieces, a pause
                its client did not earn retention for) and not in F_t ranks with
                private suffixes, (0, 0, last)
                no table yet -> (0, 0, last) for every node but retained ones, i.e.
                exactly LRU when nothing is retained
                R_t above every unprotected owner, demanded or not: measured on
                agent_sessions, ranking what the last wave demanded (P̂_t > 0) above
                R_t cost 1.4 points of hit rate and 1.1 s of P99 TTFT at half the pool
                (a finished session's path stays in the table until the next wave).
                What keeps a flood of sessions from buying this class is the
                proxy: retention is earned by each client's returns
                (prism_proxy/admission/credit.py); R_t's cap (core.py) bounds the
                rest.
    lru         last
    lru+active  (a_t(seg(u)), last)
    lfu         (hit_count, last)

Every owner is ranked the same way: a segment by its id, a system head by its own
owner `system_owner(head id)` (anchors.py), each with its table entry P̂_t; an owner
missing from the table has P̂_t = 0.

Deviation from SPEC §3 on purpose: SPEC says the system prompt counts as a
segment "whose priority is always the highest". With that rule every system head was
protected whatever its demand, so a client sending ~1.75 req/s of unique 16k-character
system prompts pinned 414k of a 432k-token pool and a steady client's hit ratio fell
from 100 % to 75 %. Here a head earns priority from demand, exactly like a segment: the
proxy counts a_t, n_t, g_t over the requests carrying it and pushes its P̂_t in the
table (a shared head in use ranks with the busiest segments; a one-off head that has
finished ranks 0), and protection (F_t, core.py) is bounded by a share of the pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from prism_wire import AnchorKind, system_owner


class EvictionPolicy(StrEnum):
    DART = "dart"
    LRU = "lru"
    LRU_ACTIVE = "lru+active"
    LFU = "lfu"


class EvictionClass(StrEnum):
    """Stats classes of evicted tokens (label `class` of the metrics)."""

    PRIVATE = "private"
    SEGMENT = "segment"
    PROTECTED = "protected"
    RETAINED = "retained"


@dataclass(frozen=True, slots=True)
class NodeMeta:
    """What a radix node holds: the piece kind, its owner `seg(u)`, and whether the node
    ends exactly at the piece's anchor offset."""

    kind: AnchorKind
    segment_id: str | None
    is_anchor: bool = False
    # `seg(u)`: the segment id, `system_owner(id)` for a system head, None if private
    # (derived; a field so the eviction key reads it without a call)
    owner: str | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind is AnchorKind.SYSTEM:
            owner: str | None = system_owner(self.segment_id)
        elif self.kind is AnchorKind.SEGMENT:
            owner = self.segment_id
        else:
            owner = None
        object.__setattr__(self, "owner", owner)

    def as_prefix(self) -> NodeMeta:
        """Metadata of the upper half of a split: same owner, no longer at the anchor."""
        return self if not self.is_anchor else NodeMeta(self.kind, self.segment_id, False)


def dart_key(
    meta: NodeMeta | None,
    last_access_time: float,
    table: Mapping[str, float] | None,
    protected: frozenset[str],
    retained: Mapping[str, float] | None = None,
    discarded: Mapping[str, float] | None = None,
) -> tuple[int, float, float]:
    owner = meta.owner if meta is not None else None
    if owner is None or (discarded and owner in discarded and owner not in protected):
        return (0, 0.0, last_access_time)
    if owner in protected:
        return (3, table.get(owner, 0.0) if table is not None else 0.0, last_access_time)
    if retained and owner in retained:
        return (2, retained[owner], last_access_time)
    if table is None:
        return (0, 0.0, last_access_time)
    return (1, table.get(owner, 0.0), last_access_time)


def lru_active_key(
    meta: NodeMeta | None, last_access_time: float, active: Mapping[str, int]
) -> tuple[int, float]:
    owner = meta.owner if meta is not None else None
    return (active.get(owner, 0) if owner is not None else 0, last_access_time)


def eviction_key(
    policy: EvictionPolicy,
    meta: NodeMeta | None,
    last_access_time: float,
    hit_count: int,
    *,
    table: Mapping[str, float] | None,
    protected: frozenset[str],
    active: Mapping[str, int],
    retained: Mapping[str, float] | None = None,
    discarded: Mapping[str, float] | None = None,
) -> Any:
    """The key of `policy` for one node (see the module docstring)."""
    if policy is EvictionPolicy.DART:
        return dart_key(meta, last_access_time, table, protected, retained, discarded)
    if policy is EvictionPolicy.LRU_ACTIVE:
        return lru_active_key(meta, last_access_time, active)
    if policy is EvictionPolicy.LFU:
        return (hit_count, last_access_time)
    return last_access_time


def eviction_class(
    meta: NodeMeta | None,
    protected: frozenset[str],
    retained: Mapping[str, float] | None = None,
) -> EvictionClass:
    owner = meta.owner if meta is not None else None
    if owner is None:
        return EvictionClass.PRIVATE
    if owner in protected:
        return EvictionClass.PROTECTED
    if retained and owner in retained:
        return EvictionClass.RETAINED
    return EvictionClass.SEGMENT
