"""Which segments the backend's cache holds: the residency counter c_t of P_t (SPEC §2).

Two sources, one interface (`resident()`: the set a round reads):

* `ResidentSegments`: DART's own account, applied from the control RPC's epoch-stamped
  summaries (`GET /prism/residency`, SPEC §4). A summary is either full (the whole set)
  or a delta since a version the proxy already holds (each changed segment's current
  state), so a steady cache costs a few bytes per poll even at 10^5 anchors.
* `UnionResidency`: several DART instances (one proxy in front of a gateway and N
  replicas): resident on any of them.
* `ViewResidency`: without the plugin, the proxy's own bounded view of what it
  dispatched (`CacheView`): a segment counts as resident while some recorded path
  holds it.
* `PendingResidency`: DART's account plus what the proxy released that DART has not
  reported yet (a released request is cached only once prefilled, and reported a poll
  later; the request right behind it must still be aligned to it).

The policy keeps that view of dispatched paths either way (`PrismPolicy.paths`): it
also says in which order the resident segments were cached.

The proxy's own account (`CacheView`, the baselines' and prism's without DART, SPEC
§5): like sgl-model-gateway's approximate tree, it records what the proxy dispatched, is
bounded in tokens, is pruned least-recently-used first, and never sees the backend's
evictions; it is also bounded in bytes, so that many tiny segments with long ids cannot
grow the proxy. Prompts are concatenations of separately tokenized pieces (SPEC §1), so
the tree is kept over pieces (the serialized head, then segment ids) weighted by their
token lengths: two prompts share a token prefix exactly across the pieces they share,
and matching costs O(pieces) instead of O(tokens). Private suffixes are never reused
and are not recorded.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prism_proxy.qas.types import QueuedRequest
from prism_wire import ResidencySummary


class Residency(Protocol):
    """What a round reads: the segments resident now."""

    def resident(self) -> frozenset[str]: ...


# How long a released segment counts as resident without DART saying so: long enough for
# its request to wait in the engine's queue, prefill and be reported.
PENDING_GRACE_S = 5.0


class PendingResidency:
    """`source` (DART's account) plus the segments released since (`released`) that it
    has not reported resident yet, each for at most `grace_s` after its release; then
    DART's word is final (an evicted or never-cached segment drops out)."""

    def __init__(
        self,
        source: Residency,
        grace_s: float = PENDING_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.grace_s = grace_s
        self.clock = clock
        self._pending: dict[str, float] = {}  # segment -> when it stops counting
        self._expiries: list[tuple[float, str]] = []  # heap; stale entries skipped
        self._confirmed: frozenset[str] | None = None  # the source's set last seen
        self._union: frozenset[str] = frozenset()
        self._dirty = False

    def released(self, segments: Iterable[str]) -> None:
        until = self.clock() + self.grace_s
        for segment in segments:
            self._pending[segment] = until
            heapq.heappush(self._expiries, (until, segment))
        self._dirty = True

    def resident(self) -> frozenset[str]:
        """Per round: expired entries leave through a heap; the pending set is checked
        against DART's only when DART's set changed (the sources hand out the same
        frozenset until a summary changes it)."""
        confirmed = self.source.resident()
        now = self.clock()
        expiries, pending = self._expiries, self._pending
        while expiries and expiries[0][0] <= now:
            until, segment = heapq.heappop(expiries)
            if pending.get(segment) == until:  # not released again since
                del pending[segment]
                self._dirty = True
        if confirmed is not self._confirmed:
            self._confirmed = confirmed
            for segment in [s for s in pending if s in confirmed]:
                del pending[segment]
            self._dirty = True
        if self._dirty:
            self._dirty = False
            self._union = confirmed.union(pending) if pending else confirmed
        return self._union


class ResidentSegments:
    """The proxy's copy of DART's resident set, kept by applying summaries."""

    def __init__(self) -> None:
        self.generation: str | None = None
        self.version: int | None = None
        self._segments: set[str] = set()
        self._frozen: frozenset[str] = frozenset()

    def apply(self, summary: ResidencySummary) -> None:
        """Apply a full summary, or a delta of the generation held."""
        if summary.full:
            self._segments = set(summary.resident)
        elif summary.generation != self.generation:
            raise ValueError("a delta of another generation; ask for a full summary")
        else:
            self._segments.difference_update(summary.gone)
            self._segments.update(summary.resident)
        self.generation, self.version = summary.generation, summary.version
        self._frozen = frozenset(self._segments)

    def clear(self) -> None:
        """Forget everything (the RPC is unreachable: residency is unknown)."""
        self.generation = self.version = None
        self._segments.clear()
        self._frozen = frozenset()

    def resident(self) -> frozenset[str]:
        return self._frozen


class UnionResidency:
    """Several DART instances (replicas behind a gateway): resident on any of them."""

    def __init__(self, sets: list[ResidentSegments]) -> None:
        self.sets = sets
        self._key: tuple[tuple[str | None, int | None], ...] | None = None
        self._union: frozenset[str] = frozenset()

    def resident(self) -> frozenset[str]:
        key = tuple((s.generation, s.version) for s in self.sets)
        if key != self._key:  # recomputed only when a summary was applied
            self._key = key
            self._union = frozenset().union(*(s.resident() for s in self.sets))
        return self._union


class ViewResidency:
    """Residency from the proxy's own `CacheView` (no plugin to ask)."""

    def __init__(self, view: CacheView) -> None:
        self.view = view

    def resident(self) -> frozenset[str]:
        return self.view.segments()


class NoResidency:
    """The paper's QAS: c_t = 0 for every segment."""

    def resident(self) -> frozenset[str]:
        return frozenset()


def residency_source(policy: object) -> str:
    """Where a policy learns which segments the backend holds: `dart` (DART's resident
    sets, through the control RPC), `view` (the proxy's own cache view) or `none`
    (residency unused: `w_c` = 0, or a policy without it)."""
    residency = getattr(policy, "residency", None)
    if isinstance(residency, PendingResidency):
        return "dart"
    if isinstance(residency, ViewResidency):
        return "view"
    return "none"


@dataclass(eq=False, slots=True)
class ViewNode:
    key: str
    tokens: int
    parent: ViewNode | None
    children: dict[str, ViewNode] = field(default_factory=dict)
    last_used: int = 0


# A node's memory besides its key: the slotted object, its children dict, its entry in
# the LRU heap and in the segment counter (measured with tracemalloc on CPython 3.11).
NODE_BYTES = 500


def node_bytes(key: str) -> int:
    return NODE_BYTES + sys.getsizeof(key)


def request_path(request: QueuedRequest, order: Sequence[str]) -> list[tuple[str, int]]:
    """(piece key, tokens) for the head and each segment of `order`."""
    lengths = dict(zip(request.segments, range(len(request.segments)), strict=True))
    path = [("head:" + request.prefix_key, request.head_tokens)]
    path.extend(("seg:" + s, request.segment_length(lengths[s])) for s in order)
    return path


def _live(entry: tuple[int, int, ViewNode]) -> bool:
    """Whether a heap entry still stands for its node: an attached leaf last used at the
    entry's tick."""
    tick, _, node = entry
    parent = node.parent
    return (
        not node.children
        and node.last_used == tick
        and parent is not None
        and parent.children.get(node.key) is node
    )


class CacheView:
    """A bounded piece-level radix tree with LRU pruning."""

    def __init__(self, capacity_tokens: int, capacity_bytes: int = 64 * 1024 * 1024) -> None:
        self.capacity_tokens = capacity_tokens
        self.capacity_bytes = capacity_bytes
        self.root = ViewNode("", 0, None)
        self.total_tokens = 0
        self.total_bytes = 0
        self.nodes = 0
        self._clock = itertools.count(1)
        self._lru: list[tuple[int, int, ViewNode]] = []
        self._ids = itertools.count()
        self._segment_nodes: Counter[str] = Counter()  # segment id → nodes holding it
        self._segments: frozenset[str] | None = frozenset()

    def match(self, request: QueuedRequest, order: Sequence[str]) -> tuple[int, int]:
        """(pieces, tokens) of the longest recorded prefix of the request in this order."""
        node, pieces, matched = self.root, 0, 0
        for key, tokens in request_path(request, order):
            child = node.children.get(key)
            if child is None:
                break
            node, pieces, matched = child, pieces + 1, matched + tokens
        return pieces, matched

    def match_tokens(self, request: QueuedRequest, order: Sequence[str]) -> int:
        return self.match(request, order)[1]

    def head_node(self, request: QueuedRequest) -> ViewNode | None:
        return self.root.children.get("head:" + request.prefix_key)

    def insert(self, request: QueuedRequest, order: Sequence[str]) -> int:
        """Record a dispatched prompt, mark its path most recently used.

        Returns how many nodes pruning removed to stay within capacity.
        """
        tick = next(self._clock)
        node = self.root
        for key, tokens in request_path(request, order):
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = ViewNode(key, tokens, node)
                self.total_tokens += tokens
                self.total_bytes += node_bytes(key)
                self.nodes += 1
                self._count(key, 1)
            child.last_used = tick
            node = child
        heapq.heappush(self._lru, (tick, next(self._ids), node))
        if len(self._lru) > 2 * self.nodes + 64:
            self._compact()
        return self._prune()

    def _compact(self) -> None:
        """Drop the heap's stale entries (a path inserted again leaves its old entry
        behind; without this the heap grows with every insert, even when the view is
        not full). Amortized O(1) per insert."""
        self._lru = [entry for entry in self._lru if _live(entry)]
        heapq.heapify(self._lru)

    def stats(self) -> dict[str, int]:
        """Nodes, bytes and the byte capacity (the proxy's cache metrics)."""
        return {
            "entries": self.nodes,
            "bytes": self.total_bytes,
            "capacity_bytes": self.capacity_bytes,
        }

    def segments(self) -> frozenset[str]:
        """Every segment id some recorded path holds (the view's residency)."""
        if self._segments is None:
            self._segments = frozenset(self._segment_nodes)
        return self._segments

    def _count(self, key: str, delta: int) -> None:
        if not key.startswith("seg:"):
            return
        segment = key[4:]
        left = self._segment_nodes[segment] + delta
        if left > 0:
            if left == 1 and delta > 0:
                self._segments = None  # a new segment
            self._segment_nodes[segment] = left
        else:
            del self._segment_nodes[segment]
            self._segments = None

    def _prune(self) -> int:
        removed = 0
        while self._lru and (
            self.total_tokens > self.capacity_tokens or self.total_bytes > self.capacity_bytes
        ):
            entry = heapq.heappop(self._lru)
            if not _live(entry):
                continue  # stale entry: touched again, no longer a leaf, or gone
            node = entry[2]
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            node.parent = None
            self.total_tokens -= node.tokens
            self.total_bytes -= node_bytes(node.key)
            self.nodes -= 1
            self._count(node.key, -1)
            removed += 1
            if parent is not self.root and not parent.children:
                heapq.heappush(self._lru, (parent.last_used, next(self._ids), parent))
        return removed
