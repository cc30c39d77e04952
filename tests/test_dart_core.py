"""DART core on the simulator's radix tree (SPEC §3), no sglang involved.

The scripted scenario: a system head S (its own owner `system_owner("h")`),
segments A-D, one private suffix per request, each request = S + one segment + its
suffix, inserted in the order A, B, C, D (so plain LRU would evict pA, A, pB, B, ...).
Table P̂ = {A: 40, B: 10, C: 30, D: 20} with protect = 2, so F_t = {A, C}: the head has
no table entry (no demand), hence P̂ = 0 and no protection. Expected DART order: the
private suffixes by age (pA, pB, pC, pD), then the unprotected segments by ascending
priority (B 10, D 20), then the protected ones (C 30, A 40), then S, a parent of every
other node, last.
"""

from __future__ import annotations

import random
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from dart_scenario import HEAD, PRIVATE, SEGMENTS, SYSTEM, TABLE, anchors_for, random_requests

from backend_plugin.dart import (
    DartCore,
    EvictionPolicy,
    NodeMeta,
    PriorityUpdate,
    StaleEpochError,
    eviction_key,
)
from backend_plugin.sim_extension import DartSimExtension
from prism_sim.radix_cache import RadixCache
from prism_sim.request import SimRequest
from prism_wire import AnchorError, AnchorKind, make_kv_hints, parse_kv_hints, system_owner


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def dart_sim_cache(
    policy: str = "dart", protect: int = 2, capacity_tokens: int | None = None
) -> tuple[RadixCache, Clock, Any]:
    clock = Clock()
    ext = DartSimExtension(DartCore(policy, protect=protect, capacity_tokens=capacity_tokens))
    cache = RadixCache(ext.strategy, clock=clock)
    ext.attach(cache)
    return cache, clock, ext


def sim_request(rid: str, tokens: list[int], kv_hints) -> SimRequest:
    return SimRequest(rid=rid, input_ids=tokens, max_new_tokens=1, arrival_s=0.0, kv_hints=kv_hints)


def insert_request(cache, ext, rid: str, tokens: list[int], kv_hints) -> SimRequest:
    req = sim_request(rid, tokens, kv_hints)
    cache.insert(tokens)
    ext.on_insert(req, cache, tokens)
    return req


def build_scenario(policy: str = "dart", capacity_tokens: int | None = None):
    cache, clock, ext = dart_sim_cache(policy, capacity_tokens=capacity_tokens)
    requests = {}
    for name in "ABCD":
        clock.now += 1
        tokens = SYSTEM + SEGMENTS[name] + PRIVATE[name]
        hints = make_kv_hints(anchors_for([name], 4), message_id=name)
        requests[name] = insert_request(cache, ext, f"r{name}", tokens, hints)
    return cache, clock, ext, requests


def evict_one_by_one(cache) -> list[list[int]]:
    order = []
    while cache.evictable_size():
        order += [list(node.key) for node in cache.evict(1).evicted_nodes]
    return order


# ---- anchors ------------------------------------------------------------------------


def test_kv_hints_envelope_bare_and_struct_forms_parse_alike():
    anchors = anchors_for(["A"], 4)
    envelope = make_kv_hints(anchors, {"A": 3.0}, message_id="r1")
    bare = {"prism": {"anchors": anchors, "priorities": {"A": 3.0}}}
    action = envelope["actions"][0]
    struct = SimpleNamespace(actions=[SimpleNamespace(**action)])  # KvHintsEnvelope shape
    parsed = [parse_kv_hints(v) for v in (envelope, bare, struct)]
    assert parsed[0] == parsed[1] == parsed[2]
    assert [a.offset for a in parsed[0].anchors] == [8, 14, 18]
    assert parsed[0].anchors[1].kind is AnchorKind.SEGMENT
    assert parsed[0].priorities == {"A": 3.0}
    assert parse_kv_hints(None) is None
    assert parse_kv_hints({"protocol_version": "1", "message_id": "x", "actions": []}) is None


@pytest.mark.parametrize(
    "payload",
    [
        {"anchors": "nope"},
        {"anchors": [{"kind": "bogus", "offset": 3}]},
        {"anchors": [{"kind": "segment", "segment_id": None, "offset": 3}]},
        {"anchors": [{"kind": "private", "offset": 0}]},
        {"anchors": [{"kind": "private", "offset": "7"}]},
        {"anchors": [{"kind": "system", "offset": 8}, {"kind": "private", "offset": 8}]},
        {"anchors": [], "priorities": {"A": "high"}},
    ],
)
def test_malformed_anchors_are_rejected(payload):
    with pytest.raises(AnchorError):
        parse_kv_hints({"prism": payload})


