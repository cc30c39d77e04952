"""prism-sim against a real SGLang, request by request.

A small zipf_hotspot trace, serialized by the proxy's serializer in the client's order
(what `--api native` sends), is replayed one request at a time into prism-sim and into
a live SGLang 0.5.23 server with the same KV budget; every request's `cached_tokens`
must be equal. Twice: an ample budget (16,384 tokens, nothing evicted; the `ample`
server, whose DART cache orders like LRU for requests without anchors) and a tight one
(2,048 tokens, about ten prompts; the `stock` server: SGLang's own radix cache, the
engine every baseline of the experiments stands for). Outputs are 4 tokens with
`ignore_eos`, so both engines cache the same number of generated tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from live_support import LiveServer

from loadgen.clients.apis import client_order_ids
from loadgen.workloads.rag_trace import RagTraceParams, build_rag_trace
from prism_proxy.prompts.serializer import Serializer
from prism_sim.engine import SimConfig, SimEngine
from prism_tokens.tokenizer import load_tokenizer
from sglang_cpu.model import ensure_tiny_model

pytestmark = pytest.mark.sglang

MAX_NEW_TOKENS = 4
# ~210-token prompts: 48 requests are ~10k tokens (ample fits them all, tight ~10).
TRACE = RagTraceParams(
    passages=60,
    hot_set=10,
    chunk_tokens=32,
    system_tokens=24,
    question_tokens=12,
    num_requests=48,
    max_tokens=MAX_NEW_TOKENS,
)


def trace_ids() -> list[list[int]]:
    tokenizer = load_tokenizer(str(ensure_tiny_model()))
    _, requests = build_rag_trace(TRACE, 3, tokenizer)
    serializer = Serializer(tokenizer)
    return [client_order_ids(request, serializer) for request in requests]


async def sim_cached_tokens(prompts: list[list[int]], kv_capacity_tokens: int) -> list[int]:
    """One request at a time through prism-sim's engine (LRU, the same budget)."""
    config = SimConfig(
        tokenizer=str(ensure_tiny_model()),
        kv_capacity_tokens=kv_capacity_tokens,
        chunked_prefill_size=4096,  # the live server's
        eviction="lru",
        speed=1000.0,
    )
    engine = SimEngine(config)
    cached = []
    async with engine.loop:
        for ids in prompts:
            req = await engine.start(ids, MAX_NEW_TOKENS).wait()
            assert len(req.output_ids) == MAX_NEW_TOKENS
            cached.append(req.cached_tokens)
    return cached


def live_cached_tokens(prompts: list[list[int]], generate: Callable[..., dict]) -> list[int]:
    cached = []
    for ids in prompts:
        meta = generate(ids, MAX_NEW_TOKENS)["meta_info"]
        assert meta["completion_tokens"] == MAX_NEW_TOKENS
        cached.append(meta["cached_tokens"])
    return cached


@pytest.mark.parametrize("server", ["ample", "stock"])
async def test_cached_tokens_agree_request_by_request(
    live: dict[str, LiveServer], server: str
) -> None:
    live_server = live[server]
    live_server.fresh()
    evicted_before = live_server.metric("sglang:evicted_tokens_total")
    prompts = trace_ids()
    real = live_cached_tokens(prompts, live_server.generate)
    simulated = await sim_cached_tokens(prompts, live_server.max_total_tokens)
    evicted = live_server.metric("sglang:evicted_tokens_total") - evicted_before
    assert sum(real) > 0
    # The ample budget never evicts; the tight one evicts many times over.
    assert (evicted == 0) if server == "ample" else (evicted > 2 * live_server.max_total_tokens)
    differing = [(i, r, s) for i, (r, s) in enumerate(zip(real, simulated, strict=True)) if r != s]
    assert not differing, f"(request, real, prism-sim): {differing}"
