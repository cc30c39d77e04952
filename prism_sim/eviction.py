"""Eviction orders for the simulated radix cache, chosen by name (SPEC §3, §7).

A strategy only ranks evictable leaves: `get_priority(node)` returns a sortable key and
the cache evicts the *smallest* key first, exactly like SGLang's
`mem_cache/evict_policy.py`. Strategies never see locked nodes (the cache filters them)
and must not mutate the tree.

The built-in names and constructor keywords are SGLang 0.5.23's
(`mem_cache/utils.py: _EVICTION_POLICY_FACTORIES`): `lru`, `lfu`, `fifo`, `mru`, `filo`,
`priority`, `slru` (`protected_threshold=2`) and `tlru` (`threshold=0`,
`next_prompt_estimate=0`), which SGLang takes from `--radix-eviction-policy-config`
as keyword arguments (an unknown keyword is a `TypeError`, as there). A live SGLang
server's `--radix-eviction-policy` accepts only `lru`, `lfu`, `slru`, `priority` and
`tlru` (`arg_groups/choices.py`); `fifo`, `mru` and `filo` exist as strategy classes.

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

    id: int
    key: list[int]
    last_access_time: float
    creation_time: float
    creation_seq: int
    hit_count: int
    priority: int
    # Maintained by the cache only under `TLRUStrategy` (0 otherwise).
    _tlru_cached_prefix_len: int
    _tlru_history_len: int


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


class FIFOStrategy:
    """Oldest node first, by `creation_time` (SGLang's `FIFOStrategy`); equal times
    (nodes made at one clock reading) in creation order (`creation_seq`, which a split
    copies with the creation time), as SGLang's distinct times order them."""

    def get_priority(self, node: TreeNode) -> tuple[float, int]:
        return (node.creation_time, node.creation_seq)


class MRUStrategy:
    """Most recently used first (SGLang's `MRUStrategy`: `-last_access_time`).

    Equal times are broken toward the newer node (`-id`). SGLang's live tree stamps
    every touch with its own counter value, so its times never tie; the simulator reads
    its clock once per call, which leaves a split's lower node and the new leaf of the
    same insert tied, and SGLang evicts the new leaf first.
    """

    def get_priority(self, node: TreeNode) -> tuple[float, int]:
        return (-node.last_access_time, -node.id)


class FILOStrategy:
    """Newest node first, by `creation_time` (SGLang's `FILOStrategy`); equal times
    newest first too (`-creation_seq`), as SGLang's distinct times order them."""

    def get_priority(self, node: TreeNode) -> tuple[float, int]:
        return (-node.creation_time, -node.creation_seq)


class PriorityStrategy:
    """Lower `priority` first, LRU within one priority (SGLang's `PriorityStrategy`).

    A node's priority is the largest request `priority` of any insert whose path
    covered it (None counts as 0 without `--enable-priority-scheduling`, which the
    simulator does not model); a split's upper node starts with the lower one's. A
    request's prompt is inserted once more at priority + 1 when outputs follow it, so
    its output tail goes before its prompt.
    """

    def get_priority(self, node: TreeNode) -> tuple[int, float]:
        return (node.priority, node.last_access_time)


class TLRUStrategy:
    """Tail-Optimized LRU (SGLang's `TLRUStrategy`; Zhang et al., arXiv:2510.15152).

    A conversation whose branch reached `L = node._tlru_history_len` tokens, and whose
    next prompt is expected to add `next_prompt_estimate` tokens, only needs
    `L + next_prompt_estimate - threshold` tokens cached to keep its next prefill
    within the TTFT budget; a node lying wholly past that budget is "TEL-safe" and
    goes before every other node (key `(-1, last_access_time)`), then plain LRU
    (`(0, last_access_time)`). `L` is the branch's high-water depth and does not shrink
    when the tail is evicted. `threshold` and `next_prompt_estimate` are token counts.
    With the defaults (0, 0) nothing is ever TEL-safe: SGLang's server refuses
    `tlru` unless `threshold > next_prompt_estimate >= 0` (`SimConfig` checks the same).
    """

    def __init__(self, threshold: int = 0, next_prompt_estimate: int = 0) -> None:
        self.threshold = threshold
        self.next_prompt_estimate = next_prompt_estimate

    def get_priority(self, node: TreeNode) -> tuple[int, float]:
        budget = max(node._tlru_history_len + self.next_prompt_estimate - self.threshold, 0)
        cached_without_this_node = node._tlru_cached_prefix_len - len(node.key)
        tel_safe = cached_without_this_node >= budget
        return (-1 if tel_safe else 0, node.last_access_time)


class SLRUStrategy:
    """Segmented LRU (SGLang's `SLRUStrategy`): nodes with `hit_count <
    protected_threshold` (probationary) go before protected ones, LRU within each."""

    def __init__(self, protected_threshold: int = 2) -> None:
        self.protected_threshold = protected_threshold

    def get_priority(self, node: TreeNode) -> tuple[int, float]:
        is_protected = 1 if node.hit_count >= self.protected_threshold else 0
        return (is_protected, node.last_access_time)


StrategyFactory = Callable[..., EvictionStrategy]

_REGISTRY: dict[str, StrategyFactory] = {
    "lru": LRUStrategy,
    "lfu": LFUStrategy,
    "fifo": FIFOStrategy,
    "mru": MRUStrategy,
    "filo": FILOStrategy,
    "priority": PriorityStrategy,
    "slru": SLRUStrategy,
    "tlru": TLRUStrategy,
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
