"""Shared fixtures of the proxy's integration tests: the simulated engine as a real
subprocess, the proxy in-process on a loopback port (so tests can also read its state)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
from aiohttp import web

from loadgen.stack.processes import ServerProcess, free_port, run_server
from prism_proxy.app import RunningProxy, start_proxy
from prism_proxy.config import ProxyConfig

SIM_ARGS = ["--speed", "50", "--log-level", "warning"]


def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Fixture body: `sim = pytest.fixture(scope="module")(sim_server)` in a test module."""
    with run_server("prism_sim", SIM_ARGS, log_dir=tmp_path_factory.mktemp("sim")) as server:
        yield server


ProxyFactory = Callable[..., Awaitable[RunningProxy]]


# An in-process proxy shares the test's event loop with the test's clients (a burst of
# 2,000 of them): on a busy machine that loop can take seconds to get round to a
# connection that is already made, and the product's 5 s connect limit then fires for
# nothing the backend did. A liveness bound here, not a setting under test.
CONNECT_TIMEOUT_S = 60.0


def proxy_config(backend: str, **overrides: object) -> ProxyConfig:
    """The tests' proxy settings: any free port, no periodic probes (health or
    readiness), a short drain, `CONNECT_TIMEOUT_S`."""
    settings: dict[str, object] = {
        "backend": backend,
        "port": 0,
        "health_interval_s": 0,
        "ready_interval_s": 0,
        "shutdown_timeout_s": 5.0,
        "connect_timeout_s": CONNECT_TIMEOUT_S,
    }
    settings.update(overrides)
    return ProxyConfig(**settings)  # type: ignore[arg-type]


async def proxy_factory_fixture(sim: ServerProcess) -> AsyncIterator[ProxyFactory]:
    """Fixture body: `proxy_factory = pytest.fixture(proxy_factory_fixture)`."""
    started: list[RunningProxy] = []

    async def start(**overrides: object) -> RunningProxy:
        proxy = await start_proxy(proxy_config(sim.url, **overrides))
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        await proxy.stop()


@contextlib.asynccontextmanager
async def loopback_app(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` (a stub backend or control RPC) on 127.0.0.1, any free port, for the
    block; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def recording_generate(
    record: Callable[[dict], None],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A stub backend's `/generate`: hands each body to `record`, then streams one chunk
    "x" that ends by length."""

    async def generate(request: web.Request) -> web.StreamResponse:
        record(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"text": "x", "meta_info": {"finish_reason": {"type": "length"}}}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
        return response

    return generate


def holding_backend(
    release: asyncio.Event, record: Callable[[dict], None] = lambda body: None
) -> web.Application:
    """A stub backend whose `/generate` hands each body to `record` on arrival, then
    holds its answer (one chunk "x", 3 prompt tokens, 1 completion token, ended by
    length) until `release` is set: requests stay in flight for as long as a test needs."""

    async def generate(request: web.Request) -> web.StreamResponse:
        record(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await release.wait()
        meta = {"prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 0,
                "finish_reason": {"type": "length"}}  # fmt: skip
        chunk = {"text": "x", "output_ids": [5], "meta_info": meta}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
        return response

    backend = web.Application()
    backend.router.add_post("/generate", generate)
    return backend


class DartSim(NamedTuple):
    """`dart_sim`'s engine, and the URL of its DART control RPC."""

    engine: ServerProcess
    control_url: str


@contextlib.contextmanager
def dart_sim(
    log_dir: Path, token: str, sim_args: Sequence[str] = ("--speed", "50")
) -> Iterator[DartSim]:
    """`prism-sim --eviction dart` with its control RPC on a free port, as a subprocess
    taking the control `token` from PRISM_CONTROL_TOKEN (as deployed); `sim_args` are
    more flags."""
    control_port = free_port()
    args = ["--eviction", "dart", "--control-port", str(control_port), *sim_args]
    env = {"PRISM_CONTROL_TOKEN": token}
    with run_server("prism_sim", args, log_dir=log_dir, env=env) as engine:
        yield DartSim(engine, f"http://127.0.0.1:{control_port}")


class DartStack(NamedTuple):
    """`dart_stack`'s servers: the proxy, its engine, and the DART control RPC the proxy
    pushes to."""

    proxy: ServerProcess
    engine: ServerProcess
    control_url: str


@contextlib.contextmanager
def dart_stack(
    log_dir: Path,
    token: str,
    proxy_args: Sequence[str] = (),
    sim_args: Sequence[str] = ("--speed", "50"),
) -> Iterator[DartStack]:
    """`dart_sim`, and `prism-proxy serve` in front of it pushing to its control RPC, a
    subprocess with the same `token` from PRISM_CONTROL_TOKEN; `proxy_args` are more
    `serve` flags."""
    with dart_sim(log_dir, token, sim_args) as (engine, control_url):
        serve = ["serve", "--backend", engine.url, "--control-url", control_url, *proxy_args]
        env = {"PRISM_CONTROL_TOKEN": token}
        with run_server("prism_proxy", serve, log_dir=log_dir, env=env) as proxy:
            yield DartStack(proxy, engine, control_url)


@contextlib.asynccontextmanager
async def running_proxy(backend: str, **overrides: object) -> AsyncIterator[RunningProxy]:
    """An in-process proxy in front of `backend` for the block (`proxy_config`)."""
    proxy = await start_proxy(proxy_config(backend, **overrides))
    try:
        yield proxy
    finally:
        await proxy.stop()


def metric_total(text: str, name: str) -> float:
    """The sample `name` of Prometheus text, summed over its label sets (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def sim_metric(sim: ServerProcess, name: str) -> float:
    """A sample of the simulated engine's `/metrics` (`metric_total`)."""
    return metric_total(httpx.get(sim.url + "/metrics", timeout=5.0).text, name)


async def eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll until `predicate()` holds (a liveness wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.01)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """`eventually` for synchronous tests (servers in other processes)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        time.sleep(0.05)


def proxy_idle(url: str) -> bool:
    """The proxy at `url` holds no request: none queued, none in flight (its `/health`).
    A client may read a stream's last byte before the proxy's handler has returned."""
    health = httpx.get(url + "/health", timeout=10.0).json()
    return health["queue_depth"] == 0 and health["inflight"] == 0
