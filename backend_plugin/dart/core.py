"""DART's state for one radix tree (SPEC §3): priority table, protection set, active
counts, residency of annotated nodes and stats. Tree-agnostic: the tree calls in.

Threading: only the thread that owns the tree calls the methods below, except
`inbox.submit*` (any thread), `residency_summary()` (the log's own lock) and `stats()`
(reads copies of plain dicts, which CPython makes atomically). Updates queued in the
inbox take effect at `apply_pending()`, which the owner calls between tree operations
(the start of each insert and eviction).

Protection set F_t: the top-`protect` resident reusable owners by P̂_t, among the
system prompt and the segments present in the table. It is a snapshot taken when an
update is applied and at the start of an eviction pass (`begin_eviction`), never per
evicted node: within one pass the keys in the eviction heap stay fixed. A pass only
recomputes it (O(T log f) for a table of T segments) when residency changed in a way
that can change it: a member left the tree, or a candidate that would rank in it
arrived.

Residency (SPEC §4, `GET /prism/residency`): every segment whose resident tokens go
0 -> >0 or >0 -> 0 is recorded in a `ResidencyLog` (the system prompt is not a
segment the proxy ranks and is left out), which answers full or delta summaries.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from backend_plugin.dart.anchors import AnchorHints, AnchorKind
from backend_plugin.dart.keys import (
    SYSTEM_OWNER,
    EvictionClass,
    EvictionPolicy,
    NodeMeta,
    eviction_class,
    eviction_key,
    priority_of,
)
from backend_plugin.dart.priority import DEFAULT_PROTECT, PriorityUpdate, Reset, UpdateInbox
from backend_plugin.dart.residency import ResidencyLog, ResidencyReport


@dataclass(frozen=True, slots=True)
class DartStats:
    """What `/prism/stats` and `/prism/metrics` report."""

    policy: str
    epoch: int | None
    protect: int
    table_size: int
    protected_segments: tuple[str, ...]
    protected_tokens: int
    anchors_resident: int
    annotated_tokens_resident: int
    active_requests: int
    evicted_tokens: Mapping[str, int]
    segments_resident: int = 0
    residency_version: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "epoch": self.epoch,
            "protect": self.protect,
            "table_size": self.table_size,
            "protected_segments": [
                "<system>" if s == SYSTEM_OWNER else s for s in self.protected_segments
            ],
            "protected_tokens": self.protected_tokens,
            "anchors_resident": self.anchors_resident,
            "annotated_tokens_resident": self.annotated_tokens_resident,
            "active_requests": self.active_requests,
            "evicted_tokens": dict(self.evicted_tokens),
            "segments_resident": self.segments_resident,
            "residency_version": self.residency_version,
        }


class DartCore:
    """Priority state and bookkeeping shared by the SGLang adapter and the simulator."""

    def __init__(
        self,
        policy: EvictionPolicy | str = EvictionPolicy.DART,
        protect: int = DEFAULT_PROTECT,
        residency: ResidencyLog | None = None,
    ) -> None:
        self.policy = EvictionPolicy(policy)
        self.inbox = UpdateInbox()
        self.residency = residency if residency is not None else ResidencyLog()
        self._default_protect = protect
        self._protect = protect
        self._epoch: int | None = None
        self._table: dict[str, float] | None = None
        self._protected: frozenset[str] = frozenset()
        self._floor: tuple[float, str] | None = None  # lowest (P̂, owner) in a full F_t
        self._dirty = False
        self._resident_tokens: dict[str, int] = {}
        self._anchors_resident = 0
        self._active: dict[str, int] = {}
        self._requests: dict[str, frozenset[str]] = {}
        self._evicted = {c.value: 0 for c in EvictionClass}

    # ---- priority table -------------------------------------------------------------
    def apply_pending(self) -> bool:
        """Apply the updates queued since the last call; True if anything changed."""
        pending = self.inbox.drain()
        for item in pending:
            if isinstance(item, Reset):
                self._table, self._epoch, self._protect = None, None, self._default_protect
            else:
                self._apply(item)
        if pending:
            self._refresh_protection()
        return bool(pending)

    def _apply(self, update: PriorityUpdate) -> None:
        # a plain dict: the eviction key reads it once per leaf per pass
        self._table, self._epoch = dict(update.table), update.epoch
        self._protect = update.protect

    def begin_eviction(self) -> None:
        """Call once at the start of an eviction pass (snapshot of F_t)."""
        if not self.apply_pending() and self._dirty:
            self._refresh_protection()

    def _refresh_protection(self) -> None:
        self._dirty = False
        table = self._table
        if table is None or self._protect == 0:
            self._protected, self._floor = frozenset(), None
            return
        resident = self._resident_tokens
        candidates = [o for o in table if resident.get(o, 0) > 0]
        if resident.get(SYSTEM_OWNER, 0) > 0:
            candidates.append(SYSTEM_OWNER)
        ranked = heapq.nlargest(self._protect, ((priority_of(o, table), o) for o in candidates))
        self._protected = frozenset(o for _, o in ranked)
        self._floor = ranked[-1] if len(ranked) == self._protect else None

    def _residency_changed(self, owner: str, resident: bool) -> None:
        """Mark F_t stale if `owner` entering/leaving the tree can change it."""
        table = self._table
        if table is None or self._protect == 0:
            return
        if not resident:
            self._dirty |= owner in self._protected
        elif owner == SYSTEM_OWNER or owner in table:
            floor = self._floor
            self._dirty |= floor is None or (priority_of(owner, table), owner) > floor

    @property
    def table(self) -> Mapping[str, float] | None:
        return self._table

    @property
    def protected(self) -> frozenset[str]:
        return self._protected

    # ---- keys ---------------------------------------------------------------------
    def key(self, meta: NodeMeta | None, last_access_time: float, hit_count: int = 0) -> Any:
        """Eviction key of a node under the configured policy (smallest first)."""
        return eviction_key(
            self.policy,
            meta,
            last_access_time,
            hit_count,
            table=self._table,
            protected=self._protected,
            active=self._active,
        )

    # ---- residency and requests ----------------------------------------------------
    def on_assign(self, old: NodeMeta | None, new: NodeMeta | None, num_tokens: int) -> None:
        """A resident node of `num_tokens` changes its metadata from `old` to `new`."""
        self._account(old, -num_tokens)
        self._account(new, num_tokens)

    def on_evicted(self, meta: NodeMeta | None, num_tokens: int) -> None:
        self._evicted[eviction_class(meta, self._protected).value] += num_tokens
        self._account(meta, -num_tokens)

    def _account(self, meta: NodeMeta | None, delta: int) -> None:
        if meta is None:
            return
        if meta.is_anchor:
            self._anchors_resident += 1 if delta > 0 else -1
        owner = meta.owner
        if owner is not None:
            before = self._resident_tokens.get(owner, 0)
            left = before + delta
            if left > 0:
                self._resident_tokens[owner] = left
            else:
                self._resident_tokens.pop(owner, None)
            if (before > 0) != (left > 0):
                self._residency_changed(owner, left > 0)
                if owner != SYSTEM_OWNER:
                    self.residency.record(owner, left > 0)

    def clear_residency(self) -> None:
        """The tree was emptied (flush)."""
        self._resident_tokens.clear()
        self._anchors_resident = 0
        self._protected, self._floor, self._dirty = frozenset(), None, False
        self.residency.clear()

    def residency_summary(self, generation: str | None, since: int | None) -> ResidencyReport:
        """Resident segments for the proxy: a delta since `since` when `generation`
        names this core and `since` is still answerable, else the full set (any thread)."""
        return self.residency.summary(generation, since)

    def request_started(self, rid: str, hints: AnchorHints) -> None:
        """Count the request in a_t of its segments (idempotent per rid)."""
        if rid in self._requests:
            return
        owners = (
            {SYSTEM_OWNER} if any(a.kind is AnchorKind.SYSTEM for a in hints.anchors) else set()
        )
        owners |= hints.segment_ids
        frozen = frozenset(owners)
        self._requests[rid] = frozen
        for owner in frozen:
            self._active[owner] = self._active.get(owner, 0) + 1

    def request_finished(self, rid: str) -> None:
        for owner in self._requests.pop(rid, frozenset()):
            left = self._active.get(owner, 0) - 1
            if left > 0:
                self._active[owner] = left
            else:
                self._active.pop(owner, None)

    def active_count(self, owner: str) -> int:
        return self._active.get(owner, 0)

    # ---- stats ----------------------------------------------------------------------
    def stats(self) -> DartStats:
        resident = dict(self._resident_tokens)
        protected = self._protected
        table = self._table
        return DartStats(
            policy=self.policy.value,
            epoch=self._epoch,
            protect=self._protect,
            table_size=len(table) if table is not None else 0,
            protected_segments=tuple(sorted(protected)),
            protected_tokens=sum(resident.get(o, 0) for o in protected),
            anchors_resident=self._anchors_resident,
            annotated_tokens_resident=sum(resident.values()),
            active_requests=len(self._requests),
            evicted_tokens=MappingProxyType(dict(self._evicted)),
            segments_resident=len(self.residency),
            residency_version=self.residency.version,
        )