# ---- keys ---------------------------------------------------------------------------

PRIV = NodeMeta(AnchorKind.PRIVATE, None)
SEG_A = NodeMeta(AnchorKind.SEGMENT, "A")
SEG_Z = NodeMeta(AnchorKind.SEGMENT, "Z")
SYS = NodeMeta(AnchorKind.SYSTEM, "h", True)
LEGACY_SYS = NodeMeta(AnchorKind.SYSTEM, None, True)  # a system anchor without an id


@pytest.mark.parametrize(
    ("policy", "meta", "table", "protected", "expected"),
    [
        # dart: (class, P̂, last); no table: every node (0, 0, last) = LRU
        (EvictionPolicy.DART, SEG_A, None, frozenset(), (0, 0.0, 5.0)),
        (EvictionPolicy.DART, PRIV, {"A": 7.0}, frozenset(), (0, 0.0, 5.0)),
        (EvictionPolicy.DART, None, {"A": 7.0}, frozenset(), (0, 0.0, 5.0)),
        (EvictionPolicy.DART, SEG_A, {"A": 7.0}, frozenset(), (1, 7.0, 5.0)),
        (EvictionPolicy.DART, SEG_Z, {"A": 7.0}, frozenset(), (1, 0.0, 5.0)),  # not in table
        (EvictionPolicy.DART, SEG_A, {"A": 7.0}, frozenset({"A"}), (3, 7.0, 5.0)),
        # a system head: its own table entry, no special case
        (EvictionPolicy.DART, SYS, {"A": 7.0}, frozenset(), (1, 0.0, 5.0)),
        (EvictionPolicy.DART, SYS, {"A": 7.0, HEAD: 3.0}, frozenset(), (1, 3.0, 5.0)),
        (EvictionPolicy.DART, SYS, {HEAD: 3.0}, frozenset({HEAD}), (3, 3.0, 5.0)),
        (EvictionPolicy.DART, LEGACY_SYS, {"A": 7.0}, frozenset(), (1, 0.0, 5.0)),
        # lru+active: (a_t(seg), last) with a_t(A) = 3
        (EvictionPolicy.LRU_ACTIVE, SEG_A, None, frozenset(), (3, 5.0)),
        (EvictionPolicy.LRU_ACTIVE, PRIV, None, frozenset(), (0, 5.0)),
        # lfu: (hits, last) with 2 hits; lru: last
        (EvictionPolicy.LFU, SEG_A, {"A": 7.0}, frozenset({"A"}), (2, 5.0)),
        (EvictionPolicy.LRU, SEG_A, {"A": 7.0}, frozenset({"A"}), 5.0),
    ],
)
def test_eviction_keys(policy, meta, table, protected, expected):
    key = eviction_key(policy, meta, 5.0, 2, table=table, protected=protected, active={"A": 3})
    assert key == expected


@pytest.mark.parametrize(
    ("meta", "table", "protected", "expected"),
    [
        # R_t: after every unretained owner, before F_t, by its score; with or without
        # a table
        (SEG_A, None, frozenset(), (2, -4.0, 5.0)),
        (SEG_A, {"Z": 7.0}, frozenset(), (2, -4.0, 5.0)),
        (SEG_A, {"A": 7.0}, frozenset(), (2, -4.0, 5.0)),
        (SEG_A, {"A": 7.0}, frozenset({"A"}), (3, 7.0, 5.0)),
        (SEG_Z, {"A": 7.0}, frozenset(), (1, 0.0, 5.0)),
        (SEG_Z, None, frozenset(), (0, 0.0, 5.0)),
        (PRIV, None, frozenset(), (0, 0.0, 5.0)),
    ],
)
def test_retained_keys(meta, table, protected, expected):
    retained = {"A": -4.0}  # R_t: owner -> score
    key = eviction_key(
        EvictionPolicy.DART, meta, 5.0, 0, table=table, protected=protected, active={},
        retained=retained,
    )  # fmt: skip
    assert key == expected


# ---- priority table and protection set ------------------------------------------------


