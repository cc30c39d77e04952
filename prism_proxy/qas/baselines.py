"""Baseline admission policies behind the same interface as QAS (SPEC §5).

* `fifo`: arrival order, what native SGLang sees with no proxy.
* `continuum-style`: program-level FCFS (Continuum, arXiv 2511.02230): a continuation of
  a paused agent session goes by its program's start, so older programs finish first.
  With the proxy's session features it also pins each paused session's history in DART
  for a time-to-live (`admission.sessions`); without them it is `fifo`.
* `klpm`: k-LPM: repeat { the oldest request; then k−1 times the request with the
  longest prefix match against the proxy's cache view }. No reordering.
* `contextpilot-style`: reorder each request so segments believed cached come first
  (along the view's most recently used path), group by first segment, largest groups
  first: ContextPilot's ordering re-implemented over the proxy's view (the real
  ContextPilot server is the sweep's `contextpilot-real` line, `loadgen.stack.peer_lines`).

Every wave is recorded in the policy's `CacheView` as it is released. Lanes for the
metrics: requests taken for their age are `cold`, those taken for affinity `hot`.
"""

from __future__ import annotations

from collections.abc import Sequence

from prism_proxy.qas.counters import SegmentCounters
from prism_proxy.qas.params import QasParams
from prism_proxy.qas.residency import CacheView, ViewNode
from prism_proxy.qas.types import (
    ActiveRequest,
    BucketView,
    Lane,
    QueuedRequest,
    RoundPlan,
    WaveEntry,
    fifo_order,
    program_order,
)


def _plan(
    counters: SegmentCounters,
    queue: Sequence[QueuedRequest],
    skeletons: dict[str, tuple[str, ...]],
    wave: list[WaveEntry],
    buckets: list[BucketView] | None = None,
) -> RoundPlan:
    heads = {q.rid: q.head for q in queue}
    return RoundPlan(
        priorities=counters.base_priorities(),
        skeletons=skeletons,
        signatures={q.rid: () for q in queue},
        buckets=buckets or [],
        wave=wave,
        dispatch_priorities=counters.dispatch_table(
            (skeletons[e.rid] for e in wave), (heads[e.rid] for e in wave)
        ),
    )


class FifoPolicy:
    name = "fifo"
    reorders = False
    order = staticmethod(fifo_order)

    def __init__(self, params: QasParams) -> None:
        self.params = params
        self.cache_view: CacheView | None = None

    def plan_round(
        self,
        queue: Sequence[QueuedRequest],
        active: Sequence[ActiveRequest],
        wave_size: int,
        now: float | None = None,
    ) -> RoundPlan:
        ordered = self.order(queue)
        wave = [WaveEntry(q.rid, Lane.COLD) for q in ordered[: max(0, wave_size)]]
        skeletons = {q.rid: tuple(q.segments) for q in queue}
        return _plan(SegmentCounters.snapshot(queue, active, self.params), queue, skeletons, wave)


class ContinuumStylePolicy(FifoPolicy):
    """`fifo` in program order (`types.program_order`)."""

    name = "continuum-style"
    order = staticmethod(program_order)


