"""A pure-Python radix tree over token ids with SGLang 0.5.23 `RadixCache` semantics (SPEC §7).

What is mirrored (page size 1): `match_prefix` walks from the root, refreshes
`last_access_time` on the root and every node it enters and splits the last node when
the key ends inside it; `insert` returns the length of the prefix that was already
cached, splitting a node where the key diverges and adding one new leaf for the rest,
refreshing access times and max-propagating `priority` along the path, and counts a
hit on every node of the path beyond the `inserted_len` tokens the same request had
already inserted (so LFU counts requests, not checkpoints); a split copies the lower
node's lock count, priority, hit count and creation time to the new upper node;
`inc_lock_ref` / `dec_lock_ref` walk from a node to the root and move tokens between the
*evictable* and *protected* tallies when a node's lock count leaves or reaches zero;
`evict(num_tokens)` heapifies the evictable leaves by the strategy's `get_priority`,
pops the smallest, deletes it and pushes its parent once that parent has no child left
and is unlocked, until enough tokens went. The root is always locked.

Where we differ, on purpose:
* no KV slot values: a node's size is `len(node.key)`; the KV pool accounting lives
  in `prism_sim.scheduler`;
* time comes from an injectable `clock` (monotonic by default), read once per call
  (a node created by a split gets that same time; SGLang reads the clock again);
* heap ties are broken by node creation order (SGLang's fall back to set order);
* a split's upper node keeps the lower node's `creation_time` and `creation_seq` (read
  only by `fifo` and `filo`), as in `UnifiedRadixCache`, the tree a live 0.5.23 server
  builds (Python and Rust cores); the plain `RadixCache` stamps the split time instead;
* under `tlru` the cache keeps `_tlru_cached_prefix_len` (tokens from the root to the
  node's end) and `_tlru_history_len` (the branch's high-water depth, never lowered by
  eviction) as `UnifiedRadixCache` does (`unified_tree_core.py`:
  `_set_tlru_lens_and_raise_history` on a new leaf, and on a split the upper node gets
  its own depth and the lower node's high-water mark); plain `RadixCache` has no such
  fields, and SGLang refuses `tlru` with any other tree;
* nodes carry a free `meta` slot, and `split_at(key, offset)` forces a node boundary,
  for DART's anchors (SPEC §3). A split keeps `meta` on the lower node, which still
  ends at the same offset; the new upper node starts with `meta = None`.

    insert [1 2 3 4 5]  →  root ── [1 2 3 4 5]                       (returns 0)
    insert [1 2 3 9]    →  root ── [1 2 3] ─┬─ [4 5]   split at the divergence,
                                            └─ [9]     one new leaf (returns 3)
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prism_sim.eviction import (
    EvictionStrategy,
    LFUStrategy,
    LRUStrategy,
    TLRUStrategy,
    eviction_strategy_names,
    make_eviction_strategy,
    register_eviction_strategy,
)

__all__ = [
    "EvictResult",
    "EvictionStrategy",
    "LFUStrategy",
    "LRUStrategy",
    "MatchResult",
    "RadixCache",
    "TreeNode",
    "eviction_strategy_names",
    "make_eviction_strategy",
    "register_eviction_strategy",
]

Clock = Callable[[], float]
_node_ids = itertools.count()


class TreeNode:
    """One radix node: the tokens `key` that follow its parent's path."""

    # `__dict__` keeps nodes open to extra attributes (plugins may tag nodes).
    __slots__ = (
        "__dict__",
        "_tlru_cached_prefix_len",
        "_tlru_history_len",
        "children",
        "creation_seq",
        "creation_time",
        "evicted",
        "hit_count",
        "id",
        "key",
        "last_access_time",
        "lock_ref",
        "meta",
        "parent",
        "priority",
    )

    def __init__(self, key: list[int], parent: TreeNode | None, now: float) -> None:
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.key = key
        self.lock_ref = 0
        self.last_access_time = now
        self.creation_time = now
        self.hit_count = 0
        self.priority = 0
        self.meta: dict[str, Any] | None = None
        self.evicted = False
        # T-LRU only (kept by the cache under `TLRUStrategy`, else 0).
        self._tlru_cached_prefix_len = 0
        self._tlru_history_len = 0
        self.id = next(_node_ids)
        # Creation order (kept by a split, like creation_time): fifo/filo's tie-break.
        self.creation_seq = self.id

    def __repr__(self) -> str:
        head = self.key[:6]
        return f"TreeNode(id={self.id}, len={len(self.key)}, key={head}, lock={self.lock_ref})"


