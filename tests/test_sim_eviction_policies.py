"""SGLang 0.5.23's own radix eviction policies in the simulator's `RadixCache`.

Each scenario runs the same operations under the policy and under LRU: the policy's
eviction order is the one SGLang's strategy class in `mem_cache/evict_policy.py`
defines, and differs from LRU's. The node attributes follow `UnifiedRadixCache` (the
tree a live server builds): a split keeps the lower node's creation time, and the T-LRU
lengths are kept as in `unified_tree_core.py`. These scenarios gave the same eviction
order on SGLang's `UnifiedRadixCache` (Python and Rust tree cores) when checked by hand.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from prism_sim.cli import build_parser, config_from_args
from prism_sim.engine import EngineCore, SimConfig
from prism_sim.eviction import (
    FIFOStrategy,
    FILOStrategy,
    MRUStrategy,
    PriorityStrategy,
    SLRUStrategy,
    TLRUStrategy,
    eviction_strategy_names,
    make_eviction_strategy,
)
from prism_sim.radix_cache import RadixCache, TreeNode
from prism_tokens.tokenizer import load_tokenizer

Op = tuple[Any, ...]


class Tick:
    """Every clock read advances by one (one read per cache call)."""

    def __init__(self) -> None:
        self.counter = itertools.count(1)

    def __call__(self) -> float:
        return float(next(self.counter))


def run(policy: str, ops: list[Op], clock: Any = None, **config: Any) -> list[list[list[int]]]:
    """Run `ops` on a fresh cache; the evicted nodes' keys, per `evict` op."""
    cache = RadixCache(make_eviction_strategy(policy, **config), clock=clock or Tick())
    locks: dict[tuple[int, ...], TreeNode] = {}
    out: list[list[list[int]]] = []
    for op, *args in ops:
        if op == "insert":
            cache.insert(*args)
        elif op == "match":
            cache.match_prefix(args[0])
        elif op == "lock":
            node = cache.match_prefix(args[0]).last_node
            cache.inc_lock_ref(node)
            locks[tuple(args[0])] = node
        elif op == "unlock":
            cache.dec_lock_ref(locks.pop(tuple(args[0])))
        else:
            out.append([node.key for node in cache.evict(args[0]).evicted_nodes])
    return out


def test_sglang_policy_names_and_defaults() -> None:
    assert set(eviction_strategy_names()) >= {
        "lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru",
    }  # fmt: skip
    assert isinstance(make_eviction_strategy("FIFO"), FIFOStrategy)
    assert isinstance(make_eviction_strategy("mru"), MRUStrategy)
    assert isinstance(make_eviction_strategy("filo"), FILOStrategy)
    assert isinstance(make_eviction_strategy("priority"), PriorityStrategy)
    assert make_eviction_strategy("slru").protected_threshold == 2
    tlru = make_eviction_strategy("tlru")
    assert (tlru.threshold, tlru.next_prompt_estimate) == (0, 0)
    with pytest.raises(TypeError):  # SGLang: an unknown keyword fails at startup
        make_eviction_strategy("slru", threshold=3)


def test_fifo_evicts_the_oldest_node_even_when_just_used() -> None:
    ops: list[Op] = [("insert", [1, 2, 3]), ("insert", [4, 5]), ("match", [1, 2, 3])]
    ops += [("evict", 1), ("evict", 1)]
    assert run("fifo", ops) == [[[1, 2, 3]], [[4, 5]]]
    assert run("lru", ops) == [[[4, 5]], [[1, 2, 3]]]


def test_fifo_split_keeps_the_creation_time_of_the_lower_node() -> None:
    # [1, 2, 9] splits [1, 2, 3, 4] after [1, 2]: the upper node was created with the
    # original node (UnifiedRadixCache), so it goes before [5, 6] once it is a leaf.
    ops: list[Op] = [("insert", [1, 2, 3, 4]), ("insert", [5, 6]), ("insert", [1, 2, 9])]
    ops += [("lock", [5, 6]), ("evict", 3), ("unlock", [5, 6]), ("evict", 1)]
    assert run("fifo", ops) == [[[3, 4], [9]], [[1, 2]]]
    # (plain RadixCache stamps the split time instead: [5, 6] would go first)
    cache = RadixCache("fifo", clock=Tick())
    cache.insert([1, 2, 3, 4])
    created = cache.root.children[1].creation_time
    cache.insert([1, 2, 9])
    upper = cache.root.children[1]
    assert upper.key == [1, 2] and upper.creation_time == created
    assert upper.children[3].creation_time == created < upper.children[9].creation_time


