"""Eviction orders for the simulated radix cache, chosen by name (SPEC §3, §7).

A strategy only ranks evictable leaves: `get_priority(node)` returns a sortable key and
the cache evicts the *smallest* key first, exactly like SGLang's
`mem_cache/evict_policy.py`. Strategies never see locked nodes (the cache filters them)
and must not mutate the tree.

New orders (DART's `dart`, `lru+active`, ...) are added from outside this module with
`register_eviction_strategy(name, factory)`; the factory receives the keyword arguments
given to `make_eviction_strategy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

EvictionKey = float | tuple[Any, ...]


class TreeNode(Protocol):
    """What a strategy reads of a radix node (`prism_sim.radix_cache.TreeNode`); plugins
    read their own attributes too."""

    last_access_time: float
    hit_count: int


@runtime_checkable
class EvictionStrategy(Protocol):
    """Ranks evictable leaves; the smallest `get_priority(node)` is evicted first."""

    def get_priority(self, node: TreeNode) -> EvictionKey: ...


class LRUStrategy:
    """Least recently used first (SGLang's `LRUStrategy`)."""

    def get_priority(self, node: TreeNode) -> float:
        return node.last_access_time


class LFUStrategy:
    """Least frequently used first, ties by recency (SGLang's `LFUStrategy`)."""

    def get_priority(self, node: TreeNode) -> tuple[int, float]:
        return (node.hit_count, node.last_access_time)


StrategyFactory = Callable[..., EvictionStrategy]

_REGISTRY: dict[str, StrategyFactory] = {
    "lru": LRUStrategy,
    "lfu": LFUStrategy,
}


def register_eviction_strategy(name: str, factory: StrategyFactory) -> None:
    """Make `factory(**kwargs)` selectable as `--eviction <name>` (replaces a same name)."""
    _REGISTRY[name.lower()] = factory


def eviction_strategy_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(_REGISTRY)


def make_eviction_strategy(name: str, **kwargs: Any) -> EvictionStrategy:
    """Build the strategy registered under `name`; unknown names raise `ValueError`."""
    try:
        factory = _REGISTRY[name.lower()]
    except KeyError:
        known = ", ".join(eviction_strategy_names())
        raise ValueError(f"unknown eviction strategy {name!r} (known: {known})") from None
    return factory(**kwargs)
