"""`DartRadixCache` (SGLang's RadixCache + DART) on the scripted scenario of SPEC §3.

System head S (8 tokens, its own owner `system_owner("h")`), segments A-D (6 each),
one private suffix per request (4 each); requests S+A+pA, S+B+pB, S+C+pC, S+D+pD
inserted in that order. Table P̂ = {A: 40, B: 10, C: 30, D: 20}, protect f = 2, so
F_t = {A, C} (S has no entry: no demand, no protection). Expected order:
private suffixes oldest first (pA..pD), unprotected segments by ascending priority
(B, D), the protected ones (C, A), then S, the parent of every other node. Values are
per-position ids (`token_ids`), so the allocator's freed slots name exactly which tokens
went.
"""

from __future__ import annotations

import random
from array import array

import pytest
import torch
from dart_scenario import HEAD, PRIVATE, SEGMENTS, SYSTEM, TABLE, anchors_for, random_requests
from sglang.srt.managers.kv_hints import decode_kv_hints_envelope
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.common import release_kv_cache
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang_support import (
    MockAllocator,
    cache_params,
    dart_cache,
    evict,
    evict_one_by_one,
    insert,
    install_clock,
    key,
    lru_cache,
    token_ids,
    use_clock,
)

from backend_plugin.dart import DartCore, PriorityUpdate
from backend_plugin.sglang_cache import DartRadixCache, SGLangTreeAdapter
from prism_wire import make_kv_hints, parse_kv_hints

pytestmark = pytest.mark.sglang


def request_tokens(name: str) -> list[int]:
    return SYSTEM + SEGMENTS[name] + PRIVATE[name]


def values_of(tokens: list[int], start: int, end: int) -> list[int]:
    return token_ids(tokens)[start:end].tolist()


def expected_nodes(order: str) -> list[list[int]]:
    """'pA' / 'A' / 'S' -> the values of that piece (of request A's path for S)."""
    out = []
    for item in order.split():
        if item == "S":
            out.append(values_of(request_tokens("A"), 0, 8))
        elif item.startswith("p"):
            out.append(values_of(request_tokens(item[1]), 14, 18))
        else:
            out.append(values_of(request_tokens(item), 8, 14))
    return out


@pytest.fixture
def scenario(monkeypatch):
    clock = install_clock(monkeypatch)
    cache, allocator = dart_cache()
    for name in "ABCD":
        clock.now += 1
        hints = parse_kv_hints(make_kv_hints(anchors_for([name], 4), message_id=name))
        tokens = request_tokens(name)
        cache.insert_with_anchors(key(tokens), hints, rid=f"r{name}", value=token_ids(tokens))
    return cache, allocator


def test_evicts_private_then_segments_by_priority_then_protected(scenario):
    cache, allocator = scenario
    cache.dart.inbox.submit(PriorityUpdate(1, TABLE, protect=2))
    assert evict_one_by_one(cache, allocator) == expected_nodes("pA pB pC pD B D C A S")
    stats = cache.dart.stats()
    assert dict(stats.evicted_tokens) == {
        "private": 16, "segment": 20, "protected": 12, "retained": 0
    }  # fmt: skip


def test_never_evicts_a_locked_node(scenario):
    cache, allocator = scenario
    last = cache.match_prefix(MatchPrefixParams(key=key(request_tokens("D")))).last_device_node
    cache.inc_lock_ref(last)
    cache.dart.inbox.submit(PriorityUpdate(1, TABLE, protect=2))
    assert evict_one_by_one(cache, allocator) == expected_nodes("pA pB pC B C A")
    assert cache.protected_size() == 18 and cache.evictable_size() == 0


def test_with_no_table_the_scenario_is_lru(scenario):
    cache, allocator = scenario
    assert evict_one_by_one(cache, allocator) == expected_nodes("pA A pB B pC C pD D S")


def test_anchors_split_nodes_at_exact_offsets(monkeypatch):
    clock = install_clock(monkeypatch)
    cache, _ = dart_cache()
    tokens = SYSTEM + SEGMENTS["A"] + SEGMENTS["B"] + PRIVATE["A"]
    insert(cache, tokens)  # one 24-token node
    clock.now = 1.0
    cache.match_prefix(MatchPrefixParams(key=key(SYSTEM + SEGMENTS["A"][:3])))  # SGLang split
    hints = parse_kv_hints(make_kv_hints(anchors_for(["A", "B"], 4), message_id="r"))
    clock.now = 2.0
    cache.place(tokens, hints)
    path = SGLangTreeAdapter(cache).walk(tokens)
    assert [(s, e) for _, s, e in path] == [(0, 8), (8, 11), (11, 14), (14, 20), (20, 24)]
    metas = [node.prism_meta for node, _, _ in path]
    assert [m.owner for m in metas] == [HEAD, "A", "A", "B", None]
    assert [m.is_anchor for m in metas] == [True, False, True, True, True]
    # placing a boundary is not an access: the new upper nodes keep the node's time
    # (SGLang's match at t=1 refreshed the whole split node, its lower half included)
    assert all(1.0 <= node.last_access_time < 2.0 for node, _, _ in path)
    # a later SGLang split inside B gives the upper half B's owner too
    cache.match_prefix(MatchPrefixParams(key=key(SYSTEM + SEGMENTS["A"] + SEGMENTS["B"][:2])))
    path = SGLangTreeAdapter(cache).walk(tokens)
    assert [(s, e) for _, s, e in path][3:5] == [(14, 16), (16, 20)]
    assert [(n.prism_meta.owner, n.prism_meta.is_anchor) for n, _, _ in path[3:5]] == [
        ("B", False),
        ("B", True),
    ]
    assert cache.dart.stats().anchors_resident == 4


