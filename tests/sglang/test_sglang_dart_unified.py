"""DART on SGLang 0.5.23's `UnifiedRadixCache` (`backend_plugin.sglang_unified`), the
tree that carries HiCache, run through SGLang's own Python tree core.

The host tier's copies are CUDA work (SGLang pins its host pool with cudaHostRegister
and copies on CUDA streams), so on this CPU the tests drive the tree core's own host
transitions where the cache controller would: `commit_backup` when a write-through copy
lands, `commit_load_back` when a load lands. Everything else (insertion, matching,
splits, device eviction, demotion to host) is SGLang's code.
"""

from __future__ import annotations

import dataclasses
import random
from array import array

import pytest
import torch
from dart_scenario import HEAD, PRIVATE, SEGMENTS, SYSTEM, TABLE, anchors_for, random_requests
from sglang.srt.managers.kv_hints import decode_kv_hints_envelope
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.common import release_kv_cache
from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang_support import MockAllocator, cache_params, evict, evict_one_by_one, key, token_ids

from backend_plugin.dart import DartCore, PriorityUpdate
from backend_plugin.dart.core import RetainedLoss
from backend_plugin.sglang_unified import DartTreeCore, DartUnifiedRadixCache, UnifiedTreeAdapter
from prism_wire import Retention, make_kv_hints, parse_kv_hints

pytestmark = pytest.mark.sglang


def unified_params(allocator: MockAllocator, req_to_token_pool=None, **fields):
    """What `create_unified_radix_cache` hands the cache for a full-attention model."""
    params = cache_params(allocator, req_to_token_pool)
    return dataclasses.replace(params, tree_components=(ComponentType.FULL,), **fields)


def dart_unified(policy: str = "dart", protect: int = 2, host: bool = False):
    allocator = MockAllocator()
    cache = DartUnifiedRadixCache(unified_params(allocator), DartCore(policy, protect=protect))
    if host:
        cache.tree_core.set_hicache_enabled()  # what init_hicache does once its pools exist
    return cache, allocator


def sglang_unified(host: bool = False):
    """SGLang's own unified tree, Python core, LRU (the Rust core orders it the same)."""
    allocator = MockAllocator()
    cache = UnifiedRadixCache(unified_params(allocator, tree_core_backend="python"))
    if host:
        cache.tree_core.set_hicache_enabled()
    return cache, allocator