def test_stale_epochs_are_rejected_and_reset_restarts_them():
    core = DartCore()
    core.inbox.submit(PriorityUpdate(5, {"A": 1.0}))
    for stale in (5, 4):
        with pytest.raises(StaleEpochError):
            core.inbox.submit(PriorityUpdate(stale, {"A": 2.0}))
    assert core.table is None  # queued, not applied before the owner drains
    core.apply_pending()
    assert core.table == {"A": 1.0} and core.stats().epoch == 5
    core.inbox.submit_reset()
    core.apply_pending()
    assert core.table is None and core.stats().epoch is None
    core.inbox.submit(PriorityUpdate(1, {"B": 1.0}))
    core.apply_pending()
    assert core.stats().epoch == 1


def test_protection_is_earned_by_table_entries_heads_included():
    """F_t = the top-f resident owners with P̂ > 0; a system head is one more owner,
    ranked by its own entry, never by its kind."""
    core = DartCore(protect=3)
    seg_b = NodeMeta(AnchorKind.SEGMENT, "B")
    for meta, tokens in ((SYS, 8), (LEGACY_SYS, 8), (SEG_A, 6), (seg_b, 6), (SEG_Z, 6)):
        core.on_assign(None, meta, tokens)

    def push(epoch: int, table: dict[str, float], protect: int = 2) -> frozenset[str]:
        core.inbox.submit(PriorityUpdate(epoch, table, protect=protect))
        core.apply_pending()
        return core.protected

    # C ranks highest but is not resident; Z is resident with no entry; the heads have
    # no entry (no demand): neither is protected, whatever its kind
    assert push(1, {"A": 5.0, "B": 1.0, "C": 99.0}) == {"A", "B"}
    assert push(2, {"A": 5.0, "B": 1.0, HEAD: 7.0}) == {HEAD, "A"}  # ranked by its entry
    assert push(3, {"A": 5.0, "B": 1.0, HEAD: 3.0}) == {"A", HEAD}
    assert push(4, {"A": 5.0, HEAD: 0.0}) == {"A"}  # P̂ = 0 earns nothing
    # the legacy head (a system anchor without an id) is an ordinary owner too
    assert push(5, {system_owner(None): 2.0, "B": 1.0}, protect=1) == {system_owner(None)}
    assert core.stats().as_dict()["protected_segments"] == ["<system>"]
    push(6, {"A": 5.0, "B": 1.0, HEAD: 3.0})
    assert core.stats().as_dict()["protected_segments"] == ["<system:h>", "A"]
    core.on_evicted(SEG_A, 6)  # A leaves the tree: the snapshot changes at the next pass
    assert core.protected == {"A", HEAD}
    core.begin_eviction()
    assert core.protected == {HEAD, "B"}
    assert push(7, {"A": 5.0, "B": 1.0}, protect=0) == frozenset()


def test_protection_is_bounded_by_a_share_of_the_pool():
    """F_t is the longest prefix of the ranking within f owners and the token cap:
    capacity 40 x fraction 0.5 = 20 tokens."""
    core = DartCore(protect=3, capacity_tokens=40, protect_fraction=0.5)
    metas = {name: NodeMeta(AnchorKind.SEGMENT, name) for name in "ABC"}
    for meta in metas.values():
        core.on_assign(None, meta, 8)
    core.inbox.submit(PriorityUpdate(1, {"A": 3.0, "B": 2.0, "C": 1.0}, protect=3))
    core.apply_pending()
    assert core.protected == {"A", "B"}  # 16 tokens; with C 24 > 20
    stats = core.stats()
    assert (stats.protect_cap_tokens, stats.capacity_tokens, stats.protected_tokens) == (20, 40, 16)
    assert stats.as_dict()["protect_cap_tokens"] == 20
    # B shrinks to 2 tokens (a partial eviction): C now fits, at the next pass
    core.on_evicted(NodeMeta(AnchorKind.SEGMENT, "B"), 6)
    core.begin_eviction()
    assert core.protected == {"A", "B", "C"} and core.stats().protected_tokens == 18
    # A grows past the cap on its own (resident on a second path): a prefix, not a best
    # fit, so nothing ranked below A is protected over it
    core.on_assign(None, metas["A"], 16)
    core.begin_eviction()
    assert core.protected == frozenset()
    # without a known capacity there is no cap; a zero fraction protects nothing
    uncapped = DartCore(protect=3)
    zero = DartCore(protect=3, capacity_tokens=40, protect_fraction=0.0)
    for other in (uncapped, zero):
        other.on_assign(None, metas["A"], 100)
        other.inbox.submit(PriorityUpdate(1, {"A": 3.0}))
        other.apply_pending()
    assert uncapped.protected == {"A"} and uncapped.stats().protect_cap_tokens is None
    assert zero.protected == frozenset()
    with pytest.raises(ValueError):
        DartCore(protect_fraction=1.5)


