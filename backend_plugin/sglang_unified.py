"""DART on SGLang 0.5.23's `UnifiedRadixCache`, the tree that carries HiCache.

SGLang's host-memory KV tier (`--enable-hierarchical-cache`) exists only in
`UnifiedRadixCache`, whose tree lives in a separate "tree core". Its default core is
Rust and takes only SGLang's own eviction policies; its Python core
(`unified_cache/unified_tree_core.py`) orders device and host eviction by
`eviction_strategy.get_priority(node)`, as `RadixCache` does. So DART runs there as a
registered tree core (`register_tree_core_backend`, name `prism_dart`):

* `DartTreeCore` is SGLang's Python `UnifiedTreeCore` whose `eviction_strategy` is DART's
  keys; it snapshots the priorities at the start of every device-eviction walk, carries
  a node's owner to the upper half of a split, and counts a node's tokens as evicted
  when its device KV is freed (and as demoted to host when a host copy stays). A node
  whose device KV goes (deleted, or demoted to host memory under HiCache) loses its
  annotation: DART's residency is what the device holds, and a history loaded back
  from host is annotated again by the next request that reaches it. A demoted node
  keeps its owner apart (`HOST_META_ATTR`), and SGLang's host eviction, which heaps
  the host-only leaves by the same strategy, ranks it by that owner: what DART keeps
  (retained, protected, in demand) stays on host longest, finished sessions' pieces go
  first. With `PRISM_DART_HOST_ORDER=lru` the owner is not kept and host eviction is
  least recently used first, as SGLang's own.
* `DartUnifiedRadixCache` is SGLang's `UnifiedRadixCache` built on that core; its
  `checkpoint` places the request's anchors after SGLang's own insert, with the code
  `DartRadixCache` uses on the plain tree (`DartRequests`).

`build_dart_cache` picks this tree when HiCache is on and `DartRadixCache` (the plain
tree, faster) otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.components.base import EvictLayer
from sglang.srt.mem_cache.unified_cache.tree_core_registry import (
    get_tree_core_factory,
    register_tree_core_backend,
)
from sglang.srt.mem_cache.unified_cache.unified_tree_core import (
    UnifiedTreeCore,
    UnifiedTreeNode,
)
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from backend_plugin.dart.core import DartCore
from backend_plugin.dart.keys import NodeMeta
from backend_plugin.dart.tree import HOST_META_ATTR, META_ATTR, DartStrategy, carry_owner
from backend_plugin.sglang_cache import DartRequests, SGLangTreeAdapter

TREE_CORE_NAME = "prism_dart"
FULL = ComponentType.FULL


class DartTreeCore(UnifiedTreeCore):
    """SGLang's Python tree core with DART's eviction order once `attach` gave it a core
    (until then, during construction, it is SGLang's own)."""

    dart: DartCore | None = None

    def attach(self, core: DartCore) -> None:
        self.dart = core
        self.eviction_strategy = DartStrategy(core)
        if self.enable_hicache:
            core.use_host_tier()

    def set_hicache_enabled(self) -> None:
        super().set_hicache_enabled()  # by init_hicache, once the host pool exists
        if self.dart is not None:
            self.dart.use_host_tier()

    def reset(self) -> None:
        super().reset()
        if self.dart is not None:
            self.dart.clear_residency()

    def evict_device_start(self, component_type: ComponentType, request_cnt: int) -> None:
        if component_type is FULL and self.dart is not None:
            self.dart.begin_eviction()
        super().evict_device_start(component_type, request_cnt)

    def _split_node(self, key: RadixKey, child: UnifiedTreeNode, split_len: int) -> Any:
        new_node, action = super()._split_node(key, child, split_len)
        carry_owner(child, new_node)
        return new_node, action

    def _evict_component_and_detach_lru(
        self,
        node: UnifiedTreeNode,
        comp: Any,
        device_frees: Any,
        host_frees: Any,
        cache_actions: Any,
        target: EvictLayer = EvictLayer.DEVICE,
        tracker: Any = None,
    ) -> tuple[int, int]:
        watched = comp.component_type is FULL and EvictLayer.DEVICE in target
        meta: NodeMeta | None = getattr(node, META_ATTR, None) if watched else None
        host_meta: NodeMeta | None = (
            getattr(node, HOST_META_ATTR, None)
            if comp.component_type is FULL and EvictLayer.HOST in target
            else None
        )
        freed = super()._evict_component_and_detach_lru(
            node, comp, device_frees, host_frees, cache_actions, target, tracker
        )
        if host_meta is not None and freed[1] > 0 and self.dart is not None:
            self.dart.on_host_evicted(host_meta, freed[1])  # the host copy is gone
        if watched and freed[0] > 0 and self.dart is not None:
            self.dart.on_evicted(meta, len(node.key), to_host=node.backuped)
            setattr(node, META_ATTR, None)
            if node.backuped and self.dart.host_order == "dart":
                setattr(node, HOST_META_ATTR, meta)  # ranks the host copy (DartStrategy)
        return freed


def _tree_core_factory(params: CacheInitParams, components: dict) -> DartTreeCore:
    return DartTreeCore(params, components)


def register_tree_core() -> None:
    """Register the `prism_dart` tree core with SGLang (idempotent)."""
    if get_tree_core_factory(TREE_CORE_NAME) is None:
        register_tree_core_backend(TREE_CORE_NAME, _tree_core_factory)


class UnifiedTreeAdapter(SGLangTreeAdapter):
    """`SGLangTreeAdapter` over a `DartUnifiedRadixCache`: the walk stops at the first
    node whose KV is not on the device (host-only under HiCache), and splits go through
    the tree core."""

    def on_device(self, node: UnifiedTreeNode) -> bool:
        return not node.evicted

    def split(self, node: UnifiedTreeNode, at: int) -> UnifiedTreeNode:
        parent, action = self.cache.tree_core._split_node(node.key, node, at)
        if action is not None:  # a pending write-through now covers both halves
            self.cache._apply_cache_actions([action])
        return parent


class DartUnifiedRadixCache(DartRequests, UnifiedRadixCache):
    """SGLang's `UnifiedRadixCache` on the `prism_dart` tree core (`self.dart` holds the
    state), with DART's `checkpoint` and `on_release` (`DartRequests`). HiCache is
    attached by SGLang's own `create_unified_radix_cache`."""

    tree_core: DartTreeCore

    def __init__(self, params: CacheInitParams, core: DartCore) -> None:
        register_tree_core()
        self.dart = core
        self.control: Any = None  # the ControlThread, when this process serves the RPC
        super().__init__(dataclasses.replace(params, tree_core_backend=TREE_CORE_NAME))
        if not isinstance(self.tree_core, DartTreeCore):
            raise ValueError(f"the {TREE_CORE_NAME} tree core was not built")
        self.tree_core.attach(core)
        self._bound_by_pool(params)

    def _tree_adapter(self, extra_key: str | None, cache_salt: str | None) -> UnifiedTreeAdapter:
        return UnifiedTreeAdapter(self, extra_key, cache_salt)
