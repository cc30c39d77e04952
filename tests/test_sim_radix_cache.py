"""Radix cache of the simulated engine: SGLang semantics at page size 1 (SPEC §7)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_support import common_prefix

from prism_sim.eviction import make_eviction_strategy, register_eviction_strategy
from prism_sim.radix_cache import RadixCache, TreeNode


class Tick:
    """Deterministic clock: every read advances by one."""

    def __init__(self) -> None:
        self.counter = itertools.count(1)

    def __call__(self) -> float:
        return float(next(self.counter))


def make(strategy: str = "lru") -> RadixCache:
    return RadixCache(strategy, clock=Tick())


def resident_paths(cache: RadixCache) -> list[list[int]]:
    return [cache.node_path_tokens(n) for n in cache.nodes() if not n.children]


def test_insert_returns_cached_prefix_and_splits_on_divergence() -> None:
    cache = make()
    assert cache.insert([1, 2, 3, 4]) == 0
    assert cache.insert([1, 2, 3, 4]) == 4
    # Diverges after [1, 2]: the [1, 2, 3, 4] node is split into [1, 2] -> [3, 4].
    assert cache.insert([1, 2, 9]) == 2
    keys = sorted(tuple(n.key) for n in cache.nodes())
    assert keys == [(1, 2), (3, 4), (9,)]
    assert cache.total_size() == 5
    assert cache.evictable_size() == 5
    assert cache.protected_size() == 0


def test_match_prefix_splits_inside_a_node_and_refreshes_access_times() -> None:
    cache = make()
    cache.insert([5, 6, 7, 8])  # t=2 (t=1 was the root at reset)
    result = cache.match_prefix([5, 6, 0])  # t=3
    assert result.prefix_len == 2
    assert result.last_node.key == [5, 6]
    assert result.last_node.children[7].key == [7, 8]
    assert result.last_node.last_access_time == 3.0
    assert cache.match_prefix([9]).prefix_len == 0
    assert cache.match_prefix([5, 6, 7, 8, 1]).prefix_len == 4


def test_lock_moves_tokens_between_evictable_and_protected() -> None:
    cache = make()
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4, 5])  # [1, 2] -> {[3], [4, 5]}
    node = cache.match_prefix([1, 2, 4, 5]).last_node
    assert cache.inc_lock_ref(node) == -4  # [4, 5] and [1, 2] become protected
    assert (cache.evictable_size(), cache.protected_size()) == (1, 4)
    assert cache.inc_lock_ref(node) == 0  # second lock: no size change
    assert cache.dec_lock_ref(node) == 0
    assert cache.dec_lock_ref(node) == 4
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)
    with pytest.raises(RuntimeError):
        cache.dec_lock_ref(node)


def test_never_evicts_a_locked_path() -> None:
    cache = make()
    cache.insert([1, 2, 3])
    cache.insert([7, 8])
    locked = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(locked)
    result = cache.evict(100)
    assert result.num_tokens_evicted == 2  # only [7, 8] was evictable
    assert resident_paths(cache) == [[1, 2, 3]]
    assert cache.evicted_tokens_total == 2
    assert cache.evict(100).num_tokens_evicted == 0
    cache.dec_lock_ref(locked)
    assert cache.evict(1).num_tokens_evicted == 3  # a whole leaf goes at once
    assert cache.total_size() == 0


def test_lru_evicts_least_recently_used_leaf_first_and_parent_after_children() -> None:
    cache = make("lru")
    cache.insert([1, 2, 3])  # leaf A
    cache.insert([1, 2, 4])  # splits: [1,2] -> {[3], [4]}
    cache.insert([9, 9])  # leaf C
    cache.match_prefix([1, 2, 3])  # A is now the most recent leaf
    order = [tuple(cache.node_path_tokens(n)) for n in cache.evict(100).evicted_nodes]
    # [4] (oldest), then [9, 9], then [3]; [1, 2] only once both children are gone.
    assert order == [(1, 2, 4), (9, 9), (1, 2, 3), (1, 2)]


def test_lfu_prefers_rarely_hit_nodes_even_when_recent() -> None:
    lfu, lru = make("lfu"), make("lru")
    for cache in (lfu, lru):
        cache.insert([1, 1])
        cache.insert([1, 1])  # a second request: [1,1] has 2 hits
        cache.insert([2, 2])  # 1 hit
        cache.match_prefix([2, 2])  # matching refreshes recency but counts no hit
    assert [n.hit_count for n in lfu.nodes()] in ([2, 1], [1, 2])
    assert lfu.evict(1).evicted_nodes[0].key == [2, 2]
    assert lru.evict(1).evicted_nodes[0].key == [1, 1]


def test_hits_are_not_recounted_for_what_the_same_request_inserted() -> None:
    cache = make()
    cache.insert([5, 6])  # a request's first chunk
    cache.insert([5, 6, 7, 8], inserted_len=2)  # the same request, later
    hits = {tuple(n.key): n.hit_count for n in cache.nodes()}
    assert hits == {(5, 6): 1, (7, 8): 1}
    cache.insert([5, 6, 7, 8])  # another request
    assert {tuple(n.key): n.hit_count for n in cache.nodes()} == {(5, 6): 2, (7, 8): 2}


def test_split_at_forces_a_boundary_and_keeps_meta_on_the_lower_node() -> None:
    cache = make()
    key = [10, 11, 12, 13, 14, 15]
    cache.insert(key)
    leaf = cache.match_prefix(key).last_node
    leaf.meta = {"anchor": "private"}
    before = leaf.last_access_time
    upper = cache.split_at(key, 2)
    assert upper.key == [10, 11]
    assert upper.meta is None
    assert leaf.key == [12, 13, 14, 15] and leaf.meta == {"anchor": "private"}
    assert upper.last_access_time == before  # placing a boundary is not a use
    assert cache.split_at(key, 2) is upper  # already a boundary
    assert cache.split_at(key, 6) is leaf
    assert cache.split_at(key, 0) is cache.root
    assert [(s, e) for _, s, e in cache.walk(key)] == [(0, 2), (2, 6)]
    assert [(s, e) for _, s, e in cache.walk([10, 11, 12])] == [(0, 2), (2, 6)]  # longer node
    assert [(s, e) for _, s, e in cache.walk([10, 11, 12, 99])] == [(0, 2)]  # diverges: left out
    with pytest.raises(KeyError):
        cache.split_at([10, 11, 99], 3)
    assert cache.total_size() == 6


def test_split_keeps_lock_counts_consistent() -> None:
    cache = make()
    cache.insert([1, 2, 3, 4])
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    upper = cache.split_at([1, 2, 3, 4], 2)
    assert upper.lock_ref == 1
    assert cache.dec_lock_ref(node) == 4
    assert cache.protected_size() == 0


def test_registry_accepts_new_strategies() -> None:
    class Newest:
        def get_priority(self, node: TreeNode) -> float:
            return -node.last_access_time

    register_eviction_strategy("test-mru", Newest)
    cache = RadixCache(make_eviction_strategy("test-mru"), clock=Tick())
    cache.insert([1])
    cache.insert([2])
    assert cache.evict(1).evicted_nodes[0].key == [2]
    with pytest.raises(ValueError):
        make_eviction_strategy("no-such-order")


def test_reset_drops_everything() -> None:
    cache = make()
    cache.insert([1, 2])
    cache.reset()
    assert cache.total_size() == 0 and cache.match_prefix([1, 2]).prefix_len == 0


ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(0, 3), min_size=1, max_size=8)),
        st.tuples(st.just("lock"), st.lists(st.integers(0, 3), min_size=1, max_size=8)),
        st.tuples(st.just("unlock"), st.integers(0, 10)),
        st.tuples(st.just("evict"), st.integers(0, 12)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_invariants_under_random_operations(operations: list[tuple[str, object]]) -> None:
    """Sizes add up, locked paths survive eviction, matches equal a naive model."""
    cache = make()
    locks: list[tuple[TreeNode, list[int]]] = []
    for op, arg in operations:
        if op == "insert":
            assert isinstance(arg, list)
            expected = max((common_prefix(arg, p) for p in resident_paths(cache)), default=0)
            assert cache.insert(arg) == expected
        elif op == "lock":
            assert isinstance(arg, list)
            result = cache.match_prefix(arg)
            expected = max((common_prefix(arg, p) for p in resident_paths(cache)), default=0)
            assert result.prefix_len == expected
            cache.inc_lock_ref(result.last_node)
            locks.append((result.last_node, arg[: result.prefix_len]))
        elif op == "unlock" and locks:
            assert isinstance(arg, int)
            node, _ = locks.pop(arg % len(locks))
            cache.dec_lock_ref(node)
        elif op == "evict":
            assert isinstance(arg, int)
            before = cache.total_size()
            evictable = cache.evictable_size()
            freed = cache.evict(arg).num_tokens_evicted
            assert cache.total_size() == before - freed
            assert freed >= min(arg, evictable)
        assert cache.evictable_size() + cache.protected_size() == cache.total_size()
        for node, path in locks:
            assert not node.evicted
            assert cache.match_prefix(path).prefix_len == len(path)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=0, max_size=400), st.integers(0, 700))
def test_long_keys_match_exactly(tokens: list[int], cut: int) -> None:
    """Long keys (the block-compare path) split at the exact first differing token."""
    cache = make()
    base = [7] * 300 + tokens
    cache.insert(base)
    probe = [*base[:cut], 9, *base[cut:]]  # 9 never occurs in base
    expected = min(cut, len(base))
    assert cache.match_prefix(probe).prefix_len == expected
    assert cache.insert(probe) == expected
    assert cache.match_prefix(base).prefix_len == len(base)
    assert cache.total_size() == len(base) + len(probe) - expected
