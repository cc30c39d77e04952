"""DART inside the simulated engine: `prism-sim --eviction dart|lru+active` (SPEC §3, §7).

`prism_sim.extensions` imports this module for those names and calls
`create_extension(config)`. The extension runs the same `backend_plugin.dart` core as
the SGLang plugin: anchors from each request's `kv_hints` placed after every insertion
of its tokens, DART keys as the cache's eviction strategy, the same control RPC
(`--control-port`, `PRISM_CONTROL_TOKEN` or `PRISM_CONTROL_TOKEN_FILE`, bound to 127.0.0.1
unless `PRISM_CONTROL_HOST` says otherwise) served on the simulator's own event loop.
The simulator's scheduler steps run synchronously on that loop, so accepted updates are
applied at once, which is always between two steps. The protected set F_t is bounded to
`--protect-fraction` (else `PRISM_DART_PROTECT_FRACTION`, else 0.25) of the KV pool,
`--kv-capacity-tokens` or the profile's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from backend_plugin.config import ControlConfig, load_config
from backend_plugin.dart.core import DartCore
from backend_plugin.dart.keys import NodeMeta
from backend_plugin.dart.tree import (
    HOST_META_ATTR,
    META_ATTR,
    DartStrategy,
    carry_owner,
    place_anchors,
)
from prism_wire import AnchorError, request_hints

logger = logging.getLogger(__name__)


class SimTreeAdapter:
    """`TreeAdapter` over `prism_sim.radix_cache.RadixCache`."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def walk(self, tokens: Sequence[int]) -> list[tuple[Any, int, int]]:
        return self.cache.walk(tokens)  # already leaves out a node diverging from `tokens`

    def split(self, node: Any, at: int) -> Any:
        return self.cache.split_node(node, at)  # split listeners copy the metadata

    def get_meta(self, node: Any) -> NodeMeta | None:
        return getattr(node, META_ATTR, None)

    def set_meta(self, node: Any, meta: NodeMeta | None) -> None:
        setattr(node, META_ATTR, meta)


