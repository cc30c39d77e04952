"""Liveness and readiness (`edge.readiness`): /readyz follows the engine dying and
coming back (prism-sim killed and restarted on its port, behind a real proxy with the
default readiness probe), and turns 503 while the proxy drains; /livez and /health stay
200 throughout. How fast: `python -m bench.readiness` (no timing asserted here)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from aiohttp import web
from proxy_support import (
    SIM_ARGS,
    loopback_app,
    proxy_config,
    recording_generate,
    running_proxy,
)

from loadgen.stack.processes import free_port, spawn_server, wait_healthy
from prism_proxy.app import start_proxy
from prism_proxy.backend.tokenizer_choice import TokenizerState
from prism_proxy.backend.tokenizer_guard import TokenizerCheck
from prism_proxy.edge.readiness import not_ready

BOUND_S = 30.0  # a liveness bound on a busy machine, not the speed under test


async def status(client: httpx.AsyncClient, url: str) -> int:
    return (await client.get(url, timeout=10.0)).status_code


async def until_status(client: httpx.AsyncClient, url: str, expected: int) -> None:
    """Poll `url` until it answers `expected` (bounded by `BOUND_S`)."""
    seen: list[int] = []

    async def check() -> bool:
        seen.append(await status(client, url))
        return seen[-1] == expected

    async with asyncio.timeout(BOUND_S):
        while not await check():
            await asyncio.sleep(0.02)


async def test_readyz_follows_the_engine_dying_and_coming_back(tmp_path) -> None:
    port = free_port()
    first = spawn_server("prism_sim", SIM_ARGS, port=port, log_dir=tmp_path)
    try:
        await asyncio.to_thread(wait_healthy, first.url, first.process, 60.0, "/health")
        # the product's default readiness probe, not the tests' "no probes"
        async with (
            running_proxy(first.url, ready_interval_s=1.0) as proxy,
            httpx.AsyncClient() as client,
        ):
            await until_status(client, proxy.url + "/readyz", 200)
            first.process.kill()  # the engine dies, no goodbye
            await asyncio.to_thread(first.process.wait)
            await until_status(client, proxy.url + "/readyz", 503)
            answer = (await client.get(proxy.url + "/readyz")).json()
            assert answer["reasons"] == ["the engine is down"]
            assert await status(client, proxy.url + "/livez") == 200
            health = (await client.get(proxy.url + "/health")).json()
            assert health["status"] == "ok" and health["backend_up"] is False
            # the same port, a new engine process
            second = spawn_server("prism_sim", SIM_ARGS, port=port, log_dir=tmp_path)
            try:
                await asyncio.to_thread(wait_healthy, second.url, second.process, 60.0, "/health")
                await until_status(client, proxy.url + "/readyz", 200)
                # ready means servable: a chat goes through the new engine
                chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                answer = await client.post(
                    proxy.url + "/v1/chat/completions",
                    json={**chat, "max_tokens": 2},
                    timeout=30.0,
                )
                assert answer.status_code == 200, answer.text
            finally:
                second.stop()
    finally:
        first.stop()


async def test_readyz_is_503_while_draining() -> None:
    async with loopback_app(gateway_stub()) as url:
        proxy = await start_proxy(proxy_config(url, tokenizer="builtin", drain_delay_s=3.0))
        stopped = None
        try:
            async with httpx.AsyncClient() as client:
                await until_status(client, proxy.url + "/readyz", 200)
                stopped = asyncio.create_task(proxy.stop())
                await until_status(client, proxy.url + "/readyz", 503)
                answer = (await client.get(proxy.url + "/readyz")).json()
                assert answer["reasons"] == ["draining: the proxy is shutting down"]
                # still serving while the load balancer learns it
                assert await status(client, proxy.url + "/livez") == 200
                chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                answer = await client.post(
                    proxy.url + "/v1/chat/completions", json={**chat, "max_tokens": 2}
                )
                assert answer.status_code == 200, answer.text
            await stopped
        finally:
            if stopped is None:
                await proxy.stop()


def _check(state: TokenizerState | None, downs: int = 1) -> TokenizerCheck:
    return TokenizerCheck(state=state, downs=downs)


@pytest.mark.parametrize(
    ("up", "downs", "check", "forward", "draining", "reasons"),
    [
        (True, 1, _check(TokenizerState.MATCH), False, False, []),
        (True, 1, _check(TokenizerState.UNVERIFIED), False, False, []),
        (None, 0, _check(None, -1), False, False, ["starting: the engine has not answered yet"]),
        (False, 2, _check(TokenizerState.MATCH), False, False, ["the engine is down"]),
        # back up, but the tokenizer was checked against the engine before it went down
        (
            True,
            2,
            _check(TokenizerState.MATCH),
            False,
            False,
            ["the tokenizer is not checked against the engine running now"],
        ),
        (
            True,
            1,
            _check(TokenizerState.MISMATCH),
            False,
            False,
            ["the proxy's tokenizer does not match the engine's"],
        ),
        # a mismatch with `forward`: chats go to the engine's own endpoints, still served
        (True, 1, _check(TokenizerState.MISMATCH), True, False, []),
        (
            True,
            1,
            _check(TokenizerState.MATCH),
            False,
            True,
            ["draining: the proxy is shutting down"],
        ),
    ],
)
def test_not_ready_reasons(
    up: bool | None,
    downs: int,
    check: TokenizerCheck,
    forward: bool,
    draining: bool,
    reasons: list[str],
) -> None:
    assert not_ready(up, downs, check, forward=forward, draining=draining) == reasons


def gateway_stub() -> web.Application:
    """A backend without `/ready` (as a gateway): server info and `/generate` only."""

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response({"max_running_requests": 8})

    app = web.Application()
    app.router.add_get("/server_info", server_info)
    app.router.add_post("/generate", recording_generate(lambda body: None))
    return app


async def test_readyz_follows_a_backend_without_ready() -> None:
    """No `/ready` (404): the readiness probe asks the server info instead."""
    port = free_port()
    runner = web.AppRunner(gateway_stub())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}"
    try:
        async with (
            running_proxy(url, tokenizer="builtin", ready_interval_s=1.0) as proxy,
            httpx.AsyncClient() as client,
        ):
            await until_status(client, proxy.url + "/readyz", 200)
            await runner.cleanup()  # the backend goes away
            await until_status(client, proxy.url + "/readyz", 503)
            runner = web.AppRunner(gateway_stub())  # and comes back on its port
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            await until_status(client, proxy.url + "/readyz", 200)
    finally:
        await runner.cleanup()
