"""The PRISM policy: one QAS round (SPEC §2) and the DART table P̂_t (SPEC §3), system
heads included (`counters.head_priorities`).

Beyond the paper (each switchable in `QasParams`): canonical tie-breaking,
residency c_t in P_t, a deadline lane at the head of the cold lane, precedence for
continuations of agent sessions, and the backlog order: while the queue backs up, the
longest cached prefix first within an age cap (`backlog_wave`).

With residency on, a request's skeleton starts with its **cached path**: the longest
run of its segments that the policy dispatched before in that order after the same
head (`paths`, a bounded view of what it released), each still resident. Where several
continue the path, the higher P_t (then the more recent) wins. The rest is front-aligned
as in the paper, with the front widened to every resident segment (c_t puts them ahead
of merely queued ones): the paper keeps `f_front` small because lower-ranked documents
are unstable and reordering them risks hits, and resident segments are the stable ones.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from prism_proxy.qas.alignment import front_align, signature
from prism_proxy.qas.buckets import Bucket, Member, fill_wave, group_by_signature, scan_order
from prism_proxy.qas.counters import SegmentCounters
from prism_proxy.qas.params import QasParams
from prism_proxy.qas.residency import (
    CacheView,
    NoResidency,
    PendingResidency,
    Residency,
    ViewResidency,
)
from prism_proxy.qas.residency import ViewNode as CacheViewNode
from prism_proxy.qas.types import (
    ActiveRequest,
    BucketView,
    Lane,
    QueuedRequest,
    RoundPlan,
    WaveEntry,
    fifo_order,
)

# The signature of requests grouped only by the client's hint (`QueuedRequest.group`): a
# namespace no segment id enters (NUL first).
GROUP_PREFIX = "\x00group:"
# Nodes one cached-path search may visit (a request's segments seldom branch in the view).
PATH_SEARCH_NODES = 64


def _expand(heads: Sequence[str], by_head: dict[str, tuple[str, ...]]) -> list[str]:
    """Unit heads in order → their units' segments in order."""
    return [segment for head in heads for segment in by_head[head]]