class DartSimExtension:
    """`prism_sim.extensions.EngineExtension` running DART."""

    def __init__(
        self, core: DartCore, config: Any = None, control: ControlConfig | None = None
    ) -> None:
        self.core = core
        self.strategy = DartStrategy(core)
        self.config = config
        # host and token read from the environment once (`load_config`) by the factory
        self.control = control or ControlConfig()
        self.control_port: int | None = None
        self._cache: Any = None
        self._root: Any = None  # the cache's root when last seen: a new one means a flush
        self._host: Any = None  # the host tier's tree (`attach_host`)

    # ---- tree hooks ----------------------------------------------------------------
    def attach(self, cache: Any) -> None:
        """Follow `cache`'s splits, eviction passes and evicted nodes (one cache only)."""
        if self._cache is not None:
            raise RuntimeError("a DART extension serves one radix cache")
        self._cache, self._root = cache, cache.root
        self.core.clock = cache.clock  # retention expires on the engine's time
        cache.split_listeners.append(self.on_split)
        cache.evict_begin_listeners.append(self.begin_eviction)
        cache.evict_listeners.append(self.on_evict)

    def _follow(self, cache: Any) -> None:
        if cache is not self._cache:
            raise RuntimeError("attach(cache) the DART extension to this cache first")
        if cache.root is not self._root:  # reset() (/flush_cache) dropped every node
            self._root = cache.root
            self.core.clear_residency()

    def begin_eviction(self) -> None:
        """Start of an eviction pass: apply queued updates, snapshot F_t."""
        self._follow(self._cache)
        self.core.begin_eviction()

    def on_split(self, upper: Any, lower: Any) -> None:
        carry_owner(lower, upper)

    def on_insert(self, req: Any, cache: Any, key: list[int]) -> None:
        self._follow(cache)
        self.core.apply_pending()
        try:
            hints = request_hints(req.kv_hints, req.custom_params, req.input_ids)
        except AnchorError as exc:
            logger.warning("request %s: ignoring malformed PRISM anchors: %s", req.rid, exc)
            return
        if hints is None:
            return
        self.core.request_started(req.rid, hints)
        place_anchors(SimTreeAdapter(cache), key, hints, self.core)

    def on_evict(self, node: Any) -> None:
        meta = getattr(node, META_ATTR, None)
        to_host = self._host is not None and self._host_copy(node, meta)
        self.core.on_evicted(meta, len(node.key), to_host=to_host)

    def attach_host(self, host: Any) -> None:
        """The engine's host tier (`prism_sim.host_tier`: a tree of the host copies). A
        device eviction whose tokens host holds counts as a demotion; with `host_order`
        "dart" the host tier drops its copies in DART's order, as SGLang's unified tree
        does with DART's strategy: a copy ranks by the owner its node had on the device
        (`HOST_META_ATTR`, handed over by `on_evict`), and a retained owner's copy it
        drops is recorded as lost (`on_host_evicted`). With "lru" it keeps its LRU order."""
        self.core.use_host_tier()
        self._host = host
        if self.core.host_order == "dart":
            host.strategy = self.strategy
            host.split_listeners.append(self.on_split)
            host.evict_listeners.append(self.on_host_evict)

    def on_host_evict(self, copy: Any) -> None:
        """The host tier dropped `copy`: a retained owner's history is lost there."""
        self.core.on_host_evicted(getattr(copy, HOST_META_ATTR, None), len(copy.key))

    def _host_copy(self, node: Any, meta: NodeMeta | None) -> bool:
        """Whether host holds a copy of `node`'s tokens; with `host_order` "dart", that
        copy gets `meta`'s owner, cut at the same bounds (the host tree's node boundaries
        are its own)."""
        path = self._cache.node_path_tokens(node)
        start, end = len(path) - len(node.key), len(path)
        host = self._host
        held = host.walk(path)  # contiguous from the root, as far as host holds `path`
        if not held or held[-1][2] < end:
            return False
        if meta is None or self.core.host_order != "dart":
            return True
        if start > 0:
            host.split_at(path, start)
        host.split_at(path, end)
        for copy, s, e in host.walk(path):
            if s >= start:
                setattr(copy, HOST_META_ATTR, meta if e == end else meta.as_prefix())
        return True

    def on_finish(self, req: Any) -> None:
        """The request finished or was aborted: it leaves a_t (`lru+active`)."""
        self.core.request_finished(req.rid)

    # ---- server lifetime ------------------------------------------------------------
    def control_settings(self) -> ControlConfig:
        """The environment's control settings with the engine's port and token."""
        port = getattr(self.config, "control_port", None)
        token = getattr(self.config, "control_token", None) or self.control.token
        return replace(self.control, port=port, token=token)

    @contextlib.asynccontextmanager
    async def lifecycle(self, engine: Any) -> AsyncIterator[None]:
        """Serve the control RPC for the server's lifetime, if configured."""
        runner = None
        control = self.control_settings()
        if control.port is not None:
            from backend_plugin.control_rpc import start_control_site

            runner, self.control_port = await start_control_site(
                self.core, control, apply_inline=True
            )
            logger.info("PRISM control RPC on %s:%d", control.host, self.control_port)
        try:
            yield
        finally:
            if runner is not None:
                await runner.cleanup()


def create_extension(config: Any) -> DartSimExtension:
    """Factory named in `prism_sim.extensions.EXTENSION_MODULES` (config: `SimConfig`).
    A control RPC that could not start (no token, a remote bind not allowed) fails here,
    when the engine is built, not when the server starts."""
    settings = load_config()
    fraction = getattr(config, "protect_fraction", None)
    core = DartCore(
        config.eviction,
        settings.protect,
        capacity_tokens=config.resolved_profile().kv_capacity_tokens,
        protect_fraction=settings.protect_fraction if fraction is None else fraction,
        retain_fraction=settings.retain_fraction,
        host_order=settings.host_order,
    )
    extension = DartSimExtension(core, config, settings.control)
    control = extension.control_settings()
    if control.port is not None:
        control.check_auth()
    return extension
