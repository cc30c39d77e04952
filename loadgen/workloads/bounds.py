"""Upper bounds on a trace's exact-prefix hit rate: an infinite cache, requests in
arrival order, each serialized by the proxy's own serializer (SPEC §1).

A request's cached prefix is the chat head (once any request was served before it)
plus its longest run of leading segments that an earlier request already placed in
the same order; matches that stop inside a segment are ignored, so the bounds are
exact at segment granularity. Orderings (a request that forbids reordering always
keeps its own order):

* ``as_retrieved`` — segments in request order (what native SGLang sees);
* ``hot_first`` — hot passages first by Zipf rank (``meta.hot_ranks``), then the rest;
* ``greedy`` — repeatedly the segment that extends an already-cached prefix (hot rank,
  then id, breaks ties), then as ``hot_first``: a clairvoyant per-request choice.

No scheduler, cache size or timing enters: these are ceilings for any policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from loadgen.workloads.trace_format import Trace, TraceRequest
from prism_proxy.api.segments import SegmentedPrompt
from prism_proxy.prompts.serializer import Serializer

# Cached prefixes: (system, segment id, segment id, ...).
Seen = set[tuple[str, ...]]
Ordering = Callable[[TraceRequest, Seen], list[str]]


def _hot_first(request: TraceRequest) -> list[str]:
    ranks = request.meta.get("hot_ranks") or {}
    ids = [s.id for s in request.segments]
    hot = sorted((i for i in ids if i in ranks), key=lambda i: ranks[i])
    return hot + [i for i in ids if i not in ranks]


def _greedy(request: TraceRequest, seen: Seen) -> list[str]:
    ranks = request.meta.get("hot_ranks") or {}
    remaining = _hot_first(request)
    chosen: list[str] = []
    while remaining:
        options = [i for i in remaining if (request.system, *chosen, i) in seen]
        if not options:
            break
        best = min(options, key=lambda i: (ranks.get(i, len(ranks) + 1), i))
        chosen.append(best)
        remaining.remove(best)
    return chosen + remaining


ORDERINGS: dict[str, Ordering] = {
    "as_retrieved": lambda r, _seen: [s.id for s in r.segments],
    "hot_first": lambda r, _seen: _hot_first(r),
    "greedy": _greedy,
}


def hit_rate_ceiling(
    requests: Sequence[TraceRequest], serializer: Serializer, ordering: Ordering
) -> float:
    """Σ cached / Σ prompt tokens over ``requests`` with an infinite cache."""
    seen: Seen = set()
    cached_total = prompt_total = 0
    for request in requests:
        order = ordering(request, seen) if request.reorder else [s.id for s in request.segments]
        prompt = SegmentedPrompt(
            system=request.system or None,
            segments=[{"id": s.id, "text": s.text} for s in request.segments],
            suffix=request.suffix,
            reorder=request.reorder,
        )
        serialized = serializer.serialize(prompt, order)
        prefix: tuple[str, ...] = (request.system,)
        matching = prefix in seen
        cached = serialized.head_tokens if matching else 0
        seen.add(prefix)
        for segment_id in order:
            prefix = (*prefix, segment_id)
            if matching and prefix in seen:
                cached += serialized.segment_tokens[segment_id]
            else:
                matching = False
            seen.add(prefix)
        cached_total += cached
        prompt_total += len(serialized.input_ids)
    return cached_total / prompt_total if prompt_total else 0.0


def hit_rate_ceilings(trace: Trace, serializer: Serializer) -> dict[str, float]:
    """The ceiling under each ordering of ``ORDERINGS``."""
    return {
        name: hit_rate_ceiling(trace.requests, serializer, ordering)
        for name, ordering in ORDERINGS.items()
    }