def reference_protection(
    table: dict[str, float], resident: dict[str, int], protect: int, cap: int | None
) -> frozenset[str]:
    """F_t written the obvious way: sort everything, take the fitting prefix."""
    ranked = sorted(((p, o) for o, p in table.items() if p > 0 and resident.get(o, 0) > 0))
    chosen: list[str] = []
    used = 0
    for _, owner in reversed(ranked):
        if len(chosen) == protect or (cap is not None and used + resident[owner] > cap):
            break
        chosen.append(owner)
        used += resident[owner]
    return frozenset(chosen)


@pytest.mark.parametrize("capacity", [None, 30, 60, 200])
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_incremental_protection_equals_a_fresh_computation(seed, capacity):
    """F_t refreshed only when `_dirty` says so equals F_t recomputed from scratch at
    every pass, over random growth, partial evictions, departures and pushes."""
    rng = random.Random(seed)
    core = DartCore(protect=3, capacity_tokens=capacity)
    cap = None if capacity is None else capacity // 4
    owners = [*"ABCDEF", "h1", "h2"]
    meta = {
        o: NodeMeta(AnchorKind.SYSTEM, o) if o.startswith("h") else NodeMeta(AnchorKind.SEGMENT, o)
        for o in owners
    }
    key = {o: meta[o].owner for o in owners}
    resident: dict[str, int] = {}
    table: dict[str, float] = {}
    protect = 3
    refreshes = 0
    refresh = core._refresh_protection

    def counted() -> None:
        nonlocal refreshes
        refreshes += 1
        refresh()

    core._refresh_protection = counted
    passes = 0
    for epoch in range(600):
        owner = rng.choice(owners)
        op = rng.random()
        if op < 0.35:
            tokens = rng.randint(1, 6)
            core.on_assign(None, meta[owner], tokens)
            resident[key[owner]] = resident.get(key[owner], 0) + tokens
        elif op < 0.6 and resident.get(key[owner], 0) > 0:
            tokens = rng.randint(1, resident[key[owner]])
            core.on_evicted(meta[owner], tokens)
            resident[key[owner]] -= tokens
        elif op < 0.65:
            protect = rng.randint(0, 4)
            picked = rng.sample(owners, rng.randint(0, len(owners)))
            table = {key[o]: float(rng.choice([0, 1, 2, 2, 5, 9])) for o in picked}
            core.inbox.submit(PriorityUpdate(epoch, table, protect=protect))
            core.apply_pending()
        else:
            core.begin_eviction()
            passes += 1
            assert core.protected == reference_protection(table, resident, protect, cap)
            if cap is not None:
                assert core.stats().protected_tokens <= cap
    assert refreshes < passes / 2  # most passes reused the snapshot


def test_segment_ids_may_not_enter_the_heads_namespace():
    forged = {"kind": "segment", "segment_id": HEAD, "offset": 3}
    with pytest.raises(AnchorError, match="may not start with"):
        parse_kv_hints({"prism": {"anchors": [forged]}})
    hints = parse_kv_hints({"prism": {"anchors": anchors_for(["A"], 4)}})
    assert hints.owners == {"A", HEAD}
    # the proxy's own ids (documents and turns it found) are segments like any other
    found = {"kind": "segment", "segment_id": "\x00doc:1f2e", "offset": 3}
    assert parse_kv_hints({"prism": {"anchors": [found]}}).segment_ids == {"\x00doc:1f2e"}


# ---- scenario on the simulator's tree ---------------------------------------------------


