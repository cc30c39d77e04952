"""Structured outputs through the proxy to a real, unmodified SGLang 0.5.23 on this
CPU (issue 36's must-show): one client's 8 distinct slow-to-compile JSON schemas beside
another client's structured request. SGLang compiles grammars in a pool of
min(32, CPUs + 4) threads (6 here) shared by every client; 8 slow ones fill it and the
other client's grammar waits behind them (22.9 s measured with xgrammar alone, 162.7 s
in the issue's run). Through the proxy, the first client has at most
`max_client_grammar_compiles` (2) new grammars in flight; the rest get 429 and never
reach the engine, and the other client is answered while the two still compile.
`bench/grammar_squat.py` measures the other client's latency, with and without."""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx
import openai
import pytest
from live_support import LiveServer, eventually
from openai.types.chat import ChatCompletion

from prism_proxy.edge.gateway import GATEWAY

pytestmark = pytest.mark.sglang

SQUATTER, VICTIM = "127.0.0.2", "127.0.0.1"
# Nested bounded repetitions: xgrammar expands them into a large automaton. Alone on
# this CPU, depth 10 compiled in 3 s, 20 in 14.5 s (xgrammar 0.2.7, the tiny model's
# 8,192-token vocabulary). The innermost bound differs per schema, so that neither
# SGLang's cache (by text) nor xgrammar's (by grammar) has seen one before.
SLOW_PATTERN = "(([a-z]{1,%d} ){1,30}){1,%d}"


def slow_schema(index: int, depth: int) -> dict:
    return {"type": "string", "pattern": SLOW_PATTERN % (30 + index, depth)}


def client_from(url: str, address: str) -> openai.AsyncOpenAI:
    """An `openai` client of the proxy at `url` whose connections come from `address`
    (one client to the proxy), and that does not retry a 429 by itself."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    http = httpx.AsyncClient(transport=transport, timeout=600.0)
    return openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="unused", http_client=http, max_retries=0
    )


def engine_requests(server: LiveServer) -> float:
    return server.metric("sglang:num_requests_total")


async def ask(client: openai.AsyncOpenAI, schema: dict, name: str) -> ChatCompletion:
    return await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Answer in JSON."}],
        max_tokens=4,
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
    )


async def test_slow_schemas_of_one_client_do_not_hold_another_clients_request(
    live, live_proxy_factory
) -> None:
    server: LiveServer = live["hostile"]
    proxy = await live_proxy_factory(server)
    ledger = proxy.app[GATEWAY].structured
    tag = secrets.token_hex(6)  # new to the engine's grammar cache in every run
    squatter, victim = client_from(proxy.url, SQUATTER), client_from(proxy.url, VICTIM)
    before = engine_requests(server)
    squat = [
        asyncio.create_task(ask(squatter, slow_schema(i, depth=16), f"s{i}")) for i in range(8)
    ]
    # two compile in the engine; the other six are refused at once
    await eventually(lambda: sum(task.done() for task in squat) == 6, timeout_s=60.0)
    refused = [task for task in squat if task.done()]
    for task in refused:
        with pytest.raises(openai.RateLimitError) as caught:
            task.result()
        assert "max_client_grammar_compiles" in str(caught.value)
    compiling = [task for task in squat if not task.done()]
    assert ledger.compiling(SQUATTER) == 2
    started = time.monotonic()
    field = f"ok_{tag}"  # new to both caches
    schema = {"type": "object", "properties": {field: {"type": "boolean"}}, "required": [field]}
    answer = await ask(victim, schema, "victim")
    elapsed_s = time.monotonic() - started
    # answered while the squatter's two grammars still compile: not held behind them
    assert answer.choices[0].message.content is not None
    assert not any(task.done() for task in compiling), f"victim took {elapsed_s:.2f} s"
    print(f"the other client's structured request: {elapsed_s:.2f} s")
    for task in compiling:  # each accepted request ends in one answer
        assert (await task).choices[0].finish_reason in ("stop", "length")
    # the six refused never reached the engine
    await eventually(lambda: engine_requests(server) == before + 3)
    await eventually(lambda: ledger.compiling(SQUATTER) == 0)
    await squatter.close()
    await victim.close()
