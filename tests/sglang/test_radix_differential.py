"""Differential test of the simulator's radix cache against SGLang's own `RadixCache`:
the same seeded sequence of inserts, prefix matches, lock/unlock and
evictions under LRU must give the same matched lengths, the same evictable/protected
sizes and the same evicted tokens.

Time: the simulator reads an injected clock (the step number); SGLang's `time` module
is replaced by `StepClock` (the step, plus 1e-6 per call within the step), so nodes that
share a step are ordered by creation in both trees. Tokens are named by their whole
prefix (`token_ids`), so "the same evicted tokens" means the same positions in the
tree, not merely equal ids.
"""

from __future__ import annotations

import random

import pytest
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang_support import evict, insert, install_clock, key, lru_cache, token_ids

from prism_sim.radix_cache import RadixCache as SimRadixCache

pytestmark = pytest.mark.sglang


def sim_evicted_ids(cache: SimRadixCache, result) -> set[int]:
    out: set[int] = set()
    for node in result.evicted_nodes:
        path = cache.node_path_tokens(node)
        ids = token_ids(path).tolist()
        out.update(ids[len(path) - len(node.key) :])
    return out


def random_sequences(rng: random.Random, count: int) -> list[list[int]]:
    """Prompts that share prefixes at many depths (a few stems, a small vocabulary)."""
    stems = [[rng.randrange(50) for _ in range(rng.randint(4, 24))] for _ in range(6)]
    out = []
    for _ in range(count):
        stem = rng.choice(stems)
        head = stem[: rng.randint(0, len(stem))]
        out.append(head + [rng.randrange(8) for _ in range(rng.randint(1, 16))])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_sim_radix_cache_matches_sglang_radix_cache(monkeypatch, seed):
    rng = random.Random(seed)
    clock = install_clock(monkeypatch)
    sgl, sgl_alloc = lru_cache()
    sim = SimRadixCache("lru", clock=lambda: clock.now)
    sequences = random_sequences(rng, 80)
    locks: list[tuple] = []
    counts = dict.fromkeys(("insert", "match", "lock", "unlock", "evict"), 0)
    evicted = 0
    for step in range(1, 401):
        clock.now = float(step)
        tokens = rng.choice(sequences)
        op = rng.random()
        if op < 0.45:
            assert sim.insert(tokens) == insert(sgl, tokens)
            counts["insert"] += 1
        elif op < 0.65:
            cut = tokens[: rng.randint(1, len(tokens))]
            a = sim.match_prefix(cut)
            b = sgl.match_prefix(MatchPrefixParams(key=key(cut)))
            assert a.prefix_len == b.device_prefix_len
            counts["match"] += 1
            if op < 0.6 and a.prefix_len:
                sim.inc_lock_ref(a.last_node)
                locks.append((a.last_node, sgl.lock(b.last_device_node)))
                counts["lock"] += 1
        elif op < 0.78 and locks:
            sim_node, sgl_lock = locks.pop(rng.randrange(len(locks)))
            sim.dec_lock_ref(sim_node)
            sgl.unlock(sgl_lock)
            counts["unlock"] += 1
        else:
            n = rng.randint(1, 30)
            result = sim.evict(n)
            assert sim_evicted_ids(sim, result) == evict(sgl, sgl_alloc, n), f"step {step}"
            evicted += result.num_tokens_evicted
            counts["evict"] += 1
        assert sim.evictable_size() == sgl.evictable_size(), f"step {step}"
        assert sim.protected_size() == sgl.protected_size(), f"step {step}"
        assert sim.total_size() == sgl.total_size()
    assert min(counts.values()) >= 8 and evicted > 200, counts