def test_scenario_evicts_private_then_segments_by_priority_then_protected():
    cache, _, ext, _ = build_scenario()
    ext.core.inbox.submit(PriorityUpdate(1, TABLE, protect=2))
    order = evict_one_by_one(cache)
    expected = [PRIVATE[n] for n in "ABCD"] + [SEGMENTS[n] for n in "BDCA"] + [SYSTEM]
    assert order == expected
    stats = ext.core.stats()
    # 4 suffixes x 4 tokens; B, D (6 each) and S (8) unprotected; C, A (6 each) protected
    assert dict(stats.evicted_tokens) == {
        "private": 16, "segment": 20, "protected": 12, "retained": 0
    }  # fmt: skip
    assert stats.anchors_resident == 0 and stats.annotated_tokens_resident == 0


def test_scenario_never_evicts_a_locked_path():
    cache, _, ext, _ = build_scenario()
    locked = cache.match_prefix(SYSTEM + SEGMENTS["D"] + PRIVATE["D"]).last_node
    cache.inc_lock_ref(locked)
    ext.core.inbox.submit(PriorityUpdate(1, TABLE, protect=2))
    order = evict_one_by_one(cache)
    assert order == [PRIVATE[n] for n in "ABC"] + [SEGMENTS[n] for n in "BCA"]
    assert cache.protected_size() == 8 + 6 + 4
    assert [n.key for n, _, _ in cache.walk(SYSTEM + SEGMENTS["D"] + PRIVATE["D"])] == [
        SYSTEM,
        SEGMENTS["D"],
        PRIVATE["D"],
    ]


def test_scenario_with_no_table_is_lru():
    cache, _, _, _ = build_scenario()
    # LRU: request A (oldest) leaves first, leaf before parent; S goes last
    expected = []
    for n in "ABCD":
        expected += [PRIVATE[n], SEGMENTS[n]]
    assert evict_one_by_one(cache) == [*expected, SYSTEM]


def test_lru_active_keeps_segments_of_running_requests():
    cache, _, ext, requests = build_scenario("lru+active")
    for name in "ACD":  # only rB is still running; the others leave a_t
        ext.on_finish(requests[name])
    order = evict_one_by_one(cache)
    # a_t: B = 1, S = 1 (rB has a system anchor), everything else 0 -> LRU among those
    assert order[:6] == [
        PRIVATE["A"],
        SEGMENTS["A"],
        PRIVATE["B"],
        PRIVATE["C"],
        SEGMENTS["C"],
        PRIVATE["D"],
    ]
    assert order[6:] == [SEGMENTS["D"], SEGMENTS["B"], SYSTEM]
    assert ext.core.stats().active_requests == 1


def test_anchors_split_nodes_at_exact_offsets_and_own_the_whole_span():
    cache, clock, ext = dart_sim_cache()
    tokens = SYSTEM + SEGMENTS["A"] + SEGMENTS["B"] + PRIVATE["A"]
    cache.insert(tokens)  # one node of 24 tokens, no anchors yet
    clock.now += 1
    cache.match_prefix(SYSTEM + SEGMENTS["A"][:3])  # SGLang-style split inside segment A
    hints = make_kv_hints(anchors_for(["A", "B"], 4), message_id="r")
    ext.on_insert(sim_request("r", tokens, hints), cache, tokens)
    spans = [(start, end, getattr(n, "prism_meta", None)) for n, start, end in cache.walk(tokens)]
    assert [(s, e) for s, e, _ in spans] == [(0, 8), (8, 11), (11, 14), (14, 20), (20, 24)]
    owners = [m.owner for _, _, m in spans]
    assert owners == [HEAD, "A", "A", "B", None]
    assert [m.is_anchor for _, _, m in spans] == [True, False, True, True, True]
    # a later split inside B (a match ending there) keeps B as the owner of both halves
    cache.match_prefix(SYSTEM + SEGMENTS["A"] + SEGMENTS["B"][:2])
    spans = [(s, e, n.prism_meta) for n, s, e in cache.walk(tokens)]
    assert [(s, e) for s, e, _ in spans][3:5] == [(14, 16), (16, 20)]
    assert [(m.owner, m.is_anchor) for _, _, m in spans[3:5]] == [("B", False), ("B", True)]
    stats = ext.core.stats()
    assert stats.anchors_resident == 4 and stats.annotated_tokens_resident == 20


def test_a_flush_clears_residency():
    cache, clock, ext, _ = build_scenario()
    assert ext.core.stats().anchors_resident == 1 + 4 * 2  # S, then A-D and their suffixes
    cache.reset()  # what /flush_cache does
    clock.now += 1
    tokens = SYSTEM + SEGMENTS["B"] + PRIVATE["B"]
    insert_request(
        cache, ext, "again", tokens, make_kv_hints(anchors_for(["B"], 4), message_id="x")
    )
    stats = ext.core.stats()
    assert stats.anchors_resident == 3 and stats.annotated_tokens_resident == 8 + 6


