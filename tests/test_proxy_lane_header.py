"""The `x-prism-lane` response header: which lane released a request (for per-lane
numbers in load generators), on streamed and whole answers alike."""

from __future__ import annotations

import aiohttp
import pytest
from proxy_support import ProxyFactory, proxy_factory_fixture, sim_server

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
HINTED = {**CHAT, "prism": {"segments": [{"id": "doc", "text": "Some document text."}]}}
TOOLS = {
    **CHAT,
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("body", "lanes"),
    # A lone hinted request has a signature, so QAS fills it into the hot lane first;
    # one without hints has the empty signature and is cold-only (SPEC §2). One with
    # tools is served by the engine's endpoint (without segmentation it would be passed
    # through); the agent session features (on by default) make its last message a
    # segment, the session's key, so it has a signature too.
    # A client's grouping hint (`prompt_cache_key`) gives it a bucket of its own.
    [
        (HINTED, {"hot"}),
        (CHAT, {"cold"}),
        (TOOLS, {"hot"}),
        ({**CHAT, "prompt_cache_key": "tenant-a"}, {"hot"}),
        ({**TOOLS, "prompt_cache_key": "tenant-a"}, {"hot"}),
    ],
)
async def test_lane_header(proxy_factory: ProxyFactory, sim, body, lanes, stream) -> None:
    proxy = await proxy_factory()
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.url + "/v1/chat/completions", json={**body, "stream": stream}) as r,
    ):
        await r.read()
    assert r.status == 200
    assert r.headers.get("x-prism-lane") in lanes


async def test_no_lane_on_a_rejected_request(proxy_factory: ProxyFactory, sim) -> None:
    proxy = await proxy_factory()
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.url + "/v1/chat/completions", json={**CHAT, "messages": 3}) as r,
    ):
        await r.read()
    assert r.status == 400
    assert "x-prism-lane" not in r.headers