def test_checkpoint_of_a_real_req_reads_rid_and_kv_hints(published_server_args):
    """The scheduler's own insertion path: `Req` carrying SGLang's decoded KvHintsEnvelope,
    `checkpoint` via `release_kv_cache`, then `on_release` ends its share of a_t."""
    pool = ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
    allocator = MockAllocator()
    cache = DartRadixCache(cache_params(allocator, pool), DartCore("lru+active"))
    tokens = request_tokens("A")
    envelope = decode_kv_hints_envelope(make_kv_hints(anchors_for(["A"], 4), message_id="rA"))
    req = Req("rA", "", array("q", tokens), SamplingParams(max_new_tokens=1), kv_hints=envelope)
    pool.alloc([req])
    req.kv.kv_allocated_len = req.kv.kv_committed_len = len(tokens)
    pool.write((req.kv.req_pool_idx, slice(0, len(tokens))), torch.arange(len(tokens)) + 100)
    req.refresh_fill_ids()
    cache.checkpoint(req, up_to=len(tokens))  # what the scheduler does after a prefill chunk
    assert [len(n.key) for n, _, _ in SGLangTreeAdapter(cache).walk(tokens)] == [8, 6, 4]
    assert cache.protected_size() == 18  # the running request holds its path
    assert cache.dart.active_count("A") == 1 and cache.dart.active_count(HEAD) == 1
    release_kv_cache(req, cache, checkpoint=True)  # finish: checkpoint + unlock + on_release
    assert cache.dart.active_count("A") == 0
    assert cache.evictable_size() == 18 and cache.protected_size() == 0
    assert cache.dart.stats().anchors_resident == 3


def test_the_protected_set_is_bounded_by_the_real_kv_pool():
    """The cache reads the pool's size from SGLang's own `TokenToKVPoolAllocator` and
    bounds F_t to `protect_fraction` of it: pool 64, fraction 0.25 -> 16 tokens, so of
    the table's top two (A, C: 6 tokens each) and the head (8) only a prefix fits."""
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    allocator = TokenToKVPoolAllocator(64, torch.float32, "cpu", None, False)
    cache = DartRadixCache(cache_params(allocator), DartCore(protect=3))
    assert cache.dart.capacity_tokens == 64 and cache.dart.protect_cap_tokens == 16
    for name in "AC":
        hints = parse_kv_hints(make_kv_hints(anchors_for([name], 4), message_id=name))
        tokens = request_tokens(name)
        cache.insert_with_anchors(key(tokens), hints, rid=f"r{name}", value=token_ids(tokens))
    cache.dart.inbox.submit(PriorityUpdate(1, {HEAD: 50.0, "A": 40.0, "C": 30.0}, protect=3))
    cache.dart.apply_pending()
    assert cache.dart.protected == {HEAD, "A"}  # 8 + 6 = 14; with C 20 > 16
    assert cache.dart.stats().as_dict()["protected_segments"] == ["<system:h>", "A"]


# ---- differential: DART with no table == SGLang's LRU RadixCache -------------------------


@pytest.mark.parametrize("anchored", [False, True])
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_no_table_matches_sglang_lru_exactly(monkeypatch, seed, anchored):
    """Same ops on DART (no table) and SGLang's plain LRU RadixCache: same matched
    lengths, evictable/protected sizes and evicted token sets. With anchors the LRU tree
    gets the same node boundaries (a boundary changes what LRU itself refreshes on a
    partial match), through the same SGLang `_split_node`."""
    rng = random.Random(seed)
    # one clock per tree: both see the same sequence of calls, hence the same times
    dart_clock, lru_clock = install_clock(monkeypatch), install_clock(monkeypatch)
    dart, dart_alloc = dart_cache()
    lru, lru_alloc = lru_cache()
    if not anchored:
        dart.dart.inbox.submit(PriorityUpdate(1, TABLE, protect=2))  # no anchors: no effect
    requests = list(random_requests(rng, 120))
    locks = []
    evicted_total = 0
    for step in range(400):
        dart_clock.now = lru_clock.now = float(step)
        op = rng.random()
        rid, tokens, anchors = rng.choice(requests)
        if op < 0.55:
            hints = parse_kv_hints(make_kv_hints(anchors, message_id=rid)) if anchored else None
            use_clock(dart_clock)
            got = dart.insert_with_anchors(key(tokens), hints, rid=rid, value=token_ids(tokens))
            use_clock(lru_clock)
            assert got == insert(lru, tokens)
            if anchored:
                adapter = SGLangTreeAdapter(lru)
                for anchor in anchors:  # split LRU's path at the same offsets
                    for node, start, end in adapter.walk(tokens):
                        if start < anchor["offset"] < end:
                            adapter.split(node, anchor["offset"] - start)
        elif op < 0.7:
            cut = key(tokens[: rng.randint(1, len(tokens))])
            use_clock(dart_clock)
            a = dart.match_prefix(MatchPrefixParams(key=cut))
            use_clock(lru_clock)
            b = lru.match_prefix(MatchPrefixParams(key=cut))
            assert a.device_prefix_len == b.device_prefix_len
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