def test_mru_evicts_the_most_recently_used_leaf() -> None:
    ops: list[Op] = [("insert", [1, 2]), ("insert", [3, 4]), ("insert", [5, 6])]
    ops += [("match", [1, 2]), ("evict", 1), ("evict", 1)]
    assert run("mru", ops) == [[[1, 2]], [[5, 6]]]
    assert run("lru", ops) == [[[3, 4]], [[5, 6]]]


def test_mru_breaks_a_tie_within_one_insert_toward_the_new_leaf() -> None:
    # The split's lower node [3, 4] and the new leaf [9] share the insert's clock
    # reading; SGLang's per-touch counter makes the new leaf the more recent.
    ops: list[Op] = [("insert", [1, 2, 3, 4]), ("insert", [1, 2, 9]), ("evict", 1)]
    assert run("mru", ops) == [[[9]]]
    assert run("lru", ops) == [[[3, 4]]]


def test_fifo_and_filo_follow_creation_order_when_the_clock_stands_still() -> None:
    ops: list[Op] = [("insert", [1, 2, 3, 4]), ("insert", [5, 6]), ("insert", [1, 2, 9])]
    ops += [("lock", [5, 6]), ("evict", 3), ("unlock", [5, 6]), ("evict", 1)]
    assert run("fifo", ops, clock=lambda: 0.0) == [[[3, 4], [9]], [[1, 2]]]
    ops = [("insert", [1, 2]), ("insert", [3, 4]), ("insert", [5, 6]), ("evict", 4)]
    assert run("filo", ops, clock=lambda: 0.0) == [[[5, 6], [3, 4]]]
    assert run("fifo", ops, clock=lambda: 0.0) == [[[1, 2], [3, 4]]]


def test_filo_evicts_the_newest_node_even_when_used_since() -> None:
    ops: list[Op] = [("insert", [1, 2]), ("insert", [3, 4]), ("insert", [5, 6])]
    ops += [("match", [1, 2]), ("match", [5, 6]), ("evict", 1), ("evict", 1)]
    assert run("filo", ops) == [[[5, 6]], [[3, 4]]]
    assert run("lru", ops) == [[[3, 4]], [[1, 2]]]


def test_priority_evicts_lower_priority_first_then_lru() -> None:
    ops: list[Op] = [("insert", [1, 2], 5), ("insert", [3, 4], 0), ("insert", [5, 6], 0)]
    ops += [("evict", 1), ("evict", 1), ("evict", 1)]
    assert run("priority", ops) == [[[3, 4]], [[5, 6]], [[1, 2]]]
    assert run("lru", ops) == [[[1, 2]], [[3, 4]], [[5, 6]]]


def test_priority_is_max_propagated_along_the_path_and_inherited_on_split() -> None:
    cache = RadixCache("priority", clock=Tick())
    cache.insert([1, 2, 3, 4], 1)
    cache.insert([1, 2, 9], 7)  # splits: [1, 2] inherits 1, then the path raises it to 7
    top = cache.root.children[1]
    assert (top.key, top.priority) == ([1, 2], 7)
    assert top.children[3].priority == 1
    assert top.children[9].priority == 7
    cache.insert([1, 2, 3, 4], 3)  # the same key again: max(1, 3)
    assert top.children[3].priority == 3
    cache.insert([1, 2, 3, 4], 0)  # never lowered
    assert top.children[3].priority == 3
    assert [n.key for n in cache.evict(1).evicted_nodes] == [[3, 4]]


def test_slru_evicts_probationary_nodes_before_protected_ones() -> None:
    # [1, 2, 3] was inserted twice (hit_count 2: protected), [4, 5] once.
    ops: list[Op] = [("insert", [1, 2, 3]), ("insert", [1, 2, 3]), ("insert", [4, 5])]
    ops += [("evict", 1), ("evict", 1)]
    assert run("slru", ops) == [[[4, 5]], [[1, 2, 3]]]
    assert run("lru", ops) == [[[1, 2, 3]], [[4, 5]]]
    # With protected_threshold 3 both are probationary: plain LRU.
    assert run("slru", ops, protected_threshold=3) == run("lru", ops)


CONVERSATION = list(range(100, 110))  # turn 1: 10 tokens
TURN_2 = CONVERSATION + list(range(110, 120))  # turn 2: 10 more
LONG_PROMPT = list(range(200, 230))  # one 30-token prompt


