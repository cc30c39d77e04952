"""A burst of 2,000 concurrent requests through the proxy ("must show"):
every request is answered exactly once with its own answer; nothing is lost or
duplicated on the way to the engine; the queue and in-flight gauges return to 0."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from proxy_support import ProxyFactory, eventually, proxy_factory_fixture, sim_metric, sim_server

from prism_proxy.edge.gateway import GATEWAY

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)

NUM_REQUESTS = 2000
# The burst, its clients and the proxy share one process: 228 s at a load of 13 on this
# 2-core machine. Every request may take the whole budget (they all start at once).
BUDGET_S = 900.0
POOL = [f"passage {i}: " + " ".join(f"fact{i}x{j}" for j in range(12)) for i in range(12)]


def _request(i: int) -> tuple[str, dict, str]:
    """(path, body, expected id) for request i; a mix of endpoints, hints and streams."""
    rid = f"burst-{i}"
    stream = i % 4 == 0
    kind = i % 3
    if kind == 0:
        segments = [{"id": f"p{(i + k) % 12}", "text": POOL[(i + k) % 12]} for k in (0, 5)]
        body = {
            "model": "m",
            "rid": rid,
            "messages": [{"role": "user", "content": f"question {i}"}],
            "max_tokens": 2,
            "stream": stream,
            "prism": {"segments": segments},
        }
        return "/v1/chat/completions", body, f"chatcmpl-{rid}"
    if kind == 1:
        body = {
            "model": "m",
            "rid": rid,
            "prompt": f"prompt {i}",
            "max_tokens": 2,
            "stream": stream,
        }
        return "/v1/completions", body, f"cmpl-{rid}"
    body = {
        "rid": rid,
        "text": f"text {i}",
        "stream": stream,
        "sampling_params": {"max_new_tokens": 2},
    }
    return "/generate", body, rid


def _ids_of(payload: bytes, stream: bool) -> list[str]:
    if not stream:
        body = json.loads(payload)
        return [body["meta_info"]["id"] if "meta_info" in body else body["id"]]
    events = [e[6:] for e in payload.decode().split("\n\n") if e.startswith("data: ")]
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    ids = set()
    for event in events[:-1]:
        chunk = json.loads(event)
        ids.add(chunk["meta_info"]["id"] if "meta_info" in chunk else chunk["id"])
    return sorted(ids)


@pytest.mark.timeout(BUDGET_S + 60)
async def test_burst_of_2000_concurrent_requests(proxy_factory: ProxyFactory, sim) -> None:
    proxy = await proxy_factory(max_inflight=64)
    finished_before = sim_metric(sim, "sglang:num_requests_total")
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=BUDGET_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def call(i: int) -> tuple[int, int, list[str], str]:
            path, body, expected = _request(i)
            async with session.post(proxy.url + path, json=body) as response:
                payload = await response.read()
            return i, response.status, _ids_of(payload, body["stream"]), expected

        results = await asyncio.gather(*(call(i) for i in range(NUM_REQUESTS)))

    assert len(results) == NUM_REQUESTS
    assert all(status == 200 for _, status, _, _ in results)
    assert all(ids == [expected] for _, _, ids, expected in results)  # its own answer, once
    await eventually(lambda: proxy.app[GATEWAY].admission.inflight == 0)
    registry = proxy.app[GATEWAY].metrics.registry
    assert registry.get_sample_value("prism:queue_depth") == 0
    assert registry.get_sample_value("prism:inflight_requests") == 0

    def ok() -> float:
        return sum(
            registry.get_sample_value(
                "prism:requests_total", {"endpoint": e, "lane": lane, "status": "200"}
            )
            or 0
            for e in ("chat", "completions", "generate")
            for lane in ("hot", "cold")
        )

    # a streamed request is counted once its handler returns, after its last chunk
    await eventually(lambda: ok() >= NUM_REQUESTS)
    assert ok() == NUM_REQUESTS
    # The engine finished exactly one request per client request: none lost, none twice.
    assert sim_metric(sim, "sglang:num_requests_total") - finished_before == NUM_REQUESTS
    # Waves never exceeded the concurrency limit.
    assert registry.get_sample_value("prism:wave_size_count") > 0
    assert registry.get_sample_value("prism:wave_size_bucket", {"le": "64.0"}) == (
        registry.get_sample_value("prism:wave_size_count")
    )
