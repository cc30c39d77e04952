"""Shared fixtures of the proxy's integration tests: the simulated engine as a real
subprocess, the proxy in-process on a loopback port (so tests can also read its state)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx
import pytest

from loadgen.processes import ServerProcess, run_server
from prism_proxy.app import RunningProxy, start_proxy
from prism_proxy.config import ProxyConfig

SIM_ARGS = ["--speed", "50", "--log-level", "warning"]


def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Fixture body: `sim = pytest.fixture(scope="module")(sim_server)` in a test module."""
    with run_server("prism_sim", SIM_ARGS, log_dir=tmp_path_factory.mktemp("sim")) as server:
        yield server


ProxyFactory = Callable[..., Awaitable[RunningProxy]]


async def proxy_factory_fixture(sim: ServerProcess) -> AsyncIterator[ProxyFactory]:
    """Fixture body: `proxy_factory = pytest.fixture(proxy_factory_fixture)`."""
    started: list[RunningProxy] = []

    async def start(**overrides: object) -> RunningProxy:
        settings: dict[str, object] = {
            "backend": sim.url,
            "port": 0,
            "health_interval_s": 0,
            "shutdown_timeout_s": 5.0,
        }
        settings.update(overrides)
        proxy = await start_proxy(ProxyConfig(**settings))  # type: ignore[arg-type]
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        await proxy.stop()


def sim_metric(sim: ServerProcess, name: str) -> float:
    """A sample of the simulated engine's Prometheus text (sum over label sets)."""
    text = httpx.get(sim.url + "/metrics", timeout=5.0).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


async def eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll until `predicate()` holds (a liveness wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.01)
