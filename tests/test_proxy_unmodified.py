"""Unmodified clients get PRISM: the real `openai` client, no `prism` field,
documents in the layouts RAG code writes, through the proxy to the simulated engine.

The same documents sent again in another order come back from the engine's prefix
cache; served in the client's order the prompt is exactly the client's text; nothing
found, or the deployment or the request opting out, and the request goes as before."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from aiohttp import web
from proxy_support import (
    ProxyFactory,
    loopback_app,
    proxy_factory_fixture,
    recording_generate,
    running_proxy,
    sim_server,
)

from loadgen.clients.apis import LAYOUTS
from prism_proxy.edge.gateway import GATEWAY

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)

SYSTEM = "Answer from the documents."
DOCS = [
    "The Pont Neuf is the oldest standing bridge across the river Seine in Paris, finished "
    "in 1607 under King Henri IV after nearly thirty years of work.",
    "The Millau Viaduct carries the A75 motorway across the valley of the Tarn; one of its "
    "masts reaches 343 metres, higher than the Eiffel Tower.",
    "The Tower Bridge in London opens its two bascules about eight hundred times a year "
    "to let tall ships pass on the Thames below the city.",
]
QUESTION = "Which bridge is the oldest?"
EXTRA_DOC = (
    "The Golden Gate Bridge spans the strait between San Francisco Bay and the Pacific "
    "Ocean; its main span of 1,280 metres was the longest in the world in 1937."
)


def user_text(layout: str, docs: list[str]) -> str:
    """The user message as a RAG client writes it (the same layouts as loadgen's)."""
    if layout == "blank":
        return "\n\n".join([*docs, QUESTION])
    if layout == "xml":
        return "".join(f"<document>\n{d}\n</document>\n" for d in docs) + "\n" + QUESTION
    if layout == "numbered":
        return "".join(f"[{n}] {d}\n\n" for n, d in enumerate(docs, 1)) + QUESTION
    if layout == "markdown":
        return "".join(f"## {d.split()[1]} {d.split()[2]}\n{d}\n\n" for d in docs) + QUESTION
    if layout == "metadata":  # LlamaIndex's MetadataMode.LLM: a metadata line, then the text
        docs = [f"file_path: data/{d.split()[1].lower()}.txt\n\n{d}" for d in docs]
    context = "\n\n".join(docs)
    return (
        f"Context information is below.\n---------------------\n{context}\n"
        "---------------------\nGiven the context information and not prior knowledge, "
        f"answer the query.\nQuery: {QUESTION}\nAnswer: "
    )


# The extraction layout a client layout is found as (metadata lines ride in the dashed
# template's blocks).
FOUND_AS = {"metadata": "dashed"}


def messages(layout: str, docs: list[str], system: str = SYSTEM) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": user_text(layout, docs)},
    ]


def extraction_counts(text: str) -> dict[tuple[str, str], float]:
    """(outcome, layout) -> requests, over the endpoints."""
    counts: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("prism:extraction_total{"):
            labels = dict(part.split("=") for part in line[23 : line.index("}")].split(","))
            key = (labels["outcome"].strip('"'), labels["layout"].strip('"'))
            counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_the_same_documents_in_another_order_reuse_the_cache(
    proxy_factory: ProxyFactory, layout: str
) -> None:
    proxy = await proxy_factory()
    async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:
        first = await client.chat.completions.create(
            model="m", messages=messages(layout, DOCS), max_tokens=2
        )
        second = await client.chat.completions.create(
            model="m", messages=messages(layout, DOCS[::-1]), max_tokens=2
        )
    assert first.usage is not None and second.usage is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The system prompt, the documents (and their labels): all but the question.
    assert cached >= 0.75 * second.usage.prompt_tokens, (cached, second.usage.prompt_tokens)
    async with httpx.AsyncClient() as http:
        counts = extraction_counts((await http.get(proxy.url + "/metrics")).text)
    found = sum(n for (outcome, name), n in counts.items() if name == FOUND_AS.get(layout, layout))
    assert found == 2, counts


@pytest.mark.parametrize("at", [0, 2, 3], ids=["first", "middle", "last"])
@pytest.mark.parametrize("layout", LAYOUTS)
async def test_a_retrieval_that_adds_a_document_reuses_the_ones_cached(
    proxy_factory: ProxyFactory, layout: str, at: int
) -> None:
    """Two calls over the same three documents in the same order (two questions about
    one retrieval), then a third whose set adds a new document at `at`, the known ones
    in another order: the three known documents come from the cache, served along the
    arrangement cached, and the new one after them."""
    proxy = await proxy_factory()
    known, new = DOCS[:3], EXTRA_DOC
    third = [known[1], known[2], known[0]]
    third.insert(at, new)
    async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:
        system = f"{SYSTEM} ({layout}, {at})"  # its own: the engine is the module's
        for docs in (known, known, third):
            answer = await client.chat.completions.create(
                model="m", messages=messages(layout, docs, system), max_tokens=2
            )
    assert answer.usage is not None
    cached = answer.usage.prompt_tokens_details.cached_tokens
    assert cached >= 0.6 * answer.usage.prompt_tokens, (cached, answer.usage.prompt_tokens)


