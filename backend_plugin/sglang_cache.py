"""`DartRadixCache`: SGLang 0.5.23's Python `RadixCache` with DART's eviction order.

Only this module and `sglang_plugin` import sglang. The tree, its locks, matching and
insertion stay SGLang's own; DART changes which evictable leaf goes first (SPEC §3):

* `eviction_strategy` is a `DartStrategy`, so SGLang's own `evict()` heap orders
  leaves by DART keys (O(log V) per evicted node, as for LRU);
* `evict()` first applies queued priority updates and snapshots F_t, once per pass;
* `checkpoint(req, up_to=…)` (SGLang's per-request insertion point, called from
  `mem_cache/common.py`; `DartRequests`, shared with the unified tree) inserts as
  usual, then reads `req.rid` / `req.kv_hints` (or,
  from SGLang's OpenAI endpoint, `req.sampling_params.custom_params`),
  splits nodes at the anchor offsets and annotates the path;
* `_split_node` carries a node's owner to the new upper half; `_delete_leaf` counts
  evicted tokens per class; `on_release` ends the request's share of a_t;
* the KV pool's size (`token_to_kv_pool_allocator.size`, in tokens) is handed to the
  core, which bounds the protected set F_t to `protect_fraction` of it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult, InsertParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey, TreeNode

from backend_plugin.dart.core import DartCore
from backend_plugin.dart.keys import NodeMeta
from backend_plugin.dart.tree import META_ATTR, DartStrategy, carry_owner, place_anchors
from prism_wire import AnchorError, AnchorHints, request_hints

logger = logging.getLogger(__name__)


def kv_capacity_tokens(params: CacheInitParams) -> int | None:
    """The KV pool's size in tokens, read from the tree's allocator (None: no allocator
    or one that does not say, e.g. a test double)."""
    size = getattr(params.token_to_kv_pool_allocator, "size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def request_anchor_hints(req: Any) -> AnchorHints | None:
    """A scheduled request's anchors: its `kv_hints`, or from SGLang's OpenAI endpoint
    `sampling_params.custom_params` (None: none given, or malformed and logged)."""
    try:
        params = getattr(req, "sampling_params", None)
        return request_hints(
            getattr(req, "kv_hints", None),
            getattr(params, "custom_params", None),
            getattr(req, "origin_input_ids", None) or (),
        )
    except AnchorError as exc:
        logger.warning("request %s: ignoring malformed PRISM anchors: %s", req.rid, exc)
        return None


class SGLangTreeAdapter:
    """`TreeAdapter` over a `RadixCache` for one key namespace (extra_key, cache_salt)."""

    def __init__(
        self, cache: Any, extra_key: str | None = None, cache_salt: str | None = None
    ) -> None:
        self.cache = cache
        self.page_size: int = cache.page_size
        self.extra_key = extra_key
        self.cache_salt = cache_salt

    def walk(self, tokens: Sequence[int]) -> list[tuple[TreeNode, int, int]]:
        page = self.page_size
        toks = list(tokens)
        toks = toks[: len(toks) // page * page]
        key = RadixKey(toks, self.extra_key, cache_salt=self.cache_salt)
        node, pos, path = self.cache.root_node, 0, []
        while pos < len(toks):
            child = node.children.get(key.child_key_at(pos, page))
            if child is None or not self.on_device(child):
                break
            size = len(child.key)
            if list(child.key.raw_token_ids()) != toks[pos : pos + size]:
                break
            path.append((child, pos, pos + size))
            node, pos = child, pos + size
        return path

    def on_device(self, node: TreeNode) -> bool:
        """Whether the node's KV is on the device (always, in this tree)."""
        return True

    def split(self, node: TreeNode, at: int) -> TreeNode:
        parent = self.cache._split_node(node.key, node, at)
        # A boundary is not an access: the upper half keeps the node's times.
        parent.last_access_time = node.last_access_time
        parent.creation_time = node.creation_time
        return parent

    def get_meta(self, node: TreeNode) -> NodeMeta | None:
        return getattr(node, META_ATTR, None)

    def set_meta(self, node: TreeNode, meta: NodeMeta | None) -> None:
        setattr(node, META_ATTR, meta)


