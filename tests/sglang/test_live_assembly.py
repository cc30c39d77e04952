"""Answers the proxy assembles from the engine's streams, against the answers a real,
unmodified SGLang 0.5.23 gives the same non-streamed request itself: chat (logprobs,
several choices, tools), completions (logprobs, batches) and `/generate` (batches,
`n`, logprobs), on an engine that streams cumulative chunks (`ample`) and one that
streams increments (`hostile`, as deployed). Greedy decoding, so both answers are the
same text; what only differs by when it ran (ids, timestamps, latencies, the cache
state) is left out of the comparison."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from live_support import LiveServer

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


@pytest.mark.parametrize("engine", ["ample", "hostile"], ids=["cumulative", "incremental"])
async def test_assembled_answers_equal_the_engines_own(live, live_proxy_factory, engine) -> None:
    server: LiveServer = live[engine]
    proxy = await live_proxy_factory(server)
    async with httpx.AsyncClient(timeout=120.0) as client:
        for path, body in CASES:
            direct = await client.post(server.url + path, json=body, headers=server.headers)
            through = await client.post(proxy.url + path, json=body)
            assert direct.status_code == through.status_code == 200, (path, through.text)
            assert comparable(through.json()) == comparable(direct.json()), (path, body)
