"""Where one proxied request's time goes (the profile behind docs/performance.md).

    python -m bench.proxy_stages [--requests 400]

The proxy (`--policy fifo --window-ms 0`) runs in this process in front of the stub
backend (`bench.stub_backend`), both on loopback; a client in a separate process sends
non-streamed chat completions of 8 tokens one at a time. Timestamps taken inside the
proxy split each request into: handler start → admission submit, submit → release,
handler start → the backend call, the backend call → its first chunk, the whole backend
stream, and the token path in all. The client's median is the end-to-end latency; what
the token path does not cover is the client → proxy hop, body parsing, validation and
tokenization, and writing the answer. Medians over the requests after the first 50.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import time
from pathlib import Path

import uvloop

import prism_proxy.admission.driver as admission
import prism_proxy.backend.client as backend_client
import prism_proxy.edge.chat as chat_endpoint
from bench.stub_backend import create_app
from prism_proxy.app import start_proxy
from prism_proxy.config import ProxyConfig

CLIENT = """
import asyncio, statistics, sys, time, aiohttp
async def main(url, n):
    async with aiohttp.ClientSession() as session:
        samples = []
        for i in range(n):  # a new user message each time, as in bench.peers
            message = {"role": "user", "content": f"Say something short. ({i})"}
            body = {"model": "m", "messages": [message], "max_tokens": 8}
            started = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                await response.read()
            samples.append(time.perf_counter() - started)
    print(statistics.median(samples[50:]) * 1e3)
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def instrument(stages: dict[str, list[float]]) -> None:
    """Wrap the token path, the backend stream and admission with timestamps."""
    current: dict[str, float] = {}
    token_path = chat_endpoint.token_path
    generate_batches = backend_client.BackendClient.generate_batches
    submit = admission.AdmissionController.admit  # what the edge's `Admitted` calls

    async def timed_token_path(*args, **kwargs):
        current["start"] = started = time.perf_counter()
        response = await token_path(*args, **kwargs)
        stages["token path, in all"].append(time.perf_counter() - started)
        return response

    async def timed_batches(self, *args, **kwargs):
        started = time.perf_counter()
        stages["handler start -> backend call"].append(started - current["start"])
        first = True
        async for batch in generate_batches(self, *args, **kwargs):
            if first:
                stages["backend call -> first chunk"].append(time.perf_counter() - started)
                first = False
            yield batch
        stages["backend stream, whole"].append(time.perf_counter() - started)

    def timed_submit(self, request):
        stages["handler start -> submit"].append(time.perf_counter() - current["start"])
        at = time.perf_counter()
        future = submit(self, request)
        if future.done():  # an idle proxy released it in the same call
            stages["submit -> release"].append(time.perf_counter() - at)
        else:
            future.add_done_callback(
                lambda _: stages["submit -> release"].append(time.perf_counter() - at)
            )
        return future

    chat_endpoint.token_path = timed_token_path
    backend_client.BackendClient.generate_batches = timed_batches
    admission.AdmissionController.admit = timed_submit


async def run(requests: int) -> None:
    from aiohttp import web

    stages: dict[str, list[float]] = collections.defaultdict(list)
    instrument(stages)
    runner = web.AppRunner(create_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    config = ProxyConfig(
        backend=f"http://{host}:{port}", port=0, policy="fifo", window_ms=0, health_interval_s=0,
        tokenizer="builtin",  # the stub cannot tokenize: named, used unverified
    )  # fmt: skip
    proxy = await start_proxy(config)
    try:
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, proxy.url, str(requests),
            stdout=asyncio.subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent,
        )  # fmt: skip
        out, _ = await client.communicate()
    finally:
        await proxy.stop()
        await runner.cleanup()
    print(f"{'client, end to end':32s} {float(out):.3f} ms")
    for name, samples in stages.items():
        print(f"{name:32s} {statistics.median(samples[50:]) * 1e3:.3f} ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args(argv)
    uvloop.run(run(args.requests))


if __name__ == "__main__":
    main()
