"""Helpers for the tests against SGLang's real classes (imported by tests/sglang only)."""

from __future__ import annotations

import json
import time
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.mem_cache import radix_cache as sglang_radix_cache
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from backend_plugin.dart import DartCore
from backend_plugin.sglang_cache import DartRadixCache

# A tiny Qwen2-shaped config: ServerArgs resolution reads the model's config.json (no
# weights are ever loaded: nothing is served here).
TINY_MODEL_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "torch_dtype": "float32",
    "tie_word_embeddings": True,
}


def write_tiny_model(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_MODEL_CONFIG))
    return directory


class MockAllocator:
    """The KV allocator surface RadixCache touches; records every freed slot in order."""

    device = "cpu"
    page_size = 1

    def __init__(self) -> None:
        self.freed: list[list[int]] = []

    def free_segment(self, indices: torch.Tensor, start_pos: int = 0) -> None:
        if len(indices):
            self.freed.append([int(i) for i in indices])

    def free_segments(self, segments: list[tuple[torch.Tensor, int]]) -> None:
        for indices, start in segments:
            self.free_segment(indices, start)


class StepClock:
    """Stands in for the `time` module inside sglang's radix_cache.

    `monotonic()` returns the current step plus 1e-6 per call made during the step, so
    every node SGLang creates gets its own time (SGLang itself breaks equal times by set
    order, i.e. arbitrarily), in creation order, as the simulator's tie-break does.
    """

    def __init__(self) -> None:
        self._now = 0.0
        self._calls = 0
        self.perf_counter = time.perf_counter

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, value: float) -> None:
        self._now, self._calls = value, 0

    def monotonic(self) -> float:
        self._calls += 1
        return self._now + (self._calls - 1) * 1e-6


def install_clock(monkeypatch: Any) -> StepClock:
    clock = StepClock()
    monkeypatch.setattr(sglang_radix_cache, "time", clock)
    return clock


def use_clock(clock: StepClock) -> None:
    """Switch the clock sglang's radix_cache reads (after `install_clock`)."""
    sglang_radix_cache.time = clock


def cache_params(allocator: MockAllocator, req_to_token_pool: Any = None) -> CacheInitParams:
    return CacheInitParams(
        disable=False,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool_allocator=allocator,
        page_size=1,
    )


def dart_cache(policy: str = "dart", protect: int = 2) -> tuple[DartRadixCache, MockAllocator]:
    allocator = MockAllocator()
    return DartRadixCache(cache_params(allocator), DartCore(policy, protect=protect)), allocator


def lru_cache() -> tuple[RadixCache, MockAllocator]:
    allocator = MockAllocator()
    return RadixCache.create_simulated(page_size=1, mock_allocator=allocator), allocator


def key(tokens: list[int]) -> RadixKey:
    return RadixKey(array("q", tokens))


def token_ids(tokens: list[int]) -> torch.Tensor:
    """Values naming each token by its whole prefix (so freed slots identify positions)."""
    out, h = [], 0
    for t in tokens:
        h = (h * 1_000_003 + t + 1) % (2**61 - 1)
        out.append(h)
    return torch.tensor(out, dtype=torch.int64)


def insert(cache: RadixCache, tokens: list[int]) -> int:
    return cache.insert(InsertParams(key=key(tokens), value=token_ids(tokens))).prefix_len


def evict(cache: RadixCache, allocator: MockAllocator, num_tokens: int) -> set[int]:
    before = len(allocator.freed)
    cache.evict(EvictParams(num_tokens=num_tokens))
    return {i for chunk in allocator.freed[before:] for i in chunk}


def evict_one_by_one(cache: RadixCache, allocator: MockAllocator) -> list[list[int]]:
    """Evict a leaf at a time; returns the evicted nodes' values in order."""
    start = len(allocator.freed)
    while cache.evictable_size():
        cache.evict(EvictParams(num_tokens=1))
    return allocator.freed[start:]


def fake_request(rid: str, kv_hints: Any) -> SimpleNamespace:
    return SimpleNamespace(rid=rid, kv_hints=kv_hints)
