"""The real `openai` client through the proxy to the simulated engine.

Chat and completions, streaming and not, with and without `prism` hints; usage with
cached tokens; the backend receives the token ids in the order QAS chose.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from proxy_support import ProxyFactory, eventually, proxy_factory_fixture, sim_server
from sim_support import common_prefix

from prism_proxy.api.segments import SegmentedPrompt
from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.prompts.serializer import Serializer
from prism_tokens.tokenizer import load_tokenizer

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)

SYSTEM = "You answer questions about the documents."
DOCS = {
    "doc-apple": "Apples grow on trees in orchards and ripen in autumn across the valley.",
    "doc-zebra": "Zebras live in herds on the savanna and have black and white stripes.",
    "doc-quartz": "Quartz is a hard mineral made of silicon and oxygen atoms in a lattice.",
}


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _hint(*ids: str, suffix: str | None = None) -> dict:
    hint: dict = {"segments": [{"id": i, "text": DOCS[i]} for i in ids]}
    if suffix is not None:
        hint["suffix"] = suffix
    return {"prism": hint}


MESSAGES = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What do the documents say?"},
]


@pytest.mark.parametrize("hinted", [False, True])
async def test_chat_stream_equals_non_stream(proxy_factory: ProxyFactory, hinted: bool) -> None:
    proxy = await proxy_factory()
    extra = _hint("doc-apple", "doc-zebra") if hinted else None
    async with _client(proxy.url) as client:
        whole = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=6, extra_body=extra
        )
        stream = await client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
        pieces, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.content
    assert "".join(pieces) == whole.choices[0].message.content
    assert whole.usage.completion_tokens == 6 and finish == whole.choices[0].finish_reason
    assert usage is not None and usage.prompt_tokens == whole.usage.prompt_tokens
    # The second identical prompt is served from the engine's prefix cache.
    assert usage.prompt_tokens_details.cached_tokens > 0
    lane = "hot" if hinted else "cold"
    metrics = proxy.app[GATEWAY].metrics.registry
    labels = {"endpoint": "chat", "lane": lane, "status": "200"}
    # the streamed request is counted once its handler returns, after its last chunk
    await eventually(lambda: metrics.get_sample_value("prism:requests_total", labels) == 2)
    assert metrics.get_sample_value("prism:cached_tokens_total", {"lane": lane}) > 0


@pytest.mark.parametrize("hinted", [False, True])
async def test_completions_stream_and_not(proxy_factory: ProxyFactory, hinted: bool) -> None:
    proxy = await proxy_factory()
    extra = _hint("doc-quartz", suffix="Summary:") if hinted else None
    async with _client(proxy.url) as client:
        whole = await client.completions.create(
            model="m", prompt="Summary:", max_tokens=5, extra_body=extra
        )
        stream = await client.completions.create(
            model="m", prompt="Summary:", max_tokens=5, stream=True, extra_body=extra
        )
        text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert whole.object == "text_completion"
    assert whole.choices[0].text and text == whole.choices[0].text
    assert whole.usage.completion_tokens == 5
    # Unhinted: the text as the backend tokenizes it. Hinted: no chat template by
    # default on completions, so exactly one segment then the suffix (SPEC §1).
    segments = [{"id": "doc-quartz", "text": DOCS["doc-quartz"]}] if hinted else []
    prompt = SegmentedPrompt(segments=segments, suffix="Summary:")
    expected = Serializer(load_tokenizer()).serialize(prompt, chat=False).input_ids
    assert whole.usage.prompt_tokens == len(expected)


async def test_passthrough_features_reach_backend_endpoint(proxy_factory: ProxyFactory) -> None:
    """A feature only the engine's endpoint serves (n=2): the engine answers. Its turns
    (here the system turn) are scheduled by QAS in a lane; opted out of segmentation,
    it is passed through."""
    proxy = await proxy_factory()
    async with _client(proxy.url) as client:
        whole = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=3, n=2
        )
        plain = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=3, n=2,
            extra_headers={"x-prism-extract": "off"},
        )  # fmt: skip
    # The backend's own OpenAI endpoint answered (its ids, not the proxy's token path).
    for answer in (whole, plain):
        assert answer.choices and not answer.id.startswith("chatcmpl-prism-")
    metrics = proxy.app[GATEWAY].metrics.registry

    def requests(lane: str) -> float:
        labels = {"endpoint": "chat", "lane": lane, "status": "200"}
        return metrics.get_sample_value("prism:requests_total", labels) or 0.0

    def found(outcome: str, layout: str) -> float | None:
        labels = {"endpoint": "chat", "outcome": outcome, "layout": layout}
        return metrics.get_sample_value("prism:extraction_total", labels)

    assert requests("passthrough") == 1
    assert requests("hot") + requests("cold") == 1
    assert found("turns", "messages") == 1 and found("forwarded", "") == 1


async def _cached_tokens_of_second(proxy_factory: ProxyFactory, policy: str, tag: str) -> int:
    """Request 1 (segments A, B) streams and stays active; request 2 (C, A) is planned
    while it runs. `prism` front-aligns A (a_t(A) = 1) so request 2 reuses head + A."""
    proxy = await proxy_factory(policy=policy)
    a, b, c = (f"{tag}-{name}" for name in ("a", "b", "c"))
    texts = {a: DOCS["doc-apple"], b: DOCS["doc-zebra"], c: DOCS["doc-quartz"]}

    def hint(*ids: str) -> dict:
        return {"prism": {"segments": [{"id": i, "text": texts[i]} for i in ids]}}

    async with _client(proxy.url) as client:
        first = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=20000, stream=True, extra_body=hint(a, b)
        )
        await anext(aiter(first))  # prefilled and active
        second = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=2, extra_body=hint(c, a)
        )
        await first.close()
    await eventually(lambda: proxy.app[GATEWAY].admission.inflight == 0)
    return second.usage.prompt_tokens_details.cached_tokens


async def test_backend_receives_reordered_token_ids(proxy_factory: ProxyFactory, sim) -> None:
    async with httpx.AsyncClient() as http:  # start from an empty prefix cache
        assert (await http.post(sim.url + "/flush_cache")).status_code == 200
    serializer = Serializer(load_tokenizer())
    docs = list(DOCS.values())

    def ids(order: list[int]) -> list[int]:
        prompt = SegmentedPrompt(
            system=SYSTEM,
            segments=[{"id": str(i), "text": docs[i]} for i in order],
            suffix=MESSAGES[1]["content"],
        )
        return serializer.serialize(prompt).input_ids

    first = ids([0, 1])  # apple, zebra
    as_sent = common_prefix(first, ids([2, 0]))  # quartz, apple: only the head is shared
    reordered = common_prefix(first, ids([0, 2]))  # apple first: head + apple shared
    assert reordered > as_sent
    assert await _cached_tokens_of_second(proxy_factory, "fifo", "fifo") == as_sent
    assert await _cached_tokens_of_second(proxy_factory, "prism", "prism") == reordered


async def test_a_multi_turn_chat_reuses_its_tokenized_history(
    proxy_factory: ProxyFactory,
) -> None:
    """Each turn re-sends the history; the proxy tokenizes only its new pieces
    (`chat_pieces`), the backend still gets exactly the ids of the whole rendered chat,
    and /metrics shows the tokenization caches."""
    proxy = await proxy_factory()
    tokenizer = load_tokenizer()
    messages = [{"role": "system", "content": SYSTEM + " Keep answers short. " * 20}]
    sent: list[list[int]] = []
    async with _client(proxy.url) as client:
        for turn in range(3):
            messages.append({"role": "user", "content": f"Question {turn}: what then?"})
            answer = await client.chat.completions.create(
                model="m", messages=messages, max_tokens=4
            )
            ids = tokenizer.encode(tokenizer.render_chat(messages))
            assert answer.usage.prompt_tokens == len(ids)
            if sent:  # at least the history's tokens came from the engine's prefix cache
                shared = next(
                    (n for n, (x, y) in enumerate(zip(ids, sent[-1], strict=False)) if x != y),
                    min(len(ids), len(sent[-1])),
                )
                assert answer.usage.prompt_tokens_details.cached_tokens >= shared > 0
            sent.append(ids)
            messages.append({"role": "assistant", "content": answer.choices[0].message.content})
    async with httpx.AsyncClient() as http:
        text = (await http.get(proxy.url + "/metrics")).text
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("prism:cache_")
    }
    # Turns 2 and 3 found the system message and earlier turns among the pieces.
    assert samples['prism:cache_hits_total{cache="chat_pieces"}'] >= 4
    assert samples['prism:cache_misses_total{cache="chat_pieces"}'] > 0
    assert samples['prism:cache_entries{cache="chat_pieces"}'] > 0
    assert 'prism:cache_hits_total{cache="segments"}' in samples
    assert 'prism:cache_entries{cache="heads"}' in samples
    for cache in ("chat_pieces", "segments", "heads", "view"):
        held = samples[f'prism:cache_bytes{{cache="{cache}"}}']
        assert 0 <= held <= samples[f'prism:cache_capacity_bytes{{cache="{cache}"}}']
    assert samples['prism:cache_bytes{cache="chat_pieces"}'] > 0


async def test_models_and_health(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(policy="klpm")
    async with _client(proxy.url) as client:
        models = await client.models.list()
    assert models.data and models.data[0].id
    async with httpx.AsyncClient() as http:
        health = (await http.get(proxy.url + "/health")).json()
    assert health == {
        "status": "ok",
        "backend_up": True,
        "queue_depth": 0,
        "inflight": 0,
        "policy": "klpm",
    }


@pytest.mark.parametrize("policy", ["prism", "fifo", "klpm", "contextpilot-style"])
async def test_every_policy_serves_concurrent_hinted_requests(
    proxy_factory: ProxyFactory, policy: str
) -> None:
    proxy = await proxy_factory(policy=policy, max_inflight=4)
    ids = list(DOCS)
    async with _client(proxy.url) as client:
        answers = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model="m",
                    messages=MESSAGES,
                    max_tokens=2,
                    extra_body=_hint(ids[i % 3], ids[(i + 1) % 3]),
                )
                for i in range(24)
            )
        )
    assert all(a.choices[0].message.content for a in answers)
    assert len({a.id for a in answers}) == 24
    registry = proxy.app[GATEWAY].metrics.registry
    assert registry.get_sample_value("prism:wave_size_bucket", {"le": "4.0"}) == (
        registry.get_sample_value("prism:wave_size_count")
    )
    await eventually(lambda: proxy.app[GATEWAY].admission.inflight == 0)
