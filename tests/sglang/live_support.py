"""Real, unmodified SGLang 0.5.23 servers on this CPU for the end-to-end tests.

Each server is `python -m sglang_cpu.serve` (the tiny model, the DART
plugin, the control RPC), started once per test session, all at once so their ~25 s
start-ups overlap, and stopped at the end:

* `ample`: 16,384 KV tokens, DART: the proxy tests and the ample differential run;
* `tight_dart` / `tight_lru`: 2,048 KV tokens under DART and under the plugin's `lru`
  order: eviction order under pressure. `tight_lru` is killed by the last test that
  uses it (a backend dying mid-stream);
* `stock`: 2,048 KV tokens, SGLang's own radix cache (no plugin selected), streaming
  incremental chunks (`--incremental-streaming-output`, as docker-compose.yml deploys
  SGLang): the tight differential run against prism-sim (non-streamed), and the proxy
  relaying incremental streams.
* `hostile`: 16,384 KV tokens, DART, as deployed: SGLang's `--api-key` and
  `--admin-api-key` set (from the environment, as docker-compose.yml sets them), hostile
  input through the proxy (test_live_hostile.py) and the engine's key
  (test_live_engine_key.py), on a server of its own so that a body the proxy let through
  by mistake fails those tests and no others.

`PRISM_LIVE_SERVERS=hostile,ample` starts only the servers named (a test needing
another then fails with a KeyError): for running one test file on a busy machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from proxy_support import CONNECT_TIMEOUT_S, metric_total

from loadgen.stack.processes import ServerProcess, free_port, spawn_server, wait_healthy
from prism_proxy.app import RunningProxy, start_proxy
from prism_proxy.config import ProxyConfig
from sglang_cpu.model import ensure_tiny_model

# Five servers start at once on two cores, beside whatever else runs: about 2 minutes
# at a load of 5-12. A start-up bound (the fixture's own), outside every test's budget.
STARTUP_TIMEOUT_S = 600.0
TIGHT_TOKENS = 2048
AMPLE_TOKENS = 16384


@dataclass
class LiveServer:
    """One running SGLang server and its DART control RPC."""

    name: str
    server: ServerProcess
    control_url: str
    token: str
    max_total_tokens: int
    eviction: str
    # SGLang's `--api-key` and `--admin-api-key` (None: an open engine).
    api_key: str | None = None
    admin_api_key: str | None = None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def headers(self) -> dict[str, str]:
        """What a direct call of the engine's API carries: its key, if it has one."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def admin_headers(self) -> dict[str, str]:
        """What an admin call (`/flush_cache`) carries: the admin key, else the API key."""
        key = self.admin_api_key or self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def control(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        url = self.control_url + path
        return httpx.request(method, url, headers=headers, timeout=10.0, **kwargs)

    def stats(self) -> dict[str, Any]:
        return self.control("GET", "/prism/stats").json()

    def fresh(self) -> None:
        """An empty tree and no priority table (requests must be idle)."""
        flushed = httpx.post(self.url + "/flush_cache", headers=self.admin_headers, timeout=30.0)
        assert flushed.status_code == 200, flushed.text
        if self.eviction != "stock":
            assert self.control("POST", "/prism/reset").status_code == 200

    def generate(self, input_ids: list[int], max_new_tokens: int = 1, **extra: Any) -> dict:
        body = {
            "input_ids": input_ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True},
            **extra,
        }
        response = httpx.post(
            self.url + "/generate", json=body, headers=self.headers, timeout=120.0
        )
        assert response.status_code == 200, response.text
        return response.json()

    def metric(self, name: str) -> float:
        """Sum of a sample over its label sets on SGLang's `/metrics` (0 when absent)."""
        return metric_total(httpx.get(self.url + "/metrics", timeout=10.0).text, name)


SPECS = {
    "ample": (AMPLE_TOKENS, "dart"),
    "tight_dart": (TIGHT_TOKENS, "dart"),
    "tight_lru": (TIGHT_TOKENS, "lru"),
    "stock": (TIGHT_TOKENS, "stock"),
    "hostile": (AMPLE_TOKENS, "dart"),
}
EXTRA_ARGS = {
    "stock": ["--sglang-arg=--incremental-streaming-output"],
    "hostile": ["--sglang-arg=--incremental-streaming-output"],
}
# Servers started with SGLang's keys, given in the environment (never on a command line).
WITH_KEYS = ("hostile",)


def wanted(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The servers of `SPECS` to start: all, or those PRISM_LIVE_SERVERS names."""
    names = [n.strip() for n in environ.get("PRISM_LIVE_SERVERS", "").split(",") if n.strip()]
    unknown = set(names) - set(SPECS)
    if unknown:
        raise ValueError(f"PRISM_LIVE_SERVERS: unknown {sorted(unknown)}; known {list(SPECS)}")
    return names or list(SPECS)


@contextlib.contextmanager
def live_servers(log_dir: Path) -> Iterator[dict[str, LiveServer]]:
    """Start every server of `SPECS` at once, wait for all, stop all at the end."""
    ensure_tiny_model()  # once, before three processes would race to build it
    servers: dict[str, LiveServer] = {}
    try:
        for name in wanted():
            tokens, eviction = SPECS[name]
            token = secrets.token_hex(8)
            control_port = free_port()
            args = ["--max-total-tokens", str(tokens), "--eviction", eviction]
            env = {"PRISM_CONTROL_TOKEN": token}
            if eviction != "stock":
                args += ["--control-port", str(control_port)]
            keys: tuple[str | None, str | None] = (None, None)
            if name in WITH_KEYS:
                keys = (secrets.token_hex(12), secrets.token_hex(12))
                env |= {"PRISM_ENGINE_API_KEY": keys[0], "PRISM_ENGINE_ADMIN_API_KEY": keys[1]}
            args += EXTRA_ARGS.get(name, [])
            process = spawn_server(
                "sglang_cpu.serve", args, log_dir=log_dir, name=f"sglang-{name}", env=env
            )
            servers[name] = LiveServer(
                name, process, f"http://127.0.0.1:{control_port}", token, tokens, eviction, *keys
            )
        for live in servers.values():
            try:
                wait_healthy(live.url, live.server.process, STARTUP_TIMEOUT_S, "/health")
            except BaseException:
                raise RuntimeError(
                    f"SGLang {live.name} did not start:\n{live.server.log_text()[-4000:]}"
                ) from None
        yield servers
    finally:
        for live in servers.values():
            live.server.stop(timeout_s=30.0)


async def proxy_for(live: LiveServer, **overrides: Any) -> RunningProxy:
    """An in-process proxy in front of `live`: the tiny model's tokenizer directory
    (the real loading path), prism with DART pushes to the server's control RPC."""
    settings: dict[str, Any] = {
        "backend": live.url,
        "port": 0,
        "tokenizer": str(ensure_tiny_model()),
        "control_url": live.control_url,
        "control_token": live.token,
        "engine_api_key": live.api_key,
        "health_interval_s": 0,
        "ready_interval_s": 0,  # no readiness probes either
        "shutdown_timeout_s": 5.0,
        "connect_timeout_s": CONNECT_TIMEOUT_S,  # proxy_support: the test's loop is shared
        **overrides,
    }
    return await start_proxy(ProxyConfig(**settings))


async def eventually(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll until `predicate()` holds (a liveness wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.02)
