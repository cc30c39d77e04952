"""Helpers shared by the simulated engine's tests."""

from __future__ import annotations

from collections.abc import Sequence

from prism_sim.time_model import Profile


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids `a` and `b` share: what a prefix cache holding one can
    reuse of the other (the tests' oracle, written apart from the engine's own)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def profile(**overrides: object) -> Profile:
    """A small hand-computable profile: c0 10 ms, R_pf 1000 tok/s, d0 5 ms, d1 1 ms."""
    base = dict(
        name="t",
        model_name="m",
        prefill_overhead_s=0.01,
        prefill_tokens_per_s=1000.0,
        decode_overhead_s=0.005,
        decode_per_request_s=0.001,
        kv_capacity_tokens=100_000,
        max_running_requests=64,
        chunked_prefill_size=None,
    )
    base.update(overrides)
    return Profile(**base)  # type: ignore[arg-type]
