"""`/v1/embeddings`, `/v1/tokenize`, `/v1/detokenize` through the real proxy in front of
the simulated engine (which serves them in SGLang's shapes): the `openai` client's
embeddings call, httpx for the others; the engine's own answer comes back, and bad
input is refused with a 400 naming the field before it reaches the engine."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from proxy_support import ProxyFactory, proxy_factory_fixture, sim_server

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)


async def test_embeddings_through_the_openai_client(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory()
    async with AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:
        # the client asks for base64 and decodes it; float as SGLang sends it
        one = await client.embeddings.create(model="m", input="The Pont Neuf")
        again = await client.embeddings.create(
            model="m", input="The Pont Neuf", encoding_format="float"
        )
        batch = await client.embeddings.create(
            model="m", input=["The Pont Neuf", "The Millau Viaduct"], dimensions=8
        )
        ids = await client.embeddings.create(model="m", input=[[1, 2, 3], [4, 5]])
    vector = one.data[0].embedding
    assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-4)
    assert [round(x, 5) for x in vector] == [round(x, 5) for x in again.data[0].embedding]
    assert one.usage.prompt_tokens > 0
    assert [d.index for d in batch.data] == [0, 1]
    assert all(len(d.embedding) == 8 for d in batch.data)
    assert batch.data[0].embedding != batch.data[1].embedding
    assert len(ids.data) == 2 and ids.usage.prompt_tokens == 5


async def test_tokenize_and_detokenize_answer_as_the_engine(
    proxy_factory: ProxyFactory, sim: Any
) -> None:
    proxy = await proxy_factory()
    chat = {"messages": [{"role": "user", "content": "Which bridge is the oldest?"}]}
    async with httpx.AsyncClient(timeout=30.0) as client:
        for body in ({"prompt": "The Pont Neuf"}, {"prompt": ["a b", "c"]}, chat):
            through = await client.post(proxy.url + "/v1/tokenize", json=body)
            direct = await client.post(sim.url + "/v1/tokenize", json=body)
            assert through.status_code == 200 and through.json() == direct.json(), through.text
        tokens = (
            await client.post(
                proxy.url + "/v1/tokenize",
                json={"prompt": "The Pont Neuf", "add_special_tokens": False},
            )
        ).json()["tokens"]
        text = await client.post(proxy.url + "/v1/detokenize", json={"tokens": tokens})
    assert text.json() == {"text": "The Pont Neuf"}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", {"input": ""}, "input"),
        ("/v1/embeddings", {"input": ["a"] * 65}, "input"),
        ("/v1/embeddings", {"input": [[1, 2, 10**9]]}, "input.0.2"),
        ("/v1/embeddings", {"input": "a", "embed_overrides": [[[0.0]]]}, "embed_overrides"),
        ("/v1/embeddings", {"input": "a", "lora_path": "x"}, "lora_path"),
        ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ("/v1/embeddings", {"input": [{"text": "a", "image": "http://x"}]}, "input"),
        ("/v1/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "body"),
        ("/v1/tokenize", {"prompt": 5}, "prompt"),
        ("/v1/detokenize", {"tokens": [-1]}, "tokens.0"),
        ("/v1/detokenize", {"tokens": "abc"}, "tokens"),
    ],
)
async def test_bad_input_is_refused_naming_the_field(
    proxy_factory: ProxyFactory, path: str, body: dict[str, Any], param: str
) -> None:
    proxy = await proxy_factory()
    async with httpx.AsyncClient(timeout=30.0) as client:
        answer = await client.post(proxy.url + path, json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.text


async def test_inputs_count_against_max_prompt_chars(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(max_prompt_chars=100)
    async with httpx.AsyncClient(timeout=30.0) as client:
        for path, body in [
            ("/v1/embeddings", {"input": ["x" * 60, "y" * 60]}),
            ("/v1/tokenize", {"prompt": "x" * 101}),
            ("/v1/detokenize", {"tokens": [1] * 101}),
        ]:
            answer = await client.post(proxy.url + path, json=body)
            assert answer.status_code == 413, (path, answer.text)
