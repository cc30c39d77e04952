"""The proxy's approximate view of the backend cache, for the baselines (SPEC §5).

Like sgl-model-gateway's approximate tree, it records what the proxy dispatched, is
bounded in tokens, is pruned least-recently-used first, and never sees the backend's
evictions; it is also bounded in bytes, so that many tiny segments with long ids cannot
grow the proxy. Prompts are concatenations of separately tokenized pieces (SPEC §1), so the
tree is kept over pieces (the serialized head, then segment ids) weighted by their token
lengths: two prompts share a token prefix exactly across the pieces they share, and
matching costs O(pieces) instead of O(tokens). Private suffixes are never reused and are
not recorded.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from prism_proxy.qas.types import QueuedRequest


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
