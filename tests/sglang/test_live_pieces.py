"""Long prefills in pieces (`admission.pieces`) against a real, unmodified SGLang 0.5.23
on this CPU: the pieces are accepted as sent (ids, DART's anchors), the request then
finds them cached, and clients are told only the reuse they found."""

from __future__ import annotations

import asyncio
import random

import openai
import pytest
from live_support import LiveServer, eventually

from prism_proxy.edge.gateway import GATEWAY

pytestmark = pytest.mark.sglang

WORDS = ("river", "delta", "basin", "bank", "ford", "weir", "lock", "estuary")
PIECE = 128


def long_text(seed: int, words: int = 500) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(10**6)) for _ in range(words))


async def chat(client: openai.AsyncOpenAI, text: str) -> tuple[int, int]:
    """A streamed chat: its prompt tokens and the cached tokens it was told of."""
    stream = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": text}],
        max_tokens=2,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    async for chunk in stream:
        usage = chunk.usage or usage
    assert usage is not None
    details = usage.prompt_tokens_details
    return usage.prompt_tokens, (details.cached_tokens or 0) if details else 0


async def test_long_prompts_go_in_pieces_to_the_real_engine(live, live_proxy_factory) -> None:
    server: LiveServer = live["ample"]
    server.fresh()
    proxy = await live_proxy_factory(server, prefill_piece_tokens=PIECE)
    registry = proxy.app[GATEWAY].metrics.registry
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="none", max_retries=0)
    texts = [long_text(i) for i in range(3)]
    answers = await asyncio.gather(*(chat(client, text) for text in texts), chat(client, "Hi?"))
    pieces = registry.get_sample_value("prism:prefill_pieces_total") or 0.0
    # Each long prompt has over 4 pieces uncached; the first is cut in any case, the
    # others while the rest wait.
    assert all(prompt > 4 * PIECE for prompt, _ in answers[:3])
    assert pieces >= 3
    for _, cached in answers[:3]:
        assert cached < PIECE  # new text: told no reuse, whatever its pieces cached
    # Sent again, each is cached to within its last piece: the engine kept every piece.
    for text, (prompt, _) in zip(texts, answers, strict=False):
        again, cached = await chat(client, text)
        assert again == prompt and cached >= prompt - 2 * PIECE
    admission = proxy.app[GATEWAY].admission
    await eventually(lambda: admission.inflight == 0)
    assert admission.turns.held == 0
