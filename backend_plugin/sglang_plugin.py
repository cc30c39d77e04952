"""SGLang plugin entry point (`sglang.srt.plugins` → `prism_dart`).

SGLang's `load_plugins()` calls `register()` in the launcher and as the first line of
every scheduler process. It registers the radix-cache backend `prism_dart`, selected
with `--radix-cache-backend prism_dart`: the scheduler's `create_tree_cache` then calls
`build_dart_cache`, which builds a `DartRadixCache` (SGLang's Python tree, not the Rust
unified core) or, with `--enable-hierarchical-cache`, a `DartUnifiedRadixCache`
(SGLang's unified tree on its Python core with DART's order, carrying the host tier),
and starts the control RPC of this scheduler process if `PRISM_CONTROL_PORT` is set
(dp rank r listens on port + r).

Tensor parallelism: every TP rank owns a tree and must evict identically, but the RPC
reaches one process; rather than broadcast updates through the TP group, the backend
refuses `--tp-size > 1` with a clear error (SPEC §3's requirement, option "refuse").
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from backend_plugin.config import load_config
from backend_plugin.dart.core import DartCore

logger = logging.getLogger(__name__)

BACKEND_NAME = "prism_dart"


def register() -> None:
    """Register the `prism_dart` radix-cache backend (idempotent)."""
    from sglang.srt.mem_cache.registry import (
        register_radix_cache_backend,
        registered_radix_cache_backends,
    )

    if BACKEND_NAME not in registered_radix_cache_backends():
        register_radix_cache_backend(BACKEND_NAME, build_dart_cache)


def _dp_rank() -> int:
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().dp_rank or 0)
    except Exception:  # not published (tests, tools): a single replica
        return 0


def build_dart_cache(ctx: Any) -> Any:
    """`RadixCacheFactory` for SGLang's registry (`TreeCacheBuildContext` → cache)."""
    from backend_plugin.sglang_cache import DartRadixCache

    if ctx.tp_size > 1:
        raise ValueError(
            f"--radix-cache-backend {BACKEND_NAME} does not support --tp-size > 1 "
            f"(got {ctx.tp_size}): DART priority updates reach one process and every TP "
            "rank must evict identically. Use data parallelism (--dp-size) instead."
        )
    if ctx.disable_radix_cache:
        raise ValueError(f"--radix-cache-backend {BACKEND_NAME} needs the radix cache enabled")
    if ctx.is_hybrid_swa or ctx.is_hybrid_ssm:
        raise ValueError(
            f"--radix-cache-backend {BACKEND_NAME} supports full-attention models only "
            "(hybrid SWA/SSM caches are not supported)"
        )
    config = load_config()
    core = DartCore(
        config.policy,
        config.protect,
        protect_fraction=config.protect_fraction,
        retain_fraction=config.retain_fraction,
        host_order=config.host_order,
    )
    if ctx.enable_hierarchical_cache:
        # HiCache lives only in SGLang's UnifiedRadixCache: DART runs as its tree core,
        # and SGLang's own builder attaches the host tier.
        from sglang.srt.mem_cache.registry import create_unified_radix_cache

        from backend_plugin.sglang_unified import DartUnifiedRadixCache

        cache = create_unified_radix_cache(
            ctx, cache_class=functools.partial(DartUnifiedRadixCache, core=core)
        )
    else:
        cache = DartRadixCache(ctx.params, core)  # hands the KV pool's size to the core
    if config.control.port is not None:
        from backend_plugin.control_rpc import ControlThread

        rank = _dp_rank()
        control = ControlThread(cache.dart, config.control)
        port = control.start(config.control.port + rank)
        cache.control = control
        logger.info("PRISM DART control RPC (dp rank %d) on %s:%d", rank, config.control.host, port)
    logger.info(
        "PRISM DART radix cache: policy=%s protect=%d protect_fraction=%g (cap %s tokens)",
        config.policy,
        config.protect,
        config.protect_fraction,
        core.protect_cap_tokens,
    )
    return cache