class PrismPolicy:
    """QAS: counters → front alignment → signatures → buckets → scores → wave.

    Every round recomputes from its snapshot; the only state kept across rounds is
    what the backend's cache holds: the residency source and, with residency on, the
    view of dispatched paths.
    """

    name = "prism"
    reorders = True

    def __init__(self, params: QasParams, residency: Residency | None = None) -> None:
        self.params = params
        self.paths = (
            CacheView(params.cache_view_tokens, params.cache_view_bytes) if params.w_c > 0 else None
        )
        if residency is None:
            residency = NoResidency() if self.paths is None else ViewResidency(self.paths)
        self.residency = residency  # a driver that can ask DART replaces it

    @property
    def cache_view(self) -> CacheView | None:
        """The view of dispatched paths (None without residency)."""
        return self.paths

    def align(
        self,
        request: QueuedRequest,
        priority: Callable[[str], float],
        resident: frozenset[str],
    ) -> tuple[str, ...]:
        """Π*_i: the cached path, then front alignment of the rest, moving whole units
        (a segment and the ones glued to it)."""
        params = self.params
        if not request.reorder:
            return tuple(request.segments)
        lead, units, fixed = request.split_fixed()
        by_head = {unit[0]: unit for unit in units}

        def unit_priority(head: str) -> float:
            return max(priority(s) for s in by_head[head])

        heads = list(by_head)
        if not resident or self.paths is None:
            front = front_align(heads, unit_priority, params.f_front, params.canonical_ties)
            return (*lead, *_expand(front, by_head), *fixed)
        path = self.cached_path(request, priority, resident, units, lead)
        on_path = set(path)
        rest = [h for h in heads if h not in on_path]
        in_front = sum(1 for h in rest if all(s in resident for s in by_head[h]))
        front_size = max(params.f_front - len(path), in_front)
        aligned = front_align(rest, unit_priority, front_size, params.canonical_ties)
        return (*lead, *path, *_expand(aligned, by_head), *fixed)

    def cached_path(
        self,
        request: QueuedRequest,
        priority: Callable[[str], float],
        resident: frozenset[str],
        units: Sequence[tuple[str, ...]] | None = None,
        lead: Sequence[str] = (),
    ) -> tuple[str, ...]:
        """The longest (in tokens) dispatched run of the request's resident units
        after its head (and its `lead`, the segments that stay in front); equal lengths
        go to higher priorities, then more recent paths. A depth-first search over the
        view, bounded to `PATH_SEARCH_NODES` nodes. `units` default to the request's
        segments one by one."""
        assert self.paths is not None
        head = self.paths.head_node(request)
        for segment in lead:
            head = head.children.get("seg:" + segment) if head is not None else None
        if head is None:
            return ()
        tokens = {s: request.segment_length(i) for i, s in enumerate(request.segments)}
        if units is None:
            units = [(s,) for s in request.segments]
        candidates = [u for u in units if all(s in resident for s in u)]
        best: tuple[tuple[int, float, int], tuple[str, ...]] = ((0, 0.0, 0), ())
        budget = PATH_SEARCH_NODES
        stack: list[tuple[CacheViewNode, tuple[str, ...], int, float]] = [(head, (), 0, 0.0)]
        while stack and budget > 0:
            node, path, length, score = stack.pop()
            budget -= 1
            key = (length, score, node.last_used)
            if key > best[0]:
                best = (key, path)
            for unit in candidates:
                if unit[0] in path:
                    continue
                child: CacheViewNode | None = node
                for segment in unit:
                    child = child.children.get("seg:" + segment) if child is not None else None
                if child is not None:
                    longer = length + sum(tokens[s] for s in unit)
                    gained = score + sum(priority(s) for s in unit)
                    stack.append((child, (*path, *unit), longer, gained))
        return best[1]

    def continuations(
        self, fifo: Sequence[QueuedRequest], members: Sequence[Member], hot_capacity: int
    ) -> list[Member]:
        """The continuations of paused agent sessions the hot lane takes first: oldest
        program first, at most ⌈continuation_share · hot capacity⌉ of them."""
        share = self.params.continuation_share
        if share <= 0 or hot_capacity <= 0:
            return []
        marked = [
            (request.program_start, member.rank, member)
            for request, member in zip(fifo, members, strict=True)
            if request.program_start is not None
        ]
        if not marked:
            return []
        marked.sort(key=lambda item: (item[0], item[1]))
        return [member for _, _, member in marked[: math.ceil(share * hot_capacity)]]

    def cached_tokens(
        self, request: QueuedRequest, skeleton: Sequence[str], resident: frozenset[str]
    ) -> int:
        """The request's cached prefix in `skeleton` order, as the proxy knows it: its
        head when the view holds it, then each segment while the view holds the path and
        the segment is resident."""
        node = self.paths.head_node(request) if self.paths is not None else None
        if node is None:
            return 0
        lengths = {s: request.segment_length(i) for i, s in enumerate(request.segments)}
        cached = request.head_tokens
        for segment in skeleton:
            node = node.children.get("seg:" + segment) if segment in resident else None
            if node is None:
                break
            cached += lengths[segment]
        return cached

    def backlog_wave(
        self,
        fifo: Sequence[QueuedRequest],
        members: Sequence[Member],
        resident: frozenset[str],
        wave_size: int,
        now: float,
    ) -> list[WaveEntry]:
        """The wave under a backlog: the requests that waited `age_cap_ms` first, oldest
        first (cold lane), then the others by their cached prefix, longest first, ties
        to the older (hot lane)."""
        cap = now - self.params.age_cap_ms / 1000.0
        aged = [member for member in members if member.arrival <= cap]
        room = max(0, wave_size - len(aged))
        young = [
            (-self.cached_tokens(request, member.skeleton, resident), member.rank, member)
            for request, member in zip(fifo, members, strict=True)
            if member.arrival > cap
        ]
        longest = heapq.nsmallest(room, young, key=lambda item: (item[0], item[1]))
        return [
            *(WaveEntry(member.rid, Lane.COLD) for member in aged[:wave_size]),
            *(WaveEntry(member.rid, Lane.HOT) for _, _, member in longest),
        ]

    def backlogged(self, fifo: Sequence[QueuedRequest], now: float) -> bool:
        """Whether the oldest queued request has waited `backlog_ms` (0: never)."""
        wait_ms = self.params.backlog_ms
        return wait_ms > 0 and bool(fifo) and (now - fifo[0].arrival) * 1000.0 >= wait_ms

    def plan_round(
        self,
        queue: Sequence[QueuedRequest],
        active: Sequence[ActiveRequest],
        wave_size: int,
        now: float | None = None,
    ) -> RoundPlan:
        """One round over a snapshot; `now` (the clock of `arrival`) drives the deadline
        lane, which is off without it."""
        params = self.params
        resident = self.residency.resident() if params.w_c > 0 else frozenset()
        counters = SegmentCounters.snapshot(queue, active, params, resident)
        priorities = counters.base_priorities()
        priority = priorities.__getitem__
        fifo = fifo_order(queue)
        members = []
        for rank, request in enumerate(fifo):
            skeleton = self.align(request, priority, resident)
            sig = signature(skeleton, priority, params.kappa, params.canonical_ties)
            if not sig and request.group:  # nothing reusable found: the client's hint
                sig = (GROUP_PREFIX + request.group,)
            members.append(
                Member(
                    rid=request.rid,
                    rank=rank,
                    arrival=request.arrival,
                    skeleton=skeleton,
                    signature=sig,
                    deadline=request.deadline,
                )
            )
        scan: list[Bucket] = []  # no buckets while the backlog order decides
        if now is not None and self.backlogged(fifo, now):
            wave = self.backlog_wave(fifo, members, resident, wave_size, now)
        else:
            urgent = (
                sorted(
                    (m for m in members if m.deadline <= now), key=lambda m: (m.deadline, m.rank)
                )
                if now is not None
                else []
            )
            q_cold = params.cold_quota(wave_size, len(urgent)) if urgent else params.q_cold
            hot_capacity = max(0, wave_size - q_cold)
            scan = scan_order(group_by_signature(members), counters, hot_capacity)
            first = self.continuations(fifo, members, hot_capacity)
            wave = fill_wave(members, scan, wave_size, q_cold, urgent, first)
        skeletons = {m.rid: m.skeleton for m in members}
        by_rid = {request.rid: request for request in fifo}
        if self.paths is not None:
            for entry in wave:
                self.paths.insert(by_rid[entry.rid], skeletons[entry.rid])
        if isinstance(self.residency, PendingResidency):
            for entry in wave:
                self.residency.released(skeletons[entry.rid])
        return RoundPlan(
            priorities=priorities,
            skeletons=skeletons,
            signatures={m.rid: m.signature for m in members},
            buckets=[
                BucketView(b.signature, tuple(m.rid for m in b.members), b.score) for b in scan
            ],
            wave=wave,
            dispatch_priorities=counters.dispatch_table(
                (skeletons[e.rid] for e in wave), (by_rid[e.rid].head for e in wave)
            ),
        )