async def test_without_reordering_the_prompt_is_the_clients_own_text() -> None:
    """Documents found but kept in order: the engine receives exactly the tokens of the
    client's text, each document tokenized on its own (SPEC §1), decoding to the chat
    rendered whole."""
    seen: list[list[int]] = []
    backend = web.Application()
    record = recording_generate(lambda body: seen.append(body["input_ids"]))
    backend.router.add_post("/generate", record)
    async with loopback_app(backend) as url:
        for layout in LAYOUTS:
            async with running_proxy(url, extraction_reorder=False, tokenizer="builtin") as proxy:
                chat = messages(layout, DOCS)
                body = {"model": "m", "messages": chat, "max_tokens": 1}
                async with httpx.AsyncClient() as http:
                    answer = await http.post(proxy.url + "/v1/chat/completions", json=body)
                    assert answer.status_code == 200, answer.text
                    counts = extraction_counts((await http.get(proxy.url + "/metrics")).text)
                found_as = FOUND_AS.get(layout, layout)
                assert counts.get(("found-ordered", found_as)) == 1, (layout, counts)
                tokenizer = proxy.app[GATEWAY].tokenizer
                assert tokenizer.decode(seen[-1]) == tokenizer.render_chat(chat), layout


async def test_nothing_found_or_opted_out_goes_as_before(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory()
    plain = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hello there."}],
        "max_tokens": 1,
    }
    rag = {"model": "m", "messages": messages("xml", DOCS), "max_tokens": 1}
    async with httpx.AsyncClient(base_url=proxy.url) as http:
        assert (await http.post("/v1/chat/completions", json=plain)).status_code == 200
        off = {"x-prism-extract": "off"}
        answer = await http.post("/v1/chat/completions", json=rag, headers=off)
        assert answer.status_code == 200
        bad = await http.post("/v1/chat/completions", json=rag, headers={"x-prism-extract": "x"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-prism-extract"
        counts = extraction_counts((await http.get("/metrics")).text)
    assert counts[("none", "")] == 1 and counts[("off", "")] == 1
    disabled = await proxy_factory(extraction="off")
    async with httpx.AsyncClient(base_url=disabled.url) as http:
        assert (await http.post("/v1/chat/completions", json=rag)).status_code == 200
        counts = extraction_counts((await http.get("/metrics")).text)
    assert counts == {("off", ""): 1.0}


async def test_completions_and_generate_text_are_searched_too(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory()
    text = user_text("numbered", DOCS)
    async with httpx.AsyncClient(base_url=proxy.url) as http:
        done = await http.post(
            "/v1/completions", json={"model": "m", "prompt": text, "max_tokens": 1}
        )
        assert done.status_code == 200
        generated = await http.post(
            "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1}}
        )
        assert generated.status_code == 200
        counts = extraction_counts((await http.get("/metrics")).text)
    assert counts[("found", "numbered")] == 2


def _nested_tags(depth: int) -> str:
    return "<doc>" * depth + "x" + "</doc>" * (depth - 1)


ADVERSARIAL = {
    "deep, unbalanced tags": _nested_tags(20_000),
    "1e5 markers": "".join(f"[{n}] x\n" for n in range(1, 100_001)),
    "numbering collisions": "[1] a\n[1] b\n[2] c\n" * 20_000,
    "a message of separators": "\n\n" * 400_000,
    "markers inside documents": "".join(
        f"<doc>\nquoting <doc> and [2] and ## heads {n}\n</doc>\n" for n in range(2_000)
    )
    + "\nWhat now?",
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
async def test_adversarial_texts_are_answered_and_never_guessed(
    proxy_factory: ProxyFactory, name: str
) -> None:
    """Texts made to trip the finders: answered (the engine may refuse a prompt beyond
    its context, with its 400), never a 5xx; nothing is guessed (here nothing is found:
    100,000 markers or 2,000 documents are beyond 256, the others break the layouts'
    rules). The time each takes is linear in the text (`python -m bench.extraction`); a
    large prompt's work runs off the event loop."""
    proxy = await proxy_factory()
    body = {"model": "m", "messages": [{"role": "user", "content": ADVERSARIAL[name]}],
            "max_tokens": 1}  # fmt: skip
    async with httpx.AsyncClient(base_url=proxy.url, timeout=120.0) as http:
        health = http.get("/health")
        answer, probe = await asyncio.gather(http.post("/v1/chat/completions", json=body), health)
        assert answer.status_code in (200, 400), answer.text
        assert probe.status_code == 200
        counts = extraction_counts((await http.get("/metrics")).text)
    assert counts == {("none", ""): 1.0}