# ---- differential: DART with no table == plain LRU ---------------------------------------
#
# Anchors add node boundaries, and a boundary changes what plain LRU itself does (a match
# that ends inside a node refreshes the whole node, SGLang's semantics). So "orders exactly
# like LRU" is checked on the same tree shape: either no anchors at all (and a table
# pushed, which must not matter then), or the LRU tree gets the same boundaries.


def _evicted_ids(cache, result) -> set[tuple[int, ...]]:
    """Each evicted token, named by the token path that ends at it."""
    out: set[tuple[int, ...]] = set()
    for node in result.evicted_nodes:
        path = cache.node_path_tokens(node)
        out.update(tuple(path[:i]) for i in range(len(path) - len(node.key) + 1, len(path) + 1))
    return out


@pytest.mark.parametrize("anchored", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dart_without_table_evicts_exactly_like_lru(seed, anchored):
    rng = random.Random(seed)
    dart, clock, ext = dart_sim_cache()
    lru = RadixCache("lru", clock=clock)
    if not anchored:
        ext.core.inbox.submit(PriorityUpdate(1, TABLE, protect=2))
    requests = list(random_requests(rng, 120))
    locks: list[tuple] = []
    evicted_tokens = 0
    for step in range(400):
        clock.now = float(step)
        op = rng.random()
        rid, tokens, anchors = rng.choice(requests)
        if op < 0.55:
            assert dart.insert(tokens) == lru.insert(tokens)
            hints = make_kv_hints(anchors, message_id=rid) if anchored else None
            ext.on_insert(sim_request(rid, tokens, hints), dart, tokens)
            if anchored:
                for anchor in anchors:
                    lru.split_at(tokens, anchor["offset"])
        elif op < 0.7:
            cut = tokens[: rng.randint(1, len(tokens))]
            a, b = dart.match_prefix(cut), lru.match_prefix(cut)
            assert a.prefix_len == b.prefix_len
            if op < 0.62 and a.prefix_len:
                dart.inc_lock_ref(a.last_node)
                lru.inc_lock_ref(b.last_node)
                locks.append((a.last_node, b.last_node))
        elif op < 0.8 and locks:
            a_node, b_node = locks.pop(rng.randrange(len(locks)))
            dart.dec_lock_ref(a_node)
            lru.dec_lock_ref(b_node)
        else:
            n = rng.randint(1, 40)
            a, b = dart.evict(n), lru.evict(n)
            assert _evicted_ids(dart, a) == _evicted_ids(lru, b), f"step {step}"
            evicted_tokens += a.num_tokens_evicted
        assert dart.evictable_size() == lru.evictable_size()
        assert dart.protected_size() == lru.protected_size()
    assert evicted_tokens > 100  # the comparison did exercise eviction


def test_dart_module_does_not_import_sglang():
    code = (
        "import sys, backend_plugin.dart, backend_plugin.control_rpc, "
        "backend_plugin.sim_extension, backend_plugin.config, backend_plugin.launch\n"
        "bad = sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("policy", list(EvictionPolicy))
def test_strategy_fast_path_equals_the_reference_key(policy):
    """`DartStrategy` inlines the `dart`/`lru` keys; they must equal `eviction_key`."""
    from backend_plugin.dart import DartStrategy

    rng = random.Random(7)
    core = DartCore(policy, protect=2)
    metas = [None, PRIV, SEG_A, SEG_Z, SYS, LEGACY_SYS, NodeMeta(AnchorKind.SEGMENT, "B")]
    for meta in metas:
        if meta is not None:
            core.on_assign(None, meta, 3)
    strategy = DartStrategy(core)
    for epoch in range(3):
        for _ in range(20):
            meta = rng.choice(metas)
            node = SimpleNamespace(
                prism_meta=meta, last_access_time=rng.random(), hit_count=rng.randrange(4)
            )
            assert strategy.get_priority(node) == core.key(
                meta, node.last_access_time, node.hit_count
            )
        table = {"A": rng.random(), "B": rng.random(), HEAD: rng.random()}
        core.inbox.submit(PriorityUpdate(epoch, table, 2))
        core.apply_pending()
