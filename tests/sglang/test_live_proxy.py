"""The real `openai` client → the proxy → a real, unmodified SGLang 0.5.23 with the DART
plugin: API shapes, exact prefix reuse, anchors and pushes reaching the
plugin, aborts, and prefill pacing reading the server's limits."""

from __future__ import annotations

import os

import aiohttp
import httpx
import openai
import orjson
import pytest
from live_support import AMPLE_TOKENS, LiveServer, eventually

from prism_proxy.api.segments import SegmentedPrompt
from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.prompts.serializer import Serializer
from prism_tokens.tokenizer import load_tokenizer
from sglang_cpu.model import ensure_tiny_model

pytestmark = pytest.mark.sglang

SYSTEM = "Answer from the documents."
DOCS = [
    {"id": "osse", "text": "The river Osse flows into the Calder Sea below the old mill."},
    {"id": "bridges", "text": "Two bridges cross the Osse, at Amble and at Rowe."},
]


@pytest.fixture
async def proxy(live: dict[str, LiveServer], live_proxy_factory):
    live["ample"].fresh()
    return await live_proxy_factory(live["ample"])


def _chat(question: str, **extra: object) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 6,
        "extra_body": {"prism": {"segments": DOCS}, "ignore_eos": True, **extra},
    }


async def test_openai_client_chat_stream_completions_and_generate(
    proxy, live: dict[str, LiveServer]
) -> None:
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused")
    answer = await client.chat.completions.create(**_chat("Where does it flow?"))
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 6
    assert answer.choices[0].message.content

    pieces: list[str] = []
    stream = await client.chat.completions.create(
        **_chat("Which bridges?"), stream=True, stream_options={"include_usage": True}
    )
    usage = None
    async for chunk in stream:
        pieces += [c.delta.content or "" for c in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(pieces) and usage is not None and usage.completion_tokens == 6

    completion = await client.completions.create(
        model="m", prompt="The river", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert completion.choices[0].text and completion.usage.completion_tokens == 5
    await client.close()

    # Native /generate through the proxy answers exactly what SGLang answers directly
    # (greedy decoding of the same ids), with the client's rid as its id.
    ids = load_tokenizer(str(ensure_tiny_model())).encode("Count the bridges.")
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 7, "temperature": 0}}
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/generate", json={**body, "rid": "mine"}) as r:
            via_proxy = await r.json()
        async with http.post(live["ample"].url + "/generate", json=body) as r:
            direct = await r.json()
    assert via_proxy["output_ids"] == direct["output_ids"] and len(direct["output_ids"]) <= 7
    assert via_proxy["text"] == direct["text"] and via_proxy["meta_info"]["id"] == "mine"


async def test_incremental_streams_from_sglang_give_the_same_answers(
    live: dict[str, LiveServer], live_proxy_factory
) -> None:
    """`stock` streams incremental chunks (`--incremental-streaming-output`, the
    deployment's setting): the proxy assembles and relays them into the same answer
    SGLang gives directly, streamed or not (greedy decoding of the same ids)."""
    server = live["stock"]
    proxy = await live_proxy_factory(server, control_url=None, control_token=None)
    ids = load_tokenizer(str(ensure_tiny_model())).encode("Count the bridges.")
    sampling = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    async with aiohttp.ClientSession() as http:
        body = {"input_ids": ids, "sampling_params": sampling, "stream": True}
        async with http.post(server.url + "/generate", json=body) as r:
            chunks = [
                orjson.loads(line[5:]) async for line in r.content if line.startswith(b"data: {")
            ]
        async with http.post(server.url + "/generate", json={**body, "stream": False}) as r:
            direct = await r.json()
    # The server's mode: every chunk carries its own new ids, not all of them so far.
    assert sum(len(chunk["output_ids"]) for chunk in chunks) == 12 < len(chunks) * 12

    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused")
    request = {"model": "m", "prompt": ids, "max_tokens": 12, "temperature": 0}
    whole = await client.completions.create(**request, extra_body={"ignore_eos": True})
    pieces = [
        choice.text
        async for chunk in await client.completions.create(
            **request, stream=True, extra_body={"ignore_eos": True}
        )
        for choice in chunk.choices
    ]
    await client.close()
    assert whole.choices[0].text == direct["text"] == "".join(pieces)
    assert whole.usage.completion_tokens == 12