def test_tlru_lengths_follow_sglang_on_insert_and_split() -> None:
    cache = RadixCache(TLRUStrategy(threshold=12, next_prompt_estimate=2), clock=Tick())
    assert cache.tlru_bookkeeping and not RadixCache("lru").tlru_bookkeeping
    cache.insert(CONVERSATION)
    cache.insert(TURN_2)
    turn1 = cache.root.children[100]
    tail = turn1.children[110]
    assert (turn1._tlru_cached_prefix_len, turn1._tlru_history_len) == (10, 20)
    assert (tail._tlru_cached_prefix_len, tail._tlru_history_len) == (20, 20)
    assert cache.root._tlru_history_len == 20
    # A match ending inside turn 1 splits it: the upper node ends at 4 tokens and keeps
    # the branch's high-water mark; the lower node keeps both lengths.
    upper = cache.match_prefix([100, 101, 102, 103, 0]).last_node
    assert (upper._tlru_cached_prefix_len, upper._tlru_history_len) == (4, 20)
    lower = upper.children[104]
    assert (lower._tlru_cached_prefix_len, lower._tlru_history_len) == (10, 20)
    # A new branch under the upper node: its own depth, no lowering of the mark.
    cache.insert([100, 101, 102, 103, 7])
    branch = upper.children[7]
    assert (branch._tlru_cached_prefix_len, branch._tlru_history_len) == (5, 5)
    assert upper._tlru_history_len == 20


def test_tlru_drains_tel_safe_tails_first_and_keeps_the_high_water_mark() -> None:
    # threshold 12, next prompt 2: a conversation of L tokens keeps L + 2 - 12 cached.
    # Turn 2's tail (tokens 10-20 of a 20-token branch) is TEL-safe and goes first,
    # though the long prompt is older; turn 1 (10 tokens) is not TEL-safe afterwards,
    # because L stays 20 when the tail goes.
    ops: list[Op] = [("insert", LONG_PROMPT), ("insert", CONVERSATION), ("insert", TURN_2)]
    ops += [("evict", 1), ("evict", 1), ("evict", 1)]
    tail, turn1 = list(range(110, 120)), CONVERSATION
    config = {"threshold": 12, "next_prompt_estimate": 2}
    assert run("tlru", ops, **config) == [[tail], [LONG_PROMPT], [turn1]]
    assert run("lru", ops) == [[LONG_PROMPT], [tail], [turn1]]
    # The SGLang defaults (0, 0) make nothing TEL-safe: exactly LRU.
    assert run("tlru", ops) == run("lru", ops)


def test_tlru_a_conversation_within_the_budget_is_wholly_tel_safe() -> None:
    # A 5-token conversation needs nothing cached (5 + 2 - 12 < 0), so it goes before
    # the older, longer prompt, which LRU would evict first.
    ops: list[Op] = [("insert", LONG_PROMPT), ("insert", [1, 2, 3, 4, 5]), ("evict", 1)]
    assert run("tlru", ops, threshold=12, next_prompt_estimate=2) == [[[1, 2, 3, 4, 5]]]
    assert run("lru", ops) == [[LONG_PROMPT]]


def test_sim_config_and_cli_pass_sglang_policy_config() -> None:
    args = build_parser().parse_args(
        ["--radix-eviction-policy", "tlru", "--radix-eviction-policy-config",
         '{"threshold": 4096, "next_prompt_estimate": 512}']
    )  # fmt: skip
    config = config_from_args(args)
    assert config.eviction == "tlru"
    strategy = config.eviction_strategy()
    assert isinstance(strategy, TLRUStrategy)
    assert (strategy.threshold, strategy.next_prompt_estimate) == (4096, 512)
    core = EngineCore.build(
        SimConfig(eviction="slru", radix_eviction_policy_config={"protected_threshold": 4}),
        load_tokenizer(None),
    )
    assert isinstance(core.cache.strategy, SLRUStrategy)
    assert core.cache.strategy.protected_threshold == 4
    assert config_from_args(build_parser().parse_args([])).eviction == "lru"


@pytest.mark.parametrize(
    ("eviction", "policy_config", "message"),
    [
        ("tlru", None, "needs 'threshold' greater than"),
        ("tlru", {"threshold": 4, "next_prompt_estimate": 4}, "needs 'threshold' greater"),
        ("tlru", {"threshold": -1, "next_prompt_estimate": -2}, "requires non-negative"),
        ("slru", [2], "must be a JSON object"),
    ],
)
def test_sim_config_rejects_what_sglang_rejects_at_startup(
    eviction: str, policy_config: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(eviction=eviction, radix_eviction_policy_config=policy_config)


def test_unknown_policy_keyword_is_a_value_error() -> None:
    config = SimConfig(eviction="slru", radix_eviction_policy_config={"threshold": 3})
    with pytest.raises(ValueError, match="unexpected keyword argument 'threshold'"):
        config.eviction_strategy()
    with pytest.raises(ValueError, match="for SGLang's own policies"):
        EngineCore.build(
            SimConfig(eviction="dart", radix_eviction_policy_config={"x": 1}),
            load_tokenizer(None),
        )
