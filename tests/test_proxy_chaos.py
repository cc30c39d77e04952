"""Chaos: many clients, some leaving at random, while the backend is killed
and restarted under them. Every request ends exactly once (a complete answer, an error
status, a stream closed with an error event, or the client's own departure), nothing
hangs, and the proxy's queue, in-flight and pending-prefill counts return to 0."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter

import aiohttp
import pytest
from proxy_support import eventually, running_proxy

from loadgen.stack.processes import free_port, spawn_server, wait_healthy
from prism_proxy.edge.gateway import GATEWAY

REQUESTS = 240
SIM_ARGS = ["--speed", "10", "--log-level", "warning"]
STARTUP_S = 60.0  # the engine's start-up bound (`wait_healthy`), before and mid-test
HANG_S = 120.0  # no request takes longer, once the engine it waits for is up


async def one_request(
    http: aiohttp.ClientSession, url: str, rng: random.Random, number: int
) -> str:
    """Send one request (chat or native, streamed or not); returns how it ended."""
    stream = rng.random() < 0.5
    if rng.random() < 0.5:
        path = "/v1/chat/completions"
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": f"question {number}"}],
            "max_tokens": rng.randint(1, 200),
            "stream": stream,
        }
    else:
        path = "/generate"
        body = {
            "text": f"prompt {number}",
            "sampling_params": {"max_new_tokens": rng.randint(1, 200)},
            "stream": stream,
        }
    async with http.post(url + path, json=body) as response:
        if response.status != 200:
            await response.read()
            return f"HTTP {response.status}"
        if not stream:
            await response.json()
            return "complete"
        last = ""
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                last = line[len("data: ") :]
                if '"error"' in last:
                    assert json.loads(last)["error"]["code"] in (502, 503)
                    return "stream error event"
        assert last == "[DONE]"
        return "complete"


async def client(http: aiohttp.ClientSession, url: str, rng: random.Random, number: int) -> str:
    """One client; a fifth of them leave after a random moment."""
    task = asyncio.create_task(one_request(http, url, rng, number))
    if rng.random() < 0.2:
        await asyncio.sleep(rng.uniform(0.0, 0.2))
        task.cancel()
    try:
        # a request may be waiting for the engine's restart: its start-up is not a hang
        return await asyncio.wait_for(task, timeout=STARTUP_S + HANG_S)
    except asyncio.CancelledError:
        return "client left"


@pytest.mark.slow
async def test_aborts_and_a_backend_crash_lose_nothing(tmp_path) -> None:
    rng = random.Random(12)
    port = free_port()
    sim = spawn_server("prism_sim", SIM_ARGS, port=port, log_dir=tmp_path, name="sim-1")
    wait_healthy(sim.url, sim.process, STARTUP_S, "/health")
    try:
        async with (
            running_proxy(sim.url, health_interval_s=0.2, prefill_batch=4) as proxy,
            aiohttp.ClientSession() as http,
        ):
            tasks = []
            for number in range(REQUESTS):
                tasks.append(asyncio.create_task(client(http, proxy.url, rng, number)))
                await asyncio.sleep(rng.expovariate(200.0))
                if number == REQUESTS // 3:  # mid-traffic: the engine dies
                    sim.process.kill()
                    sim.process.wait()
                if number == REQUESTS // 2:  # ... and comes back at the same address
                    sim = spawn_server(
                        "prism_sim", SIM_ARGS, port=port, log_dir=tmp_path, name="sim-2"
                    )
                    await asyncio.to_thread(
                        wait_healthy, sim.url, sim.process, STARTUP_S, "/health"
                    )
            outcomes = Counter(await asyncio.gather(*tasks))
            admission = proxy.app[GATEWAY].admission
            await eventually(
                lambda: (
                    (admission.queue_depth, admission.inflight, admission.pending_prefill)
                    == (0, 0, 0)
                )
            )
    finally:
        sim.stop()
    print(f"\nchaos: {dict(outcomes)}")
    assert sum(outcomes.values()) == REQUESTS  # every request ended, once
    assert set(outcomes) <= {"complete", "client left", "stream error event", "HTTP 502",
                             "HTTP 503"}, outcomes  # fmt: skip
    assert outcomes["complete"] > REQUESTS // 3  # before the crash and after the restart
    assert outcomes["client left"] > 0
    assert outcomes["HTTP 502"] + outcomes["HTTP 503"] + outcomes["stream error event"] > 0