@dataclass(frozen=True)
class MatchResult:
    """`prefix_len` cached tokens; `last_node` ends exactly at that length."""

    prefix_len: int
    last_node: TreeNode


@dataclass(frozen=True)
class EvictResult:
    """Tokens freed and the nodes removed, in eviction order (parents stay linked)."""

    num_tokens_evicted: int
    evicted_nodes: tuple[TreeNode, ...]


def _set_tlru_lens_and_raise_history(node: TreeNode, parent: TreeNode) -> None:
    """A new node's depth, and the high-water mark raised up its root path (SGLang's
    `unified_tree_core._set_tlru_lens_and_raise_history`)."""
    node._tlru_cached_prefix_len = parent._tlru_cached_prefix_len + len(node.key)
    if node._tlru_history_len < node._tlru_cached_prefix_len:
        node._tlru_history_len = node._tlru_cached_prefix_len
    cur: TreeNode | None = parent
    while cur is not None and cur._tlru_history_len < node._tlru_cached_prefix_len:
        cur._tlru_history_len = node._tlru_cached_prefix_len
        cur = cur.parent


def _common_prefix_len(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the common prefix of `a` and `b[start:]` (slice compares run in C)."""
    n = min(len(a), len(b) - start)
    if a[:n] == b[start : start + n]:
        return n
    lo, step = 0, 64
    while step:
        while lo + step <= n and a[lo : lo + step] == b[start + lo : start + lo + step]:
            lo += step
        step //= 4
    return lo


class RadixCache:
    """Radix KV-cache index with lock counts and pluggable leaf eviction.

    Invariants: `evictable_size() + protected_size() == total_size()`; a node with
    `lock_ref > 0` is never evicted, and neither is any of its ancestors (locks are
    taken on the whole root path); `evict(0)` does nothing.
    """

    def __init__(
        self,
        strategy: EvictionStrategy | str = "lru",
        clock: Clock = time.monotonic,
    ) -> None:
        self.strategy = make_eviction_strategy(strategy) if isinstance(strategy, str) else strategy
        self.clock = clock
        # SGLang's `tlru_bookkeeping`: the T-LRU lengths cost a root-path walk per insert.
        self.tlru_bookkeeping = isinstance(self.strategy, TLRUStrategy)
        self.evicted_tokens_total = 0
        self.evict_listeners: list[Callable[[TreeNode], None]] = []
        # DART (backend_plugin.sim_extension): called once at the start of each eviction
        # pass, and with (upper, lower) after every split so node metadata follows.
        self.evict_begin_listeners: list[Callable[[], None]] = []
        self.split_listeners: list[Callable[[TreeNode, TreeNode], None]] = []
        self.reset()

    # ----- public API -------------------------------------------------------------

    def reset(self) -> None:
        """Drop every node (SGLang's `reset`; also what `/flush_cache` does)."""
        self.root = TreeNode([], None, self.clock())
        self.root.lock_ref = 1
        self._evictable_size = 0
        self._protected_size = 0
        self._evictable_leaves: set[TreeNode] = set()

    def match_prefix(self, key: Sequence[int]) -> MatchResult:
        """Longest cached prefix of `key`; splits the last node if the match ends inside it."""
        now = self.clock()
        node = self.root
        node.last_access_time = now
        key = list(key)
        pos = 0
        while pos < len(key) and key[pos] in node.children:
            child = node.children[key[pos]]
            child.last_access_time = now
            n = _common_prefix_len(child.key, key, pos)
            pos += n
            if n < len(child.key):
                node = self._split_node(child, n, now)
                break
            node = child
        return MatchResult(prefix_len=pos, last_node=node)

    def insert(self, key: Sequence[int], priority: int = 0, inserted_len: int = 0) -> int:
        """Insert `key`; returns how many of its leading tokens were already cached.

        `inserted_len`: how many leading tokens of `key` the same request inserted
        before (SGLang's `req.kv.cache_inserted_len`); nodes within it get no new hit.
        """
        now = self.clock()
        node = self.root
        node.last_access_time = now
        node.priority = max(node.priority, priority)
        key = list(key)
        total_prefix = 0
        while total_prefix < len(key) and key[total_prefix] in node.children:
            node = node.children[key[total_prefix]]
            node.last_access_time = now
            n = _common_prefix_len(node.key, key, total_prefix)
            total_prefix += n
            if n < len(node.key):
                node = self._split_node(node, n, now)
            node.priority = max(node.priority, priority)
            if total_prefix > inserted_len:
                node.hit_count += 1
        rest = key[total_prefix:]
        if rest:
            leaf = TreeNode(rest, node, now)
            leaf.priority = priority
            if total_prefix + len(rest) > inserted_len:
                leaf.hit_count += 1
            node.children[rest[0]] = leaf
            if self.tlru_bookkeeping:
                _set_tlru_lens_and_raise_history(leaf, node)
            self._evictable_size += len(rest)
            self._update_leaf_status(node)
            self._update_leaf_status(leaf)
        return total_prefix

    def split_at(self, key: Sequence[int], offset: int) -> TreeNode:
        """Force a node boundary after `key[:offset]` and return the node ending there.

        `key[:offset]` must be resident (e.g. just inserted). Access times are left
        alone: placing a boundary is not a use. `offset == 0` returns the root.
        """
        if offset < 0 or offset > len(key):
            raise ValueError(f"offset {offset} outside key of length {len(key)}")
        node = self.root
        pos = 0
        prefix = list(key[:offset])
        while pos < offset:
            child = node.children.get(prefix[pos])
            if child is None:
                raise KeyError(f"key not resident up to offset {offset} (stops at {pos})")
            n = _common_prefix_len(child.key, prefix, pos)
            if n < len(child.key):
                if pos + n < offset:
                    raise KeyError(f"key not resident up to offset {offset} (stops at {pos + n})")
                return self._split_node(child, n, child.last_access_time)
            node = child
            pos += n
        return node

    def split_node(self, node: TreeNode, split_len: int) -> TreeNode:
        """Make the first `split_len` tokens of `node` a new parent and return it.

        The parent keeps the node's access time, lock count and hit count; `meta` stays
        on `node` (it still ends where it did). Requires `0 < split_len < len(node.key)`.
        """
        if not 0 < split_len < len(node.key):
            raise ValueError(f"split_len {split_len} outside (0, {len(node.key)})")
        return self._split_node(node, split_len, node.last_access_time)

    def walk(self, key: Sequence[int]) -> list[tuple[TreeNode, int, int]]:
        """Resident nodes along `key` as `(node, start, end)` token ranges, root excluded.

        Stops where the resident path ends: a node that diverges from `key` is left
        out, while the last node may extend past `len(key)` (its `end` is then the
        node's end). Does not touch access times.
        """
        out: list[tuple[TreeNode, int, int]] = []
        node, pos = self.root, 0
        key = list(key)
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            n = _common_prefix_len(child.key, key, pos)
            if n < min(len(child.key), len(key) - pos):
                break  # diverges from `key` inside this node: not on its path
            out.append((child, pos, pos + len(child.key)))
            if n < len(child.key):
                break
            node, pos = child, pos + n
        return out

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock `node` and its ancestors; returns the change of the evictable size."""
        delta = 0
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable_size -= len(node.key)
                self._protected_size += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            self._update_leaf_status(node)
            assert node.parent is not None
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Undo one `inc_lock_ref(node)`; returns the change of the evictable size."""
        delta = 0
        while node is not self.root:
            if node.lock_ref == 1:
                self._evictable_size += len(node.key)
                self._protected_size -= len(node.key)
                delta += len(node.key)
            if node.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref below zero on {node!r}")
            node.lock_ref -= 1
            self._update_leaf_status(node)
            if node.parent is None:
                raise RuntimeError("node does not belong to this tree")
            node = node.parent
        return delta

    def evict(self, num_tokens: int, skip: Callable[[TreeNode], bool] | None = None) -> EvictResult:
        """Evict unlocked leaves, smallest `strategy.get_priority` first, until
        `num_tokens` tokens went or nothing evictable is left. A leaf for which
        `skip(leaf)` is true stays (and so does its parent); the host tier skips
        copies still on the device."""
        if num_tokens <= 0:
            return EvictResult(0, ())
        for begin in self.evict_begin_listeners:
            begin()
        get_priority = self.strategy.get_priority
        heap = [(get_priority(leaf), leaf.id, leaf) for leaf in self._evictable_leaves]
        heapq.heapify(heap)
        evicted: list[TreeNode] = []
        num_evicted = 0
        while num_evicted < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            if skip is not None and skip(leaf):
                continue
            for listener in self.evict_listeners:
                listener(leaf)
            num_evicted += len(leaf.key)
            self._delete_leaf(leaf)
            evicted.append(leaf)
            parent = leaf.parent
            assert parent is not None
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (get_priority(parent), parent.id, parent))
        self.evicted_tokens_total += num_evicted
        return EvictResult(num_evicted, tuple(evicted))

    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def total_size(self) -> int:
        return sum(len(node.key) for node in self.nodes())

    def nodes(self) -> Iterator[TreeNode]:
        """Every resident node except the root (depth first)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def evictable_leaves(self) -> frozenset[TreeNode]:
        return frozenset(self._evictable_leaves)

    def node_path_tokens(self, node: TreeNode) -> list[int]:
        """All tokens from the root to the end of `node` (works on evicted nodes too)."""
        parts: list[list[int]] = []
        current: TreeNode | None = node
        while current is not None and current is not self.root:
            parts.append(current.key)
            current = current.parent
        return [token for part in reversed(parts) for token in part]

    def node_end_offset(self, node: TreeNode) -> int:
        """Token offset, from the root, at which `node` ends."""
        depth = 0
        current: TreeNode | None = node
        while current is not None and current is not self.root:
            depth += len(current.key)
            current = current.parent
        return depth

    # ----- internals --------------------------------------------------------------

    def _split_node(self, child: TreeNode, split_len: int, now: float) -> TreeNode:
        """Cut `child` after `split_len` tokens; return the new upper node.

        parent ── child[0:n] ── child[n:]   (the upper node inherits locks, priority,
                                             hit count and creation time)
        """
        parent = child.parent
        assert parent is not None
        upper = TreeNode(child.key[:split_len], parent, now)
        upper.lock_ref = child.lock_ref
        upper.priority = child.priority
        upper.hit_count = child.hit_count
        upper.creation_time = child.creation_time
        upper.creation_seq = child.creation_seq
        if self.tlru_bookkeeping:
            # The split adds no depth: the upper node ends split_len tokens below its
            # parent and inherits the branch's high-water mark; `child` keeps both.
            upper._tlru_cached_prefix_len = parent._tlru_cached_prefix_len + split_len
            upper._tlru_history_len = child._tlru_history_len
        child.key = child.key[split_len:]
        child.parent = upper
        upper.children[child.key[0]] = child
        parent.children[upper.key[0]] = upper
        for listener in self.split_listeners:
            listener(upper, child)
        return upper

    def _delete_leaf(self, node: TreeNode) -> None:
        parent = node.parent
        assert parent is not None
        removed = parent.children.pop(node.key[0], None)
        assert removed is node, "parent does not hold this leaf"
        node.evicted = True
        self._evictable_size -= len(node.key)
        self._evictable_leaves.discard(node)
        self._update_leaf_status(parent)

    def _update_leaf_status(self, node: TreeNode) -> None:
        if node.evicted or node.lock_ref > 0 or node.children:
            self._evictable_leaves.discard(node)
        else:
            self._evictable_leaves.add(node)