class DartRequests:
    """DART's part in a request's life, for an SGLang tree cache of either kind (mixed in
    before it): `checkpoint` inserts as SGLang does, then places the request's anchors;
    `on_release` ends its share of a_t. The cache gives `_tree_adapter`."""

    dart: DartCore
    disable: bool

    def _tree_adapter(self, extra_key: str | None, cache_salt: str | None) -> Any:
        raise NotImplementedError

    def _bound_by_pool(self, params: CacheInitParams) -> None:
        """Hand the KV pool's size (tokens) to the core, which bounds F_t by it."""
        capacity = kv_capacity_tokens(params)
        if capacity is not None:
            self.dart.set_capacity(capacity)
        elif not self.disable:
            logger.warning("PRISM DART: KV pool size unknown; F_t is not bounded by it")

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        self.dart.apply_pending()
        super().checkpoint(req, up_to=up_to, **kwargs)  # type: ignore[misc]
        if self.disable:
            return
        hints = request_anchor_hints(req)
        if hints is not None:
            self.dart.request_started(str(req.rid), hints)
            self.place(req.full_untruncated_fill_ids[:up_to], hints, req.extra_key, req.cache_salt)

    def on_release(self, req: Any, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)  # type: ignore[misc]
        self.dart.request_finished(str(req.rid))

    def place(
        self,
        token_ids: Sequence[int],
        hints: AnchorHints,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """Split and annotate the resident path of `token_ids` at the anchors of `hints`."""
        adapter = self._tree_adapter(extra_key, cache_salt)
        return place_anchors(adapter, token_ids, hints, self.dart, page_size=adapter.page_size)

    def insert_with_anchors(
        self, key: RadixKey, hints: AnchorHints | None, *, rid: str | None = None, value=None
    ) -> int:
        """`insert` then place the anchors, as `checkpoint` does for a scheduled request
        (for callers without a `Req`: tests, benchmarks). Returns the matched prefix."""
        self.dart.apply_pending()
        result = self.insert(InsertParams(key=key, value=value))  # type: ignore[attr-defined]
        if hints is not None:
            if rid is not None:
                self.dart.request_started(rid, hints)
            self.place(key.token_ids, hints, key.extra_key, key.cache_salt)
        return result.prefix_len


class DartRadixCache(DartRequests, RadixCache):
    """SGLang's `RadixCache` whose eviction follows DART (`self.dart` holds the state)."""

    def __init__(self, params: CacheInitParams, core: DartCore) -> None:
        self.dart = core  # before super().__init__, which calls reset()
        self.control: Any = None  # the ControlThread, when this process serves the RPC
        super().__init__(params)
        self.eviction_strategy = DartStrategy(core)
        self._bound_by_pool(params)

    # ---- SGLang hooks --------------------------------------------------------------
    def reset(self) -> None:
        super().reset()
        core = getattr(self, "dart", None)
        if core is not None:
            core.clear_residency()

    def evict(self, params: EvictParams) -> EvictResult:
        self.dart.begin_eviction()
        return super().evict(params)

    def _delete_leaf(self, node: TreeNode) -> None:
        self.dart.on_evicted(getattr(node, META_ATTR, None), len(node.key))
        super()._delete_leaf(node)

    def _split_node(self, key: RadixKey, child: TreeNode, split_len: int) -> TreeNode:
        new_node = super()._split_node(key, child, split_len)
        carry_owner(child, new_node)
        return new_node

    def _tree_adapter(self, extra_key: str | None, cache_salt: str | None) -> SGLangTreeAdapter:
        return SGLangTreeAdapter(self, extra_key, cache_salt)
