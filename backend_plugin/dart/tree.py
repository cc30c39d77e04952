"""Anchor placement and eviction ordering over any radix tree (SPEC §3).

The same code serves SGLang's `RadixCache` (through `backend_plugin.sglang_cache`) and
the simulator's `prism_sim.radix_cache`, each wrapped in a small `TreeAdapter`:

    walk(tokens)    resident nodes along the path of `tokens`, as (node, start, end)
                    token ranges, root excluded, stopping where the path ends
    split(node, n)  make the first n tokens of `node` a new parent; return the parent
                    (it keeps the child's access time and lock count)
    get_meta/set_meta   per-node `NodeMeta` (None = unannotated)

Placement splits nodes so that every anchor offset is a node boundary and gives every
node on a piece's token span its owner `seg(u)` (not only the node ending at the
anchor):

    tokens  |--system--|----seg A----|---seg B---|--private--|(output)
    nodes   [  n1      ][ n2 ][  n3  ][   n4     ][  n5      ][ n6 ...
    owner     sys(h)*    A     A*       B*          None*       untouched
                                (* = node ends at an anchor)
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from backend_plugin.dart.core import DartCore
from backend_plugin.dart.keys import EvictionPolicy, NodeMeta
from prism_wire import AnchorHints

NodeT = TypeVar("NodeT")

META_ATTR = "prism_meta"
# The owner a node had when its KV left the device for the host tier (SGLang's HiCache):
# the host tier's eviction ranks the host copy by it (`DartStrategy`), so what DART keeps
# is kept on host too. DART's residency and counters never read it: they are the device's.
HOST_META_ATTR = "prism_host_meta"


class TreeAdapter(Protocol[NodeT]):
    def walk(self, tokens: Sequence[int]) -> list[tuple[NodeT, int, int]]: ...

    def split(self, node: NodeT, at: int) -> NodeT: ...

    def get_meta(self, node: NodeT) -> NodeMeta | None: ...

    def set_meta(self, node: NodeT, meta: NodeMeta | None) -> None: ...


def _merge(old: NodeMeta | None, new: NodeMeta) -> NodeMeta:
    """A reusable label is never downgraded to private by another request."""
    if old is None:
        return new
    if new.owner is None and old.owner is not None:
        return old
    if old.owner == new.owner and old.kind == new.kind:
        return NodeMeta(new.kind, new.segment_id, old.is_anchor or new.is_anchor)
    return new


def carry_owner(lower: Any, upper: Any) -> None:
    """A split made `upper` the parent of `lower`'s first tokens: it gets `lower`'s
    owner, no longer at the anchor (the tree's own splits, not only DART's)."""
    for attr in (META_ATTR, HOST_META_ATTR):
        meta: NodeMeta | None = getattr(lower, attr, None)
        if meta is not None:
            setattr(upper, attr, meta.as_prefix())


def place_anchors(
    adapter: TreeAdapter[Any],
    tokens: Sequence[int],
    hints: AnchorHints,
    core: DartCore,
    *,
    page_size: int = 1,
) -> int:
    """Split at the anchors of `hints` and annotate the path of `tokens`.

    Call right after `tokens` was inserted. Anchors past the resident path (a chunked
    prefill that has not reached them yet) are placed by a later call. With
    `page_size > 1` offsets are rounded down to a page boundary. Returns the number of
    annotated nodes.
    """
    anchors = hints.anchors
    offsets = [a.offset // page_size * page_size for a in anchors]
    cuts = sorted({o for o in offsets if o > 0})
    spans: list[tuple[Any, int, int]] = []
    for node, start, end in adapter.walk(tokens):
        i = bisect.bisect_right(cuts, start)
        while i < len(cuts) and cuts[i] < end:
            parent = adapter.split(node, cuts[i] - start)
            spans.append((parent, start, cuts[i]))
            start = cuts[i]
            i += 1
        spans.append((node, start, end))
    annotated = 0
    for node, start, end in spans:
        piece = bisect.bisect_right(offsets, start)
        if piece >= len(anchors):
            break  # beyond the last anchor (e.g. generated tokens): left as is
        anchor = anchors[piece]
        old = adapter.get_meta(node)
        new = _merge(old, NodeMeta(anchor.kind, anchor.segment_id, end == offsets[piece]))
        if new != old:
            core.on_assign(old, new, end - start)
            adapter.set_meta(node, new)
        annotated += 1
    return annotated


class DartStrategy:
    """An eviction strategy object (`get_priority(node)`, smallest evicted first) in the
    shape both SGLang's `EvictionStrategy` and `prism_sim.eviction` expect.

    `get_priority` runs for every evictable leaf at the start of every eviction pass
    (both trees rebuild their heap per pass), so the `dart` and `lru` keys are inlined
    here; they equal `keys.eviction_key` (a test checks it).
    """

    def __init__(self, core: DartCore) -> None:
        self.core = core
        if core.policy is EvictionPolicy.DART:
            self.get_priority = self._dart
        elif core.policy is EvictionPolicy.LRU:
            self.get_priority = self._lru
        else:
            self.get_priority = self._generic

    def get_priority(self, node: Any) -> Any:  # replaced per policy in __init__
        return self._generic(node)

    def _generic(self, node: Any) -> Any:
        meta = getattr(node, META_ATTR, None) or getattr(node, HOST_META_ATTR, None)
        return self.core.key(meta, node.last_access_time, getattr(node, "hit_count", 0))

    @staticmethod
    def _lru(node: Any) -> float:
        return node.last_access_time

    def _dart(self, node: Any) -> tuple[int, float, float]:
        core = self.core
        table = core._table
        meta = getattr(node, META_ATTR, None) or getattr(node, HOST_META_ATTR, None)
        owner = meta.owner if meta is not None else None
        if owner is None:
            return (0, 0.0, node.last_access_time)
        discarded = core._discarded
        if discarded and owner in discarded and owner not in core._protected:
            return (0, 0.0, node.last_access_time)
        if owner in core._protected:
            return (3, table.get(owner, 0.0) if table is not None else 0.0, node.last_access_time)
        retained = core._retaining
        if retained and owner in retained:
            return (2, retained[owner], node.last_access_time)
        if table is None:
            return (0, 0.0, node.last_access_time)
        return (1, table.get(owner, 0.0), node.last_access_time)