def back_up(cache: UnifiedRadixCache) -> None:
    """Every device node gets its host copy, as SGLang's write-through does once the
    copy is acknowledged (`commit_backup`, host slots numbered like the device's)."""
    core = cache.tree_core
    stack = list(core.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        full = node.component_data[ComponentType.FULL]
        if full.host_value is None and full.value is not None:
            core.commit_backup(node.id, full.value.clone(), {})


def resident(cache: DartUnifiedRadixCache) -> set[str]:
    """The segments DART reports resident (what the proxy's QAS reads)."""
    return set(cache.dart.residency_summary(None, None).resident)


def request_tokens(name: str) -> list[int]:
    return SYSTEM + SEGMENTS[name] + PRIVATE[name]


def expected_nodes(order: str) -> list[list[int]]:
    out = []
    for item in order.split():
        tokens = request_tokens("A" if item == "S" else item[-1])
        start, end = {"S": (0, 8), "p": (14, 18)}.get(item[0], (8, 14))
        out.append(token_ids(tokens)[start:end].tolist())
    return out


def scenario(host: bool = False):
    cache, allocator = dart_unified(host=host)
    for name in "ABCD":
        hints = parse_kv_hints(make_kv_hints(anchors_for([name], 4), message_id=name))
        tokens = request_tokens(name)
        cache.insert_with_anchors(key(tokens), hints, rid=f"r{name}", value=token_ids(tokens))
    return cache, allocator


def test_the_unified_tree_runs_on_dart_s_core_and_order():
    cache, allocator = scenario()
    assert type(cache.tree_core) is DartTreeCore
    cache.dart.inbox.submit(PriorityUpdate(1, TABLE, protect=2))
    assert evict_one_by_one(cache, allocator) == expected_nodes("pA pB pC pD B D C A S")
    assert dict(cache.dart.stats().evicted_tokens) == {
        "private": 16, "segment": 20, "protected": 12, "retained": 0
    }  # fmt: skip
    assert cache.dart.stats().anchors_resident == 0
    assert cache.dart.stats().host_demoted_tokens is None  # no host tier


def test_with_no_table_the_scenario_is_lru():
    cache, allocator = scenario()
    assert evict_one_by_one(cache, allocator) == expected_nodes("pA A pB B pC C pD D S")


def test_sglang_splits_carry_the_owner_to_the_upper_half():
    cache, _ = dart_unified()
    tokens = SYSTEM + SEGMENTS["A"] + SEGMENTS["B"] + PRIVATE["A"]
    cache.insert(InsertParams(key=key(tokens), value=token_ids(tokens)))
    hints = parse_kv_hints(make_kv_hints(anchors_for(["A", "B"], 4), message_id="r"))
    cache.place(tokens, hints)
    path = UnifiedTreeAdapter(cache).walk(tokens)
    assert [(s, e) for _, s, e in path] == [(0, 8), (8, 14), (14, 20), (20, 24)]
    # SGLang's match splits inside B: the upper half is B's, no longer at the anchor
    cache.match_prefix(MatchPrefixParams(key=key(SYSTEM + SEGMENTS["A"] + SEGMENTS["B"][:2])))
    path = UnifiedTreeAdapter(cache).walk(tokens)
    assert [(s, e) for _, s, e in path] == [(0, 8), (8, 14), (14, 16), (16, 20), (20, 24)]
    metas = [node.prism_meta for node, _, _ in path]
    assert [(m.owner, m.is_anchor) for m in metas] == [
        (HEAD, True), ("A", True), ("B", False), ("B", True), (None, True)
    ]  # fmt: skip
    assert cache.dart.stats().anchors_resident == 4


def test_host_tier_demotes_in_dart_order_and_forgets_what_left_the_device():
    """With HiCache every node has a host copy: device eviction demotes in DART's order,
    the demoted nodes stay matchable from host, and DART no longer counts them."""
    cache, allocator = scenario(host=True)
    back_up(cache)
    cache.dart.inbox.submit(PriorityUpdate(1, TABLE, protect=2))
    gone = evict(cache, allocator, 16 + 6)  # the four private suffixes, then B
    assert gone == {v for node in expected_nodes("pA pB pC pD B") for v in node}
    assert dict(cache.dart.stats().evicted_tokens) == {
        "private": 16, "segment": 6, "protected": 0, "retained": 0
    }  # fmt: skip
    assert cache.dart.stats().host_demoted_tokens == 22  # all of it kept on host
    assert resident(cache) == {"A", "C", "D"}
    b = cache.match_prefix(MatchPrefixParams(key=key(request_tokens("B"))))
    assert (b.device_prefix_len, b.host_hit_length) == (8, 10)  # head on device, B+pB on host
    path = UnifiedTreeAdapter(cache).walk(request_tokens("B"))
    assert [(s, e) for _, s, e in path] == [(0, 8)]  # the walk stops at host-only nodes
    node_b = cache.tree_core.node_by_id(b.last_host_node).parent
    assert node_b.evicted and node_b.backuped and node_b.prism_meta is None
    assert node_b.prism_host_meta.owner == "B"  # kept apart, for the host tier's order


def host_copies(cache: UnifiedRadixCache) -> set[tuple[int, ...]]:
    """The token values of every host copy in the tree."""
    out, stack = set(), list(cache.tree_core.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        host = node.component_data[ComponentType.FULL].host_value
        if host is not None:
            out.add(tuple(host.tolist()))
    return out


def evict_host_one_by_one(cache: UnifiedRadixCache) -> list[list[int]]:
    """SGLang's host eviction (`evict_host`, what the host pool calls when full), a token
    at a time; the evicted copies in order."""
    order = []
    while copies := host_copies(cache):
        cache.evict_host(1)
        gone = copies - host_copies(cache)
        assert gone, "host eviction made no progress"
        order.extend(sorted(list(g) for g in gone))
    return order


@pytest.mark.parametrize("host_order", ["dart", "lru"])
def test_sglangs_host_eviction_follows_darts_order_or_lru(host_order: str):
    """Once everything is on host only, SGLang's own host eviction heaps the host leaves
    by the tree core's strategy: DART's order with the owners kept at demotion (private
    first, then by P̂, the retained B above those, protected last), or least recently used
    first with "lru"."""
    cache, allocator = dart_unified(host=True)
    cache.dart.host_order = host_order  # PRISM_DART_HOST_ORDER (build_dart_cache)
    for name in "ABCD":
        hints = parse_kv_hints(make_kv_hints(anchors_for([name], 4), message_id=name))
        tokens = request_tokens(name)
        cache.insert_with_anchors(key(tokens), hints, rid=f"r{name}", value=token_ids(tokens))
    back_up(cache)
    cache.dart.inbox.submit(PriorityUpdate(1, TABLE, protect=2))
    cache.dart.inbox.submit_retain(Retention({"B": (1.0, 60.0, None)}))
    evict(cache, allocator, 10**6)  # every node demoted: no loss for the retained B
    assert cache.dart.stats().host_demoted_tokens == 8 + 4 * 10
    assert cache.dart.retained_loss("B") == RetainedLoss()
    expected = "pA pB pC pD D B C A S" if host_order == "dart" else "pA A pB B pC C pD D S"
    assert evict_host_one_by_one(cache) == expected_nodes(expected)
    # the host tier dropped B's copy while retained: lost there (only DART's order knows)
    dropped = cache.dart.retained_loss("B").host_at
    assert (dropped is not None) is (host_order == "dart")


def test_a_history_loaded_back_from_host_is_annotated_again():
    cache, allocator = scenario(host=True)
    back_up(cache)
    cache.dart.inbox.submit(PriorityUpdate(1, TABLE, protect=2))
    evict(cache, allocator, 16 + 6)
    tokens = request_tokens("B")
    match = cache.match_prefix(MatchPrefixParams(key=key(tokens)))
    core = cache.tree_core
    nodes, node = [], core.node_by_id(match.last_host_node)
    while node.evicted:  # what the controller loads: host-only nodes, root side first
        nodes.insert(0, node.id)
        node = node.parent
    transfer = PoolTransfer(name=PoolName.KV, nodes_to_load=nodes)
    device = torch.cat([core.node_by_id(i).component_data[ComponentType.FULL].host_value
                        for i in nodes])  # fmt: skip
    core.commit_load_back(match.last_host_node, device, transfer, {})
    core.finish_load_back(match.last_host_node)
    assert "B" not in resident(cache)
    hints = parse_kv_hints(make_kv_hints(anchors_for(["B"], 4), message_id="B2"))
    cache.insert_with_anchors(key(tokens), hints, rid="rB2", value=token_ids(tokens))
    assert "B" in resident(cache)
    assert [n.prism_meta.owner for n, _, _ in UnifiedTreeAdapter(cache).walk(tokens)] == [
        HEAD, "B", None
    ]  # fmt: skip


def test_checkpoint_of_a_real_req_reads_rid_and_kv_hints(published_server_args):
    """The scheduler's insertion path on the unified tree: a `Req` with SGLang's decoded
    KvHintsEnvelope, `checkpoint` through `release_kv_cache`, then `on_release`."""
    pool = ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
    allocator = MockAllocator()
    cache = DartUnifiedRadixCache(unified_params(allocator, pool), DartCore("lru+active"))
    tokens = request_tokens("A")
    envelope = decode_kv_hints_envelope(make_kv_hints(anchors_for(["A"], 4), message_id="rA"))
    req = Req("rA", "", array("q", tokens), SamplingParams(max_new_tokens=1), kv_hints=envelope)
    pool.alloc([req])
    req.kv.kv_allocated_len = req.kv.kv_committed_len = len(tokens)
    pool.write((req.kv.req_pool_idx, slice(0, len(tokens))), torch.arange(len(tokens)) + 100)
    req.refresh_fill_ids()
    cache.checkpoint(req, up_to=len(tokens))
    assert [len(n.key) for n, _, _ in UnifiedTreeAdapter(cache).walk(tokens)] == [8, 6, 4]
    assert cache.dart.active_count("A") == 1 and cache.dart.active_count(HEAD) == 1
    release_kv_cache(req, cache, checkpoint=True)
    assert cache.dart.active_count("A") == 0
    assert cache.evictable_size() == 18 and cache.protected_size() == 0


@pytest.mark.parametrize("host", [False, True])
@pytest.mark.parametrize("seed", [21, 22, 23])
def test_no_table_matches_sglang_unified_lru_exactly(seed, host):
    """Same ops on DART's unified tree (anchors placed, no table) and SGLang's own
    unified tree with LRU, split at the same offsets: same matched lengths (device and
    host), sizes, and evicted tokens."""
    rng = random.Random(seed)
    dart, dart_alloc = dart_unified(host=host)
    lru, lru_alloc = sglang_unified(host=host)
    requests = list(random_requests(rng, 120))
    locks = []
    evicted_total = 0
    for step in range(400):
        op = rng.random()
        rid, tokens, anchors = rng.choice(requests)
        if op < 0.55:
            hints = parse_kv_hints(make_kv_hints(anchors, message_id=rid))
            got = dart.insert_with_anchors(key(tokens), hints, rid=rid, value=token_ids(tokens))
            plain = lru.insert(InsertParams(key=key(tokens), value=token_ids(tokens)))
            assert got == plain.prefix_len
            adapter = UnifiedTreeAdapter(lru)
            for anchor in anchors:
                for node, start, end in adapter.walk(tokens):
                    if start < anchor["offset"] < end:
                        adapter.split(node, anchor["offset"] - start)
            if host:
                back_up(dart)
                back_up(lru)
        elif op < 0.7:
            cut = key(tokens[: rng.randint(1, len(tokens))])
            a = dart.match_prefix(MatchPrefixParams(key=cut))
            b = lru.match_prefix(MatchPrefixParams(key=cut))
            assert (a.device_prefix_len, a.host_hit_length) == (
                b.device_prefix_len,
                b.host_hit_length,
            )
            if op < 0.62 and a.device_prefix_len:
                locks.append((dart.lock(a.last_device_node), lru.lock(b.last_device_node)))
        elif op < 0.8 and locks:
            a_lock, b_lock = locks.pop(rng.randrange(len(locks)))
            dart.unlock(a_lock)
            lru.unlock(b_lock)
        else:
            n = rng.randint(1, 40)
            gone = evict(dart, dart_alloc, n)
            assert gone == evict(lru, lru_alloc, n), f"step {step}"
            evicted_total += len(gone)
        assert dart.evictable_size() == lru.evictable_size()
        assert dart.protected_size() == lru.protected_size()
    assert evicted_total > 100