async def test_the_same_documents_twice_reuse_exactly_the_serialized_prefix(
    proxy, live: dict[str, LiveServer]
) -> None:
    """The second request's cached tokens are exactly the system head plus both
    documents, as the proxy's serializer lays them out (SPEC §1)."""
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused")
    first = await client.chat.completions.create(**_chat("Where does it flow?"))
    second = await client.chat.completions.create(**_chat("Name both bridges."))
    await client.close()
    serializer = Serializer(load_tokenizer(str(ensure_tiny_model())))
    prompt = SegmentedPrompt(system=SYSTEM, segments=DOCS, suffix="Name both bridges.")
    serialized = serializer.serialize(prompt, [d["id"] for d in DOCS])
    shared = serialized.head_tokens + sum(serialized.segment_tokens.values())
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens == len(serialized.input_ids)
    assert second.usage.prompt_tokens_details.cached_tokens == shared

    # The anchors reached DART through kv_hints; the proxy's pushes reached its RPC.
    # A push goes out in the background after its wave, and the scheduler applies a
    # table it took at its next tree operation: wait for both pushes to be taken, then
    # give the scheduler that operation.
    registry = proxy.app[GATEWAY].metrics.registry
    await eventually(lambda: registry.get_sample_value("prism:control_rpc_pushes_total") >= 2)
    live["ample"].generate([5, 6, 7])
    stats = live["ample"].stats()
    assert stats["anchors_resident"] >= 1 + len(DOCS)  # system head and both documents
    assert stats["epoch"] is not None and stats["table_size"] >= len(DOCS)


async def test_a_client_disconnect_aborts_the_request_inside_sglang(
    proxy, live: dict[str, LiveServer]
) -> None:
    server = live["ample"]
    aborted_before = server.metric("sglang:num_aborted_requests_total")
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(proxy.url + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status == 200
        await response.content.readline()  # streaming: now leave
    backend = proxy.app[GATEWAY].backend
    await eventually(lambda: backend.aborts_sent == 1)
    await eventually(
        lambda: server.metric("sglang:num_aborted_requests_total") == aborted_before + 1
    )
    info = httpx.get(server.url + "/server_info", timeout=10.0).json()
    assert info["internal_states"][0].get("num_running_reqs", 0) == 0
    admission = proxy.app[GATEWAY].admission
    await eventually(lambda: admission.inflight == 0)


async def test_prefill_pacing_reads_the_real_server_info(proxy) -> None:
    pacing = proxy.app[GATEWAY].admission.pacing
    # SGLang on this CPU: chunked_prefill_size 4096, max_running_requests resolved to 2048
    # (`internal_states[0].effective_max_running_requests_per_dp`; the argument is null).
    # and its pool (`max_total_num_tokens`, what --max-total-tokens asked) and the longest
    # request it takes (`max_req_input_len`), which bound a request's decode (edge.limits)
    limits = pacing.backend
    assert (limits.prefill_budget_tokens, limits.max_running_requests) == (4096, 2048)
    assert limits.kv_pool_tokens == AMPLE_TOKENS
    assert limits.context_tokens is not None and 0 < limits.context_tokens <= AMPLE_TOKENS
    assert pacing.prefill_batch == 4 and pacing.backstop == 2048


async def test_tokenizer_auto_reads_the_model_directory(
    live: dict[str, LiveServer], live_proxy_factory
) -> None:
    """`--tokenizer auto` asks SGLang's /model_info for its model path: the same
    directory the proxy otherwise names, loaded the same way."""
    proxy = await live_proxy_factory(live["ample"], tokenizer="auto")
    tokenizer = proxy.app[GATEWAY].tokenizer
    assert os.path.samefile(tokenizer.name, ensure_tiny_model())