class KlpmPolicy:
    """k-LPM over the proxy's cache view (requests reordered, never their segments).

    Match lengths are computed once per round and refreshed only where an insertion can
    change them: a path inserted after matching d pieces creates nodes deeper than d, so
    only requests sharing its head (d = 0) or its head and first segment (d ≥ 1) can
    match more. Pruning can shorten any match, so it triggers a full refresh.
    """

    name = "klpm"
    reorders = False

    def __init__(self, params: QasParams) -> None:
        self.params = params
        self.cache_view = CacheView(params.cache_view_tokens, params.cache_view_bytes)

    def plan_round(
        self,
        queue: Sequence[QueuedRequest],
        active: Sequence[ActiveRequest],
        wave_size: int,
        now: float | None = None,
    ) -> RoundPlan:
        ordered = fifo_order(queue)
        taken = [False] * len(ordered)
        by_head: dict[str, list[int]] = {}
        by_first: dict[tuple[str, str], list[int]] = {}
        for i, request in enumerate(ordered):
            by_head.setdefault(request.prefix_key, []).append(i)
            if request.segments:
                by_first.setdefault((request.prefix_key, request.segments[0]), []).append(i)
        matches: list[int] | None = None
        wave: list[WaveEntry] = []

        def refresh(indices: Sequence[int]) -> None:
            assert matches is not None
            for j in indices:
                if not taken[j]:
                    matches[j] = self.cache_view.match_tokens(ordered[j], ordered[j].segments)

        def take(i: int, lane: Lane) -> None:
            nonlocal matches
            request = ordered[i]
            taken[i] = True
            depth, _ = self.cache_view.match(request, request.segments)
            pruned = self.cache_view.insert(request, request.segments)
            wave.append(WaveEntry(request.rid, lane))
            if matches is None:
                return
            if pruned:
                matches = None
            elif depth == 0:
                refresh(by_head[request.prefix_key])
            elif request.segments:
                refresh(by_first[(request.prefix_key, request.segments[0])])

        oldest = 0
        limit = min(max(0, wave_size), len(ordered))
        while len(wave) < limit:
            while taken[oldest]:
                oldest += 1
            take(oldest, Lane.COLD)
            for _ in range(self.params.k - 1):
                if len(wave) >= limit:
                    break
                if matches is None:
                    matches = [0] * len(ordered)
                    refresh(range(len(ordered)))
                best = max(
                    (j for j in range(len(ordered)) if not taken[j]),
                    key=lambda j: (matches[j], -j),
                )
                take(best, Lane.HOT)
        skeletons = {q.rid: tuple(q.segments) for q in queue}
        return _plan(SegmentCounters.snapshot(queue, active, self.params), queue, skeletons, wave)


class ContextPilotStylePolicy:
    name = "contextpilot-style"
    reorders = True

    def __init__(self, params: QasParams) -> None:
        self.params = params
        self.cache_view = CacheView(params.cache_view_tokens, params.cache_view_bytes)

    def cached_first(self, request: QueuedRequest) -> tuple[str, ...]:
        """Units along the view's most recently used path first, the rest in order."""
        if not request.reorder:
            return tuple(request.segments)
        lead, units, fixed = request.split_fixed()
        movable = [s for unit in units for s in unit]
        if lead:
            return (*lead, *movable, *fixed)  # the view's paths start after the head
        node = self.cache_view.head_node(request)
        remaining = {unit[0]: unit for unit in units}
        front: list[str] = []
        while node is not None and remaining:
            best: tuple[str, ViewNode, int] | None = None
            for key, first in node.children.items():
                unit = remaining.get(key[4:]) if key.startswith("seg:") else None
                child: ViewNode | None = first if unit is not None else None
                for segment in (unit or ())[1:]:
                    child = child.children.get("seg:" + segment) if child is not None else None
                if child is not None and (best is None or first.last_used > best[2]):
                    best = (key[4:], child, first.last_used)
            if best is None:
                break
            front.extend(remaining.pop(best[0]))
            node = best[1]
        rest = [s for unit in remaining.values() for s in unit]
        return (*front, *rest, *fixed)

    def plan_round(
        self,
        queue: Sequence[QueuedRequest],
        active: Sequence[ActiveRequest],
        wave_size: int,
        now: float | None = None,
    ) -> RoundPlan:
        ordered = fifo_order(queue)
        skeletons = {q.rid: self.cached_first(q) for q in ordered}
        groups: dict[tuple[str, ...], list[QueuedRequest]] = {}
        for request in ordered:
            groups.setdefault(skeletons[request.rid][:1], []).append(request)
        scan = sorted(groups.items(), key=lambda item: -len(item[1]))  # stable: oldest first
        wave: list[WaveEntry] = []
        for _, members in scan:
            for request in members:
                if len(wave) >= wave_size:
                    break
                self.cache_view.insert(request, skeletons[request.rid])
                wave.append(WaveEntry(request.rid, Lane.HOT))
        buckets = [
            BucketView(key, tuple(q.rid for q in members), float(len(members)))
            for key, members in scan
        ]
        counters = SegmentCounters.snapshot(queue, active, self.params)
        return _plan(counters, queue, skeletons, wave, buckets)
