"""What one request may ask the engine to generate and what one answer may weigh
(`prism_proxy.edge.limits`): the rules on their own, and through real HTTP (the proxy
in front of prism-sim, clients on their own loopback addresses)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from proxy_support import (
    ProxyFactory,
    eventually,
    holding_backend,
    loopback_app,
    proxy_factory_fixture,
    running_proxy,
    sim_server,
)

from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.api.completions import CompletionRequest
from prism_proxy.api.generate import GenerateRequest
from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.edge.limits import (
    ClientReservations,
    EngineSize,
    LimitError,
    answer_bytes,
    check_answer,
    check_decode,
    request_limit,
    reserved_tokens,
)

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)

ENGINE = EngineSize(pool_tokens=16_384, context_tokens=8_186)
MSG = [{"role": "user", "content": "hi"}]


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **fields})


def test_the_request_bound_counts_every_sequence() -> None:
    limit = request_limit(None, ENGINE)
    assert limit == 4_096  # a quarter of the pool
    check_decode(chat(max_tokens=4_096).decode_ask(), limit, ENGINE)
    check_decode(chat().decode_ask(), limit, ENGINE)  # one sequence, unset: the engine's
    with pytest.raises(LimitError, match="16 sequence"):
        check_decode(chat(n=16, max_tokens=8_000).decode_ask(), limit, ENGINE)
    with pytest.raises(LimitError, match="at most 2048"):
        check_decode(chat(n=2).decode_ask(), limit, ENGINE)  # unset: the context each
    generate = GenerateRequest.model_validate(
        {"text": ["a", "b", "c"], "sampling_params": {"max_new_tokens": 2_000, "n": 2}}
    )
    assert generate.decode_ask().sequences == 6
    with pytest.raises(LimitError):
        check_decode(generate.decode_ask(), limit, ENGINE)
    # /generate without max_new_tokens is SGLang's default of 128 per sequence
    default = GenerateRequest.model_validate({"text": "a", "sampling_params": {"n": 16}})
    check_decode(default.decode_ask(), limit, ENGINE)
    batch = CompletionRequest.model_validate({"prompt": ["a", "b"], "max_tokens": 3_000})
    with pytest.raises(LimitError):
        check_decode(batch.decode_ask(), limit, ENGINE)


def test_a_client_reserves_only_what_its_requests_force_or_multiply() -> None:
    assert reserved_tokens(chat(max_tokens=500).decode_ask(), ENGINE) == 0
    assert reserved_tokens(chat(max_tokens=500, min_tokens=300).decode_ask(), ENGINE) == 300
    assert reserved_tokens(chat(max_tokens=500, ignore_eos=True).decode_ask(), ENGINE) == 500
    assert reserved_tokens(chat(max_tokens=500, n=3).decode_ask(), ENGINE) == 1_500
    table = ClientReservations()
    assert table.hold("a", 10_000, 16_384) and not table.hold("a", 10_000, 16_384)
    assert table.hold("b", 10_000, 16_384)  # another client's share
    table.release("a", 10_000)
    assert table.held("a") == 0 and "a" not in set(table)  # gone when it holds nothing
    assert table.hold("a", 20_000, 16_384)  # one request alone: the request bound judges it


def test_answers_that_cannot_fit_are_refused_before_they_are_made() -> None:
    ask = chat(n=16, max_tokens=4_000, logprobs=True, top_logprobs=20).decode_ask()
    assert answer_bytes(ask, ENGINE) > 16 << 20
    with pytest.raises(LimitError, match="stream: true"):
        check_answer(ask, 16 << 20, ENGINE)
    check_answer(chat(max_tokens=4_000).decode_ask(), 16 << 20, ENGINE)


async def post(url: str, path: str, body: dict, address: str = "127.0.0.1") -> tuple[int, dict]:
    connector = aiohttp.TCPConnector(local_addr=(address, 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(url + path, json=body) as response,
    ):
        return response.status, (await response.json()) if response.status != 200 else {}


async def test_limits_through_the_proxy(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(max_decode_tokens=1_000, max_answer_bytes=200_000)
    chat_path = "/v1/chat/completions"
    status, answer = await post(proxy.url, chat_path, {"model": "m", "messages": MSG, "n": 4,
                                                        "max_tokens": 500})  # fmt: skip
    assert status == 400 and answer["error"]["param"] == "max_tokens"
    assert "max_decode_tokens" in answer["error"]["message"]
    status, answer = await post(
        proxy.url, "/generate",
        {"text": "hi", "sampling_params": {"max_new_tokens": 300, "n": 4}},
    )  # fmt: skip
    assert status == 400
    big = {"model": "m", "messages": MSG, "max_tokens": 900, "logprobs": True, "top_logprobs": 20}
    status, answer = await post(proxy.url, chat_path, big)
    assert status == 400 and answer["error"]["param"] == "stream"
    status, _ = await post(proxy.url, chat_path, {**big, "stream": True})  # streamed: relayed
    assert status == 200
    status, _ = await post(proxy.url, chat_path, {"model": "m", "messages": MSG, "max_tokens": 9})
    assert status == 200


async def test_one_client_past_its_share_gets_429_and_others_are_served() -> None:
    """A backend that holds every answer until told: the first client's forced request
    stays in flight while its next one asks for more than its share."""
    release = asyncio.Event()
    backend = holding_backend(release)
    forced = {"model": "m", "messages": MSG, "max_tokens": 2_000, "min_tokens": 2_000}
    async with (
        loopback_app(backend) as url,
        running_proxy(url, max_client_decode_tokens=3_000, tokenizer="builtin") as proxy,
    ):
        reservations = proxy.app[GATEWAY].reservations
        path = "/v1/chat/completions"
        first = asyncio.create_task(post(proxy.url, path, forced, "127.0.0.2"))
        await eventually(lambda: reservations.held("127.0.0.2") == 2_000)
        status, answer = await post(proxy.url, path, forced, "127.0.0.2")
        assert status == 429 and "max_client_decode_tokens" in answer["error"]["message"]
        other = asyncio.create_task(post(proxy.url, path, forced, "127.0.0.3"))
        await eventually(lambda: reservations.held("127.0.0.3") == 2_000)
        release.set()
        assert (await first)[0] == (await other)[0] == 200
        await eventually(lambda: not set(reservations))
        # counted per account (without keys, every client is `addr`) with the limit named
        registry = proxy.app[GATEWAY].metrics.registry
        refused = {"account": "addr", "status": "429", "limit": "max_client_decode_tokens"}
        assert registry.get_sample_value("prism:account_requests_total", refused) == 1
