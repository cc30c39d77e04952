"""Answers the proxy assembles from the engine's streams, against the answers a real,
unmodified SGLang 0.5.23 gives the same non-streamed request itself: chat (logprobs,
several choices, tools), completions (logprobs, batches) and `/generate` (batches,
`n`, logprobs), on an engine that streams cumulative chunks (`ample`) and one that
streams increments (`hostile`, as deployed). Greedy decoding, so both answers are the
same text; what only differs by when it ran (ids, timestamps, latencies, the cache
state) is left out of the comparison. The engine's cache is emptied before each answer:
a logprob depends on which of the prompt's tokens came from the cache (by 1e-6 to 1e-3
on this CPU)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest
from live_support import LiveServer
from proxy_support import eventually

from prism_proxy.edge.gateway import GATEWAY

pytestmark = pytest.mark.sglang

MSG = [{"role": "user", "content": "Name three rivers."}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}  # fmt: skip
CASES = [
    ("/v1/chat/completions", {"model": "m", "messages": MSG, "max_tokens": 8, "temperature": 0,
                              "logprobs": True, "top_logprobs": 3}),
    ("/v1/chat/completions", {"model": "m", "messages": MSG, "max_tokens": 6, "temperature": 0,
                              "n": 2}),
    ("/v1/chat/completions", {"model": "m", "messages": MSG, "max_tokens": 6, "temperature": 0,
                              "tools": [TOOL]}),
    ("/v1/completions", {"model": "m", "prompt": "Rivers:", "max_tokens": 6, "temperature": 0,
                         "logprobs": 2}),
    ("/v1/completions", {"model": "m", "prompt": ["Rivers:", "Lakes:"], "max_tokens": 5,
                         "temperature": 0}),
    ("/generate", {"text": ["Rivers:", "Lakes:"],
                   "sampling_params": {"max_new_tokens": 5, "temperature": 0}}),
    ("/generate", {"text": "Rivers:", "sampling_params": {"max_new_tokens": 5, "temperature": 0,
                                                          "n": 2}}),
    ("/generate", {"text": "Rivers:", "sampling_params": {"max_new_tokens": 7, "temperature": 0},
                   "return_logprob": True, "top_logprobs_num": 2}),
]  # fmt: skip
# What differs between two runs of one request: ids, clocks, and the cache's state.
RUN_SPECIFIC = re.compile(
    r"^(id|created|metadata|cached_tokens|cached_tokens_details|prompt_tokens_details|dp_rank)$"
    r"|_ts$|latency|_time$|throughput|_delay|_wait$"
)


def difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where `a` and `b` differ first (None: they are equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path}: keys {sorted(a)} != {sorted(b)}"
        return next((d for k in a if (d := difference(a[k], b[k], f"{path}.{k}"))), None)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        pairs = enumerate(zip(a, b, strict=True))
        return next((d for i, (x, y) in pairs if (d := difference(x, y, f"{path}[{i}]"))), None)
    return None if a == b else f"{path}: {a!r} != {b!r}"


def comparable(value: Any) -> Any:
    """`value` without run-specific fields; a field SGLang leaves null in one shape
    and out of the other (`completion_tokens_details` of a streamed usage) is out."""
    if isinstance(value, dict):
        return {
            key: comparable(item)
            for key, item in value.items()
            if not RUN_SPECIFIC.search(key) and item is not None
        }
    if isinstance(value, list):
        return [comparable(item) for item in value]
    return value


async def cold(client: httpx.AsyncClient, server: LiveServer) -> None:
    """Empty the engine's cache (once its last request is done), so that each of the
    two answers compared is prefilled from nothing: a logprob depends on which of the
    prompt's tokens came from the cache."""

    async def flushed() -> bool:
        url = server.url + "/flush_cache"
        return (await client.post(url, headers=server.admin_headers)).status_code == 200

    deadline = asyncio.get_running_loop().time() + 30.0
    while not await flushed():
        assert asyncio.get_running_loop().time() < deadline, "the engine never went idle"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("engine", ["ample", "hostile"], ids=["cumulative", "incremental"])
async def test_assembled_answers_equal_the_engines_own(live, live_proxy_factory, engine) -> None:
    server: LiveServer = live[engine]
    proxy = await live_proxy_factory(server)
    async with httpx.AsyncClient(timeout=120.0) as client:
        for path, body in CASES:
            await cold(client, server)
            direct = await client.post(server.url + path, json=body, headers=server.headers)
            await cold(client, server)
            through = await client.post(proxy.url + path, json=body)
            assert direct.status_code == through.status_code == 200, (path, through.text)
            mine, theirs = comparable(through.json()), comparable(direct.json())
            assert difference(mine, theirs) is None, (path, body, difference(mine, theirs))


STREAMED_GENERATE = [
    {"text": ["Rivers:", "Lakes:"], "stream": True,
     "sampling_params": {"max_new_tokens": 5, "temperature": 0}},
    {"text": "Rivers:", "stream": True,
     "sampling_params": {"max_new_tokens": 4, "temperature": 0, "n": 2}},
]  # fmt: skip


async def _last_chunks(client: httpx.AsyncClient, url: str, body: Any, headers: Any) -> dict:
    """Each answer's last chunk of a streamed `/generate`, by its index."""
    last: dict[int, Any] = {}
    async with client.stream("POST", url + "/generate", json=body, headers=headers) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunk = json.loads(line[5:])
                last[chunk.get("index", 0)] = chunk
    return last


async def test_a_streamed_generate_batch_is_relayed_and_counted(live, live_proxy_factory) -> None:
    """A streamed batch (and `n`) on `/generate` goes to SGLang's own endpoint and is
    relayed as it streams: each answer ends as SGLang's own stream of the same request
    does, and the proxy counts each answer's tokens from its last `meta_info` (what a
    key's tokens per minute are charged)."""
    server: LiveServer = live["ample"]
    proxy = await live_proxy_factory(server)
    prompt_tokens = 0
    async with httpx.AsyncClient(timeout=120.0) as client:
        for body in STREAMED_GENERATE:
            await cold(client, server)
            direct = await _last_chunks(client, server.url, body, server.headers)
            await cold(client, server)
            through = await _last_chunks(client, proxy.url, body, None)
            assert sorted(through) == sorted(direct) == [0, 1]
            for index, chunk in through.items():
                mine, theirs = comparable(chunk), comparable(direct[index])
                assert difference(mine, theirs) is None, (body, index, difference(mine, theirs))
            prompt_tokens += sum(chunk["meta_info"]["prompt_tokens"] for chunk in through.values())
    admission = proxy.app[GATEWAY].admission
    await eventually(lambda: admission.inflight == 0)  # counted at each answer's end
    registry = proxy.app[GATEWAY].metrics.registry
    counted = registry.get_sample_value("prism:prompt_tokens_total", {"lane": "passthrough"})
    assert counted == prompt_tokens > 0
