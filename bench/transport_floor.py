"""What the transport alone costs a Python pass-through proxy.

    python -m bench.transport_floor [--sequential 300] [--burst 3000]

Three proxies that do nothing but forward a chat completion's body to the stub backend
(`bench.stub_backend`) and its answer back, each in its own process on uvloop:

* `aiohttp/aiohttp`: aiohttp's server, aiohttp's client (the proxy's transport before
 );
* `aiohttp/lean`: aiohttp's server, the proxy's own HTTP/1.1 pool
  (`prism_proxy.backend.http1`, the proxy's transport now);
* `raw/lean`: an `asyncio.Protocol` server parsing with httptools, and the same pool.

Measured as `bench.peers` measures (the same client functions, one run, side by side
with `direct`): P50 of sequential requests and what it adds to direct's, burst
requests/s at 64 concurrent clients, and the proxy's CPU per request (from /proc). The
gap between a line and the proxy's own in the peer table is the proxy's work; the gap
between the lines is the price of the framework.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

import httptools
import uvloop
from aiohttp import ClientSession, TCPConnector, web

from bench.peers import burst, cpu_seconds, sequential
from bench.stub_backend import run_stub
from loadgen.stack.processes import run_server
from prism_proxy.backend.http1 import Http1Pool

PATH = "/v1/chat/completions"
KINDS = ("aiohttp/aiohttp", "aiohttp/lean", "raw/lean")


def _pool(backend: str) -> Http1Pool:
    return Http1Pool(backend, connect_timeout_s=5.0, read_timeout_s=30.0)


async def _aiohttp_server(backend: str, port: int, lean: bool) -> None:
    pool = _pool(backend) if lean else None
    session = None if lean else ClientSession(connector=TCPConnector(limit=0))

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        if pool is not None:
            async with pool.post(PATH, body) as answer:
                data = await answer.read()
        else:
            assert session is not None
            headers = {"Content-Type": "application/json"}
            async with session.post(backend + PATH, data=body, headers=headers) as response:
                data = await response.read()
        return web.Response(body=data, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post(PATH, forward)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


class _RawServer(asyncio.Protocol):
    """HTTP/1.1 keep-alive server: every POST is forwarded, every GET answers ok."""

    def __init__(self, pool: Http1Pool) -> None:
        self.pool = pool
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body = b"".join(self.body), []
        if self.parser.get_method() == b"GET":
            self._answer(b"ok", b"text/plain")
        else:
            asyncio.get_running_loop().create_task(self._forward(body))

    async def _forward(self, body: bytes) -> None:
        async with self.pool.post(PATH, body) as answer:
            data = await answer.read()
        self._answer(data, b"application/json")

    def _answer(self, data: bytes, content_type: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (content_type, len(data), data)
        )


async def _raw_server(backend: str, port: int) -> None:
    pool = _pool(backend)
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: _RawServer(pool), "127.0.0.1", port)
    await asyncio.Event().wait()


def serve(argv: list[str]) -> None:
    """`python -m bench.transport_floor serve KIND BACKEND --port P` (one proxy)."""
    kind, backend, port = argv[0], argv[1], int(argv[3])
    if kind == "raw/lean":
        uvloop.run(_raw_server(backend, port))
    else:
        uvloop.run(_aiohttp_server(backend, port, lean=kind == "aiohttp/lean"))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        serve(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=300)
    parser.add_argument("--burst", type=int, default=3000)
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="prism-floor-") as tmp,
        run_stub(Path(tmp)) as stub,
        contextlib.ExitStack() as stack,
    ):
        servers = {
            kind: stack.enter_context(
                run_server(
                    "bench.transport_floor", ["serve", kind, stub.url],
                    log_dir=Path(tmp), name=kind.replace("/", "-"),
                )
            )
            for kind in KINDS
        }  # fmt: skip
        urls = {"direct": stub.url, **{kind: server.url for kind, server in servers.items()}}
        samples = asyncio.run(sequential(urls, args.sequential))
        direct = statistics.median(samples["direct"]) * 1e3
        print("| transport | P50 ms | added P50 ms | burst req/s | CPU ms / request |")
        print("|---|---|---|---|---|")
        for name, url in urls.items():
            asyncio.run(burst(url, 300, 64))  # warm
            server = servers.get(name)
            before = cpu_seconds(server.process.pid) if server else 0.0
            rate = asyncio.run(burst(url, args.burst, 64))
            cpu = "n/a"
            if server is not None:
                cpu = f"{(cpu_seconds(server.process.pid) - before) / args.burst * 1e3:.3f}"
            p50 = statistics.median(samples[name]) * 1e3
            added = "" if name == "direct" else f"{p50 - direct:+.2f}"
            print(f"| {name} | {p50:.2f} | {added} | {rate:,.0f} | {cpu} |")
    print(f"({args.sequential} sequential per line, {args.burst} at 64 concurrent)")


if __name__ == "__main__":
    main()
