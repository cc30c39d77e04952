"""`python -m bench.dart_evict`: cost of DART's eviction order vs plain LRU.

Builds two identical radix trees of ~10^6 resident tokens (system prompts, 128-token
segments, private suffixes, all anchored), one evicting in DART order with a priority
table over every segment, one in LRU order, then evicts 10^5 tokens from each, side by
side in one run: once as a single pass, and as many small passes (as an allocating
scheduler does). Prints the time per evicted node and the DART/LRU ratio. No
thresholds: DART should stay within a small constant factor of LRU (same heap, a tuple
key, one protection-set snapshot per pass). Each system head is its own owner with a
table entry, and DART is told of a KV pool as large as the tree, so F_t's
bound (a quarter of it) is tracked as a server tracks it.

    python -m bench.dart_evict [--tokens 1000000] [--evict 100000]
                               [--tree sim|sglang|unified]
                               [--gc-freeze]

`--tree sglang` runs SGLang's own RadixCache/DartRadixCache (needs .venv-sglang).
`--tree unified` runs SGLang's UnifiedRadixCache, the tree HiCache needs:
DartUnifiedRadixCache (DART's Python tree core) under LRU and under DART, same splits, and
SGLang's own tree on its default Rust core without anchors, compared per evicted token
(the Python core's own cost included).
`--gc-freeze` moves the built trees out of the cyclic GC's reach (`gc.freeze()`, as a
server does after warm-up): DART's tuple keys allocate twice LRU's objects per leaf per
pass, and with the tree under the collector much of the many-pass gap is GC time.
"""

from __future__ import annotations

import argparse
import functools
import gc
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backend_plugin.dart import DartCore, PriorityUpdate
from prism_wire import make_kv_hints, parse_kv_hints, system_owner

SYSTEM_TOKENS = 64
SEGMENT_TOKENS = 128
PRIVATE_TOKENS = 40


@dataclass(frozen=True)
class Workload:
    requests: list[tuple[str, list[int], Any]]
    table: dict[str, float]
    capacity_tokens: int  # the KV pool DART is told about: the tree's own size


def make_workload(total_tokens: int, seed: int) -> Workload:
    """Requests of 1 system prompt + 3 segments + a private suffix until ~total tokens."""
    rng = random.Random(seed)
    num_segments = max(16, total_tokens // (SEGMENT_TOKENS * 3))
    systems = [list(range(10_000 * (s + 1), 10_000 * (s + 1) + SYSTEM_TOKENS)) for s in range(4)]
    base = 1_000_000
    segments = {
        f"s{i}": list(range(base + i * SEGMENT_TOKENS, base + (i + 1) * SEGMENT_TOKENS))
        for i in range(num_segments)
    }
    names = sorted(segments)
    requests, size = [], 0
    while size < total_tokens:
        system = rng.choice(systems)
        segs = rng.sample(names, 3)
        private = [rng.randrange(100, 5000) for _ in range(PRIVATE_TOKENS)]
        tokens = system + [t for s in segs for t in segments[s]] + private
        head = f"h{system[0]}"
        anchors = [{"kind": "system", "segment_id": head, "offset": len(system)}]
        offset = len(system)
        for s in segs:
            offset += SEGMENT_TOKENS
            anchors.append({"kind": "segment", "segment_id": s, "offset": offset})
        anchors.append({"kind": "private", "segment_id": None, "offset": len(tokens)})
        rid = f"r{len(requests)}"
        requests.append((rid, tokens, make_kv_hints(anchors, message_id=rid)))
        size += len(tokens) - SYSTEM_TOKENS  # segments rarely repeat in the same position
    table = {name: float(rng.randrange(1, 10**6)) for name in names}
    for system in systems:
        table[system_owner(f"h{system[0]}")] = float(rng.randrange(1, 10**6))
    return Workload(requests, table, size)


@dataclass
class Tree:
    """One cache under test, behind three callables."""

    insert: Callable[[str, list[int], Any], None]
    evict: Callable[[int], int]  # -> nodes evicted
    size: Callable[[], int]


def sim_tree(policy: str, table: dict[str, float] | None, capacity: int) -> Tree:
    from backend_plugin.sim_extension import DartSimExtension
    from prism_sim.radix_cache import RadixCache
    from prism_sim.request import SimRequest

    ext = DartSimExtension(DartCore(policy, protect=8, capacity_tokens=capacity))
    clock = [0.0]
    cache = RadixCache(ext.strategy, clock=lambda: clock[0])
    ext.attach(cache)
    if table is not None:
        ext.core.inbox.submit(PriorityUpdate(1, table, protect=8))

    def insert(rid: str, tokens: list[int], kv_hints: Any) -> None:
        clock[0] += 1.0
        cache.insert(tokens)
        req = SimRequest(rid, tokens, max_new_tokens=1, arrival_s=0.0, kv_hints=kv_hints)
        ext.on_insert(req, cache, tokens)
        ext.on_finish(req)  # served: it leaves a_t

    return Tree(insert, lambda n: len(cache.evict(n).evicted_nodes), cache.evictable_size)


@functools.cache
def _torchvision_shim() -> Any:
    """The operators the CUDA-linked torchvision lacks on CPU torch (tests/sglang/conftest)."""
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    return lib


class CountingAllocator:
    """The KV allocator surface SGLang's trees touch, counting the nodes freed; `size`
    (the pool DART is told of) is the tree's own size."""

    device = "cpu"
    page_size = 1

    def __init__(self, size: int) -> None:
        self.size = size
        self.freed_nodes = 0

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        self.freed_nodes += 1


def sglang_tree(policy: str, table: dict[str, float] | None, capacity: int) -> Tree:
    _torchvision_shim()
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import EvictParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from backend_plugin.sglang_cache import DartRadixCache

    allocator = CountingAllocator(capacity)
    params = CacheInitParams(
        disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator, page_size=1
    )
    cache = DartRadixCache(params, DartCore(policy, protect=8))
    if table is not None:
        cache.dart.inbox.submit(PriorityUpdate(1, table, protect=8))

    def insert(rid: str, tokens: list[int], kv_hints: Any) -> None:
        hints = parse_kv_hints(kv_hints)
        cache.insert_with_anchors(RadixKey(array("q", tokens)), hints, rid=rid)

    def evict(n: int) -> int:
        before = allocator.freed_nodes
        cache.evict(EvictParams(num_tokens=n))
        return allocator.freed_nodes - before

    return Tree(insert, evict, cache.evictable_size)


def unified_tree(policy: str, table: dict[str, float] | None, capacity: int) -> Tree:
    """SGLang's `UnifiedRadixCache` (the tree that carries HiCache): `DartUnifiedRadixCache`
    on DART's Python tree core under `policy`, or with policy `rust` SGLang's own tree on
    its default Rust core, LRU, without anchors (as a server runs it without DART)."""
    _torchvision_shim()
    import dataclasses
    from array import array

    import torch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from backend_plugin.sglang_unified import DartUnifiedRadixCache

    allocator = CountingAllocator(capacity)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=allocator,
        page_size=1,
        tree_components=(ComponentType.FULL,),
    )
    dart: DartUnifiedRadixCache | None = None
    if policy == "rust":
        cache = UnifiedRadixCache(dataclasses.replace(params, tree_core_backend="rust"))
    else:
        dart = DartUnifiedRadixCache(params, DartCore(policy, protect=8))
        cache = dart
        if table is not None:
            dart.dart.inbox.submit(PriorityUpdate(1, table, protect=8))

    def insert(rid: str, tokens: list[int], kv_hints: Any) -> None:
        key = RadixKey(array("q", tokens))
        value = torch.arange(len(tokens), dtype=torch.int64)
        if dart is None:
            cache.insert(InsertParams(key=key, value=value))
        else:
            dart.insert_with_anchors(key, parse_kv_hints(kv_hints), rid=rid, value=value)

    def evict(n: int) -> int:
        before = allocator.freed_nodes
        cache.evict(EvictParams(num_tokens=n))
        return allocator.freed_nodes - before

    return Tree(insert, evict, cache.evictable_size)


