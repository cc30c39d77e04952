"""DART's state for one radix tree (SPEC §3): priority table, protection set, active
counts, residency of annotated nodes and stats. Tree-agnostic: the tree calls in.

Threading: only the thread that owns the tree calls the methods below, except
`inbox.submit*` (any thread), `residency_summary()` (the log's own lock) and `stats()`
(reads copies of plain dicts, which CPython makes atomically). Updates queued in the
inbox take effect at `apply_pending()`, which the owner calls between tree operations
(the start of each insert and eviction).

Protection set F_t (SPEC §3, bounded on purpose): rank the resident owners
(segments and system heads alike) with P̂_t > 0 by (P̂_t, owner), highest first; F_t is
the longest prefix of that ranking that has at most `protect` owners and whose resident
tokens total at most `protect_fraction` x the pool's capacity (`protect_cap_tokens`;
no cap when the capacity is unknown). A prefix, not a best fit: the cap only cuts
protection short, it never protects a lower-ranked owner over a higher-ranked one, so
class 2 still means "ranks above every class-1 owner". An owner larger than the cap on
its own stops protection there; P̂_t still orders it ahead of everything ranked lower.

    ranking   o1  o2  o3 | o4  o5 ...       F_t = {o1, o2, o3}
                         ^ frontier: o3 if |F_t| = protect (the lowest member), else
                           o4, the first owner that did not fit the cap; none when
                           every candidate is in F_t

F_t is a snapshot taken when an update is applied and at the start of an eviction pass
(`begin_eviction`), never per evicted node: within one pass the keys in the eviction
heap stay fixed. A pass recomputes it (O(T log f) for a table of T owners) only when
residency changed in a way that can change it (`_dirty`): F_t depends only on the
owners ranked at or above the frontier (`_floor`), so a change to the resident tokens of
an owner ranked below it (arriving, growing, shrinking, leaving) cannot change F_t and
leaves the frontier where it was; a change at or above it (a member leaving or growing
past the cap, the first misfit shrinking, a newcomer ranking above the frontier) marks
F_t stale. Without a cap only arrivals and departures matter, as token counts do not.

Retention R_t (`POST /prism/retain`): owners the proxy expects back soon (the last piece
of a paused agent session's prompt), each with a score, an expiry on this core's clock
and the tokens its path holds (the proxy's count; the owner's own resident tokens when
not given, as of the last change to the entries). R_t is the longest prefix of the live
entries ranked by (score, owner), highest first, whose tokens total at most
`retain_fraction` x the pool's capacity (like F_t's cap: a flood of sessions cannot push
everything else out first). A member
ranks after every unretained owner and before F_t; among members lower scores go first.
It is an order, never a lock: when nothing else is left, retained paths are evicted
too, so retention cannot pin the pool. Entries expire by themselves (checked at each
eviction pass) and are bounded to `MAX_RETAINED` (the lowest scores dropped first). A
retained leaf holds its whole path in the tree (only leaves are evicted), which is why
the proxy names the path's last piece: that keeps one session's history without keeping
every path through its shared head. Discarded owners (D_t: the own pieces of a finished
session, and of one whose retention was not earned) rank with private pieces, by last
access, as LRU orders them, until they leave the tree (or are retained again). The
proxy may discard an owner before its request reaches the tree; it stays until it has
been resident and left. At most `MAX_RETAINED`, the oldest dropped first.

What retention could not hold is recorded per owner (`retained_loss`, bounded the same
way): when its tokens were last evicted while it had a live entry, in R_t or left out
by R_t's cap, and when a new entry arrived for an owner with nothing resident (too
late). The re-prefill accounting (`prism_proxy.admission.reprefill`, joined in the
twin) reads it; `stats()` counts the tokens evicted over the cap and the late
retentions.

Residency (SPEC §4, `GET /prism/residency`): every segment whose resident tokens go
0 -> >0 or >0 -> 0 is recorded in a `ResidencyLog` (system heads are left out: the
proxy's QAS ranks segments only), which answers full or delta summaries.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from backend_plugin.dart.keys import (
    EvictionClass,
    EvictionPolicy,
    NodeMeta,
    eviction_class,
    eviction_key,
)
from backend_plugin.dart.priority import (
    DEFAULT_HOST_ORDER,
    DEFAULT_PROTECT,
    DEFAULT_PROTECT_FRACTION,
    DEFAULT_RETAIN_FRACTION,
    HOST_ORDERS,
    PriorityUpdate,
    Reset,
    UpdateInbox,
)
from backend_plugin.dart.residency import ResidencyLog
from prism_wire import (
    MAX_RETAINED,
    AnchorHints,
    ResidencySummary,
    Retention,
    display_owner,
    is_system_owner,
)


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
    protect_fraction: float = DEFAULT_PROTECT_FRACTION
    capacity_tokens: int | None = None
    protect_cap_tokens: int | None = None  # None: capacity unknown, no cap
    retained: int = 0  # owners in R_t
    retained_tokens: int = 0  # resident tokens of their owners
    retain_entries: int = 0  # live entries, within the cap or not
    retain_fraction: float = DEFAULT_RETAIN_FRACTION
    discarded: int = 0  # owners in D_t (ranked with private pieces)
    discards: int = 0  # discard words applied (a count)
    # tokens of owners with a live retention entry that R_t's cap left out, evicted
    over_cap_evicted_tokens: int = 0
    late_retentions: int = 0  # new retention entries for owners with nothing resident
    # of the evicted tokens, those whose KV went to the host tier (HiCache) instead of
    # being freed; None: the tree has no host tier
    host_demoted_tokens: int | None = None
    host_order: str = DEFAULT_HOST_ORDER  # how the host tier orders what it drops

    def as_dict(self) -> dict[str, Any]:
        out = {
            "policy": self.policy,
            "epoch": self.epoch,
            "protect": self.protect,
            "protect_fraction": self.protect_fraction,
            "capacity_tokens": self.capacity_tokens,
            "protect_cap_tokens": self.protect_cap_tokens,
            "table_size": self.table_size,
            # owners in F_t, heads shown as "<system:HEAD>"
            "protected_segments": [display_owner(s) for s in self.protected_segments],
            "protected_tokens": self.protected_tokens,
            "anchors_resident": self.anchors_resident,
            "annotated_tokens_resident": self.annotated_tokens_resident,
            "active_requests": self.active_requests,
            "evicted_tokens": dict(self.evicted_tokens),
            "segments_resident": self.segments_resident,
            "residency_version": self.residency_version,
            "retained": self.retained,
            "retained_tokens": self.retained_tokens,
            "retain_entries": self.retain_entries,
            "retain_fraction": self.retain_fraction,
            "discarded": self.discarded,
            "discards": self.discards,
            "over_cap_evicted_tokens": self.over_cap_evicted_tokens,
            "late_retentions": self.late_retentions,
        }
        if self.host_demoted_tokens is not None:  # only with a host tier
            out["host_demoted_tokens"] = self.host_demoted_tokens
            out["host_order"] = self.host_order
        return out


class RetainedLoss(NamedTuple):
    """What became of an owner's retention, each the latest time on DART's clock (None:
    never): its tokens evicted while it had a live entry, in R_t (`in_cap_at`) or left
    out by R_t's token cap (`over_cap_at`); a new entry for it applied when none of its
    tokens were resident (`absent_at`: lost before the retention arrived); its host copy
    dropped by the host tier while it had a live entry (`host_at`: demoted to host,
    which is no loss, then lost there)."""

    in_cap_at: float | None = None
    over_cap_at: float | None = None
    absent_at: float | None = None
    host_at: float | None = None


class DartCore:
    """Priority state and bookkeeping shared by the SGLang adapter and the simulator.

    `capacity_tokens` is the KV pool's size (the tree's adapter reads it from the pool);
    with `protect_fraction` it bounds F_t's resident tokens. None: no bound.
    """

    def __init__(
        self,
        policy: EvictionPolicy | str = EvictionPolicy.DART,
        protect: int = DEFAULT_PROTECT,
        residency: ResidencyLog | None = None,
        *,
        capacity_tokens: int | None = None,
        protect_fraction: float = DEFAULT_PROTECT_FRACTION,
        retain_fraction: float = DEFAULT_RETAIN_FRACTION,
        host_order: str = DEFAULT_HOST_ORDER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (("protect_fraction", protect_fraction),
                            ("retain_fraction", retain_fraction)):  # fmt: skip
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if host_order not in HOST_ORDERS:
            raise ValueError(f"host_order: one of {', '.join(HOST_ORDERS)}, got {host_order!r}")
        self.retain_fraction = retain_fraction
        # read by the tree when its device KV goes to host (`HOST_META_ATTR`)
        self.host_order = host_order
        self.policy = EvictionPolicy(policy)
        self.inbox = UpdateInbox()
        self.residency = residency if residency is not None else ResidencyLog()
        self._default_protect = protect
        self._protect = protect
        self.protect_fraction = protect_fraction
        self._capacity: int | None = None
        self._cap: int | None = None
        self._epoch: int | None = None
        self._table: dict[str, float] | None = None
        self._protected: frozenset[str] = frozenset()
        # the frontier (module docstring): (P̂, owner) of the lowest member when F_t is
        # full, else of the first owner that did not fit; None: every candidate counts
        self._floor: tuple[float, str] | None = None
        self._dirty = False
        self._resident_tokens: dict[str, int] = {}
        self._anchors_resident = 0
        self._active: dict[str, int] = {}
        self._requests: dict[str, frozenset[str]] = {}
        self._evicted = {c.value: 0 for c in EvictionClass}
        self.clock = clock
        # every live entry: owner -> (score, expiry on `clock`, path tokens or None)
        self._retained: dict[str, tuple[float, float, int | None]] = {}
        # (expiry, owner) of every entry given, superseded ones included (lazy deletion)
        self._expiries: list[tuple[float, str]] = []
        # R_t, the entries within the cap: owner -> score (what the keys read)
        self._retaining: dict[str, float] = {}
        # D_t: owners ranked with private pieces -> when discarded (oldest first)
        self._discarded: dict[str, float] = {}
        self._discards = 0
        # owners retained and lost -> when (`RetainedLoss`; the oldest dropped past
        # MAX_RETAINED): what the re-prefill accounting (`reprefill`) reads
        self._lost_retained: dict[str, RetainedLoss] = {}
        self._over_cap_evicted = 0
        self._late_retentions = 0
        self._host_demoted: int | None = None  # counted once the tree has a host tier
        self.set_capacity(capacity_tokens)

    # ---- capacity -------------------------------------------------------------------
    def set_capacity(self, capacity_tokens: int | None) -> None:
        """The KV pool's size in tokens (None: unknown, F_t is not bounded by it)."""
        if capacity_tokens is not None and capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        self._capacity = capacity_tokens
        fraction = self.protect_fraction
        self._cap = None if capacity_tokens is None else int(fraction * capacity_tokens)
        self._dirty = True
        self._refresh_retention()  # R_t's cap moved too

    @property
    def capacity_tokens(self) -> int | None:
        return self._capacity

    @property
    def protect_cap_tokens(self) -> int | None:
        """Most resident tokens F_t may hold (None: no bound)."""
        return self._cap

    # ---- priority table -------------------------------------------------------------
    def apply_pending(self) -> bool:
        """Apply the updates queued since the last call; True if anything changed."""
        pending = self.inbox.drain()
        for item in pending:
            if isinstance(item, Reset):
                self._table, self._epoch, self._protect = None, None, self._default_protect
                self._retained.clear()
                self._expiries.clear()
                self._retaining = {}
                self._discarded.clear()
            elif isinstance(item, Retention):
                self._retain(item)
            else:
                self._apply(item)
        if pending:
            self._refresh_protection()
        return bool(pending)

    def _apply(self, update: PriorityUpdate) -> None:
        # a plain dict: the eviction key reads it once per leaf per pass
        self._table, self._epoch = dict(update.table), update.epoch
        self._protect = update.protect

    def _retain(self, retention: Retention) -> None:
        for owner in retention.release:
            self._retained.pop(owner, None)
        now = self.clock()
        for owner, (score, ttl, tokens) in retention.retain.items():
            if owner not in self._retained and owner not in self._resident_tokens:
                self._lose(owner, "absent_at", now)  # nothing left to keep
                self._late_retentions += 1
            self._retained[owner] = (score, now + ttl, tokens)
            heapq.heappush(self._expiries, (now + ttl, owner))
            self._discarded.pop(owner, None)
        for owner in retention.discard:
            self._retained.pop(owner, None)
            self._discarded.pop(owner, None)
            self._discarded[owner] = now  # the latest last (the bound drops the oldest)
            self._discards += 1
        while len(self._discarded) > MAX_RETAINED:
            del self._discarded[next(iter(self._discarded))]
        excess = len(self._retained) - MAX_RETAINED
        if excess > 0:
            lowest = heapq.nsmallest(excess, self._retained.items(), key=lambda kv: kv[1][0])
            for owner, _ in lowest:
                del self._retained[owner]
        if len(self._expiries) > 2 * len(self._retained) + 1024:  # superseded ones pile up
            self._expiries = [(e[1], o) for o, e in self._retained.items()]
            heapq.heapify(self._expiries)
        self._refresh_retention()

    def _refresh_retention(self) -> None:
        """R_t from the live entries: the longest prefix by (score, owner) within the cap."""
        kept = self._retained
        if not kept:
            self._retaining = {}
            return
        cap = None if self._capacity is None else int(self.retain_fraction * self._capacity)
        if cap is None:
            self._retaining = {owner: entry[0] for owner, entry in kept.items()}
            return
        resident = self._resident_tokens
        chosen: dict[str, float] = {}
        used = 0
        for owner, (score, _, tokens) in sorted(
            kept.items(), key=lambda kv: (kv[1][0], kv[0]), reverse=True
        ):
            used += tokens if tokens is not None else resident.get(owner, 0)
            if used > cap:
                break
            chosen[owner] = score
        self._retaining = chosen

    def begin_eviction(self) -> None:
        """Call once at the start of an eviction pass (snapshot of F_t, expiry of R_t)."""
        if not self.apply_pending() and self._dirty:
            self._refresh_protection()
        expiries = self._expiries
        if expiries and expiries[0][0] <= self.clock():
            now, retained, changed = self.clock(), self._retained, False
            while expiries and expiries[0][0] <= now:
                until, owner = heapq.heappop(expiries)
                entry = retained.get(owner)
                if entry is not None and entry[1] == until:  # not superseded since
                    del retained[owner]
                    changed = True
            if changed:
                self._refresh_retention()

    @property
    def retained(self) -> Mapping[str, float]:
        """R_t: owner -> score, the live entries within the cap (the keys' view)."""
        return self._retaining

    @property
    def retain_cap_tokens(self) -> int | None:
        """Most path tokens R_t may hold (None: capacity unknown, no bound)."""
        return None if self._capacity is None else int(self.retain_fraction * self._capacity)

    def _protecting(self) -> bool:
        return self._table is not None and self._protect > 0 and self._cap != 0

    def _refresh_protection(self) -> None:
        self._dirty = False
        table = self._table
        if table is None or not self._protecting():
            self._protected, self._floor = frozenset(), None
            return
        resident, cap, protect = self._resident_tokens, self._cap, self._protect
        candidates = (
            (score, owner) for owner, score in table.items() if score > 0 and owner in resident
        )
        chosen: list[tuple[float, str]] = []
        misfit: tuple[float, str] | None = None
        used = 0
        # the first protect + 1 are enough: F_t is a prefix of at most `protect`
        for ranked in heapq.nlargest(protect + 1, candidates):
            if len(chosen) == protect:
                break
            tokens = resident[ranked[1]]
            if cap is not None and used + tokens > cap:
                misfit = ranked
                break
            chosen.append(ranked)
            used += tokens
        self._protected = frozenset(owner for _, owner in chosen)
        self._floor = chosen[-1] if len(chosen) == protect else misfit

    def _tokens_changed(self, owner: str, before: int, after: int) -> None:
        """Mark F_t stale if `owner`'s resident tokens going `before` -> `after` can
        change it (module docstring)."""
        table = self._table
        if self._dirty or table is None or not self._protecting():
            return
        if self._cap is None and (before > 0) == (after > 0):
            return  # without a cap only arriving and leaving matter
        score = table.get(owner, 0.0)
        if score <= 0:
            return  # never a candidate
        floor = self._floor
        self._dirty = floor is None or (score, owner) >= floor

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
            retained=self._retaining,
            discarded=self._discarded,
        )

    # ---- residency and requests ----------------------------------------------------
    def on_assign(self, old: NodeMeta | None, new: NodeMeta | None, num_tokens: int) -> None:
        """A resident node of `num_tokens` changes its metadata from `old` to `new`."""
        self._count_anchor(old, -1)
        self._count_anchor(new, 1)
        old_owner = old.owner if old is not None else None
        new_owner = new.owner if new is not None else None
        if old_owner != new_owner:  # same owner (an anchor flag set): its tokens stay
            self._account(old_owner, -num_tokens)
            self._account(new_owner, num_tokens)

    def use_host_tier(self) -> None:
        """The tree keeps a host copy of what it may evict (SGLang's HiCache)."""
        if self._host_demoted is None:
            self._host_demoted = 0

    def on_evicted(self, meta: NodeMeta | None, num_tokens: int, *, to_host: bool = False) -> None:
        """A resident node of `num_tokens` left the device: freed, or (`to_host`) demoted
        to the host tier, from which a later request loads it instead of prefilling it
        (so a retained owner's demotion is not a loss)."""
        kind = eviction_class(meta, self._protected, self._retaining)
        self._evicted[kind.value] += num_tokens
        if to_host and self._host_demoted is not None:
            self._host_demoted += num_tokens
        owner = meta.owner if meta is not None else None
        if owner is not None and owner in self._retained and not to_host:
            # a live entry in R_t, or one R_t's cap left out
            within = owner in self._retaining
            self._lose(owner, "in_cap_at" if within else "over_cap_at", self.clock())
            self._over_cap_evicted += 0 if within else num_tokens
        if meta is not None:
            self._count_anchor(meta, -1)
            self._account(meta.owner, -num_tokens)

    def on_host_evicted(self, meta: NodeMeta | None, num_tokens: int) -> None:
        """The host tier dropped a copy of `num_tokens` whose node had `meta`'s owner on
        the device (`HOST_META_ATTR`): a retained owner's history is lost there."""
        owner = meta.owner if meta is not None else None
        if owner is not None and owner in self._retained:
            self._lose(owner, "host_at", self.clock())

    def _lose(self, owner: str, field: str, now: float) -> None:
        lost = self._lost_retained
        before = lost.pop(owner, RetainedLoss())
        lost[owner] = before._replace(**{field: now})  # the latest last
        while len(lost) > MAX_RETAINED:  # the bound drops the oldest
            del lost[next(iter(lost))]

    def _count_anchor(self, meta: NodeMeta | None, delta: int) -> None:
        if meta is not None and meta.is_anchor:
            self._anchors_resident += delta

    def _account(self, owner: str | None, delta: int) -> None:
        if owner is None:
            return
        before = self._resident_tokens.get(owner, 0)
        left = before + delta
        if left > 0:
            self._resident_tokens[owner] = left
        else:
            self._resident_tokens.pop(owner, None)
            self._discarded.pop(owner, None)  # it left the tree: D_t forgets it
        self._tokens_changed(owner, before, left)
        if (before > 0) != (left > 0) and not is_system_owner(owner):
            self.residency.record(owner, left > 0)

    def clear_residency(self) -> None:
        """The tree was emptied (flush)."""
        self._resident_tokens.clear()
        self._discarded.clear()
        self._anchors_resident = 0
        self._protected, self._floor, self._dirty = frozenset(), None, False
        self.residency.clear()

    def residency_summary(self, generation: str | None, since: int | None) -> ResidencySummary:
        """Resident segments for the proxy: a delta since `since` when `generation`
        names this core and `since` is still answerable, else the full set (any thread)."""
        return self.residency.summary(generation, since)

    def request_started(self, rid: str, hints: AnchorHints) -> None:
        """Count the request in a_t of its segments (idempotent per rid)."""
        if rid in self._requests:
            return
        owners = hints.owners
        self._requests[rid] = owners
        for owner in owners:
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

    def retained_loss(self, owner: str) -> RetainedLoss:
        """What became of `owner`'s retention (`RetainedLoss`; as far as the bounded
        record reaches)."""
        return self._lost_retained.get(owner, RetainedLoss())

    # ---- stats ----------------------------------------------------------------------
    def stats(self) -> DartStats:
        resident = dict(self._resident_tokens)
        protected = self._protected
        table = self._table
        return DartStats(
            policy=self.policy.value,
            epoch=self._epoch,
            protect=self._protect,
            protect_fraction=self.protect_fraction,
            capacity_tokens=self._capacity,
            protect_cap_tokens=self._cap,
            table_size=len(table) if table is not None else 0,
            protected_segments=tuple(sorted(protected)),
            protected_tokens=sum(resident.get(o, 0) for o in protected),
            anchors_resident=self._anchors_resident,
            annotated_tokens_resident=sum(resident.values()),
            active_requests=len(self._requests),
            evicted_tokens=MappingProxyType(dict(self._evicted)),
            segments_resident=len(self.residency),
            residency_version=self.residency.version,
            retained=len(self._retaining),
            retained_tokens=sum(resident.get(o, 0) for o in self._retaining),
            retain_entries=len(self._retained),
            retain_fraction=self.retain_fraction,
            discarded=len(self._discarded),
            discards=self._discards,
            over_cap_evicted_tokens=self._over_cap_evicted,
            late_retentions=self._late_retentions,
            host_demoted_tokens=self._host_demoted,
            host_order=self.host_order,
        )
