"""In-engine waiting-queue orders, as SGLang's `schedule_policy.py` (SPEC §5).

* `fcfs` — arrival order (SGLang's default).
* `lpm` — longest cached prefix first. Requests whose own cached prefix is short
  (≤ 32 tokens) but that share ≥ 32 tokens with an earlier waiting request go last, so
  one of them warms the cache for the others (SGLang's in-batch prefix caching).
* `hrrn` — highest response ratio next with token-based aging: a request's ratio grows
  with the prefill tokens processed since it arrived divided by its uncached tokens.

`lpm` and `hrrn` fall back to `fcfs` above 128 waiting requests, like SGLang. Matching
against the tree refreshes access times (and may split nodes), as it does in SGLang.
"""

from __future__ import annotations

from prism_sim.radix_cache import RadixCache
from prism_sim.request import SimRequest

POLICIES = ("fcfs", "lpm", "hrrn")
CACHE_AWARE_MAX_QUEUE = 128
IN_BATCH_CHECK_THRESHOLD = 32
IN_BATCH_DEPRIORITIZE_THRESHOLD = 32


def validate_policy(name: str) -> str:
    if name not in POLICIES:
        raise ValueError(f"unknown schedule policy {name!r} (known: {', '.join(POLICIES)})")
    return name


def order_waiting(
    policy: str,
    waiting: list[SimRequest],
    cache: RadixCache,
    processed_tokens: int,
) -> list[SimRequest]:
    """The waiting queue in the order the scheduler should try to admit it."""
    if policy == "fcfs" or len(waiting) > CACHE_AWARE_MAX_QUEUE:
        return list(waiting)
    matched: dict[str, int] = {}
    deprioritized: set[str] = set()
    scratch = RadixCache("lru", clock=lambda: 0.0)
    for req in waiting:
        # Match the whole prompt (it may split a node), count at most len - 1 (SGLang).
        full = cache.match_prefix(req.input_ids).prefix_len
        matched[req.rid] = min(full, len(req.input_ids) - 1)
        if matched[req.rid] <= IN_BATCH_CHECK_THRESHOLD:
            if scratch.match_prefix(req.input_ids).prefix_len >= IN_BATCH_DEPRIORITIZE_THRESHOLD:
                deprioritized.add(req.rid)
            else:
                scratch.insert(req.input_ids)
    if policy == "lpm":
        # Stable sort: equal keys keep arrival order.
        return sorted(
            waiting,
            key=lambda r: float("inf") if r.rid in deprioritized else -matched[r.rid],
        )

    def hrrn_key(req: SimRequest) -> tuple[float, str]:
        if req.rid in deprioritized:
            return (float("inf"), req.rid)
        uncached = len(req.input_ids) - matched[req.rid]
        if uncached <= 0:
            return (float("-inf"), req.rid)
        waited = max(0, processed_tokens - req.arrival_processed_tokens)
        return (-waited / uncached, req.rid)

    return sorted(waiting, key=hrrn_key)