BUILDERS = {"sim": sim_tree, "sglang": sglang_tree, "unified": unified_tree}


def build_trees(tree_kind: str, workload: Workload, verbose: bool) -> dict[str, Tree]:
    build = BUILDERS[tree_kind]
    capacity = workload.capacity_tokens
    trees = {"lru": build("lru", None, capacity), "dart": build("dart", workload.table, capacity)}
    if tree_kind == "unified":
        trees["rust"] = build("rust", None, capacity)
    for name, tree in trees.items():
        start = time.perf_counter()
        for rid, tokens, kv_hints in workload.requests:
            tree.insert(rid, tokens, kv_hints)
        if verbose:
            print(
                f"{name:>4}: {tree.size():,} resident tokens from "
                f"{len(workload.requests):,} anchored requests, built in "
                f"{time.perf_counter() - start:.1f} s"
            )
    return trees


def run(
    tree_kind: str,
    total_tokens: int,
    evict_tokens: int,
    pass_tokens: int,
    seed: int,
    gc_freeze: bool = False,
) -> None:
    workload = make_workload(total_tokens, seed)
    print(
        f"tree={tree_kind}, {len(workload.table):,} segments in the DART table, f=8, "
        f"gc.freeze()={'on' if gc_freeze else 'off'}"
    )
    for index, (label, step) in enumerate(
        (("one pass", evict_tokens), (f"passes of {pass_tokens:,}", pass_tokens))
    ):
        trees = build_trees(tree_kind, workload, verbose=index == 0)  # fresh, identical
        gc.unfreeze()
        if gc_freeze:
            gc.freeze()
        per_node, per_pass, per_token = {}, {}, {}
        for name, tree in trees.items():
            nodes, done, passes = 0, 0, 0
            start = time.perf_counter()
            while done < evict_tokens:
                before = tree.size()
                nodes += tree.evict(step)
                passes += 1
                freed = before - tree.size()
                if freed == 0:
                    break
                done += freed
            elapsed = time.perf_counter() - start
            per_node[name] = elapsed / max(nodes, 1)
            per_pass[name] = elapsed / passes
            per_token[name] = elapsed / max(done, 1)
            print(
                f"  {label:>16} {name:>4}: {passes:4d} passes, {nodes:6,d} nodes, "
                f"{done:8,d} tokens, {elapsed * 1e3:8.1f} ms, {per_node[name] * 1e6:7.2f} us/node"
            )
        print(
            f"  {label:>16} DART/LRU: {per_node['dart'] / per_node['lru']:.2f}x per evicted node, "
            f"{per_pass['dart'] / per_pass['lru']:.2f}x per pass"
        )
        if "rust" in per_token:  # node counts differ (no anchors there): per token
            print(
                f"  {label:>16} DART/SGLang's Rust LRU: "
                f"{per_token['dart'] / per_token['rust']:.2f}x per evicted token"
            )
    gc.unfreeze()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dart_evict", description=__doc__)
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--evict", type=int, default=100_000)
    parser.add_argument("--pass-tokens", type=int, default=1_000)
    parser.add_argument("--tree", choices=sorted(BUILDERS), default="sim")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gc-freeze", action="store_true")
    args = parser.parse_args(argv)
    run(args.tree, args.tokens, args.evict, args.pass_tokens, args.seed, args.gc_freeze)


if __name__ == "__main__":
    main()
