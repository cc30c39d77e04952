"""What the proxy costs, measured side by side in one run on loopback.

    python -m bench.proxy_overhead [--requests 300] [--concurrency 64] [--duration-s 5]

Starts the simulated engine and `prism-proxy serve --policy fifo` in front of it (both
real subprocesses), then measures against the same backend, direct vs. through the
proxy:

1. added latency at low load: one request at a time, `/generate` with a small answer,
   direct and proxied requests interleaved; P50/P99 end-to-end latency of each, the
   difference and the ratio;
2. sustained request rate with small streamed answers: a closed loop of `concurrency`
   clients streaming chat completions for `duration_s` seconds; requests/s of each and
   the ratio.

No thresholds: it prints numbers and ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from loadgen.stack.processes import engine_args, proxy_args, run_server


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def _one_generate(session: aiohttp.ClientSession, url: str, max_new_tokens: int) -> float:
    body = {"text": "Say something short.", "sampling_params": {"max_new_tokens": max_new_tokens}}
    started = time.perf_counter()
    async with session.post(url + "/generate", json=body) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
    return time.perf_counter() - started


async def low_load_latency(
    direct: str, proxy: str, requests: int, max_new_tokens: int
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"direct": [], "proxy": []}
    async with aiohttp.ClientSession() as session:
        for _ in range(10):  # warm up connections, caches and the tokenizer
            await _one_generate(session, direct, max_new_tokens)
            await _one_generate(session, proxy, max_new_tokens)
        for i in range(requests):
            order = [("direct", direct), ("proxy", proxy)]
            for name, url in order if i % 2 == 0 else order[::-1]:
                samples[name].append(await _one_generate(session, url, max_new_tokens))
    return samples


async def _stream_chat(session: aiohttp.ClientSession, url: str, max_tokens: int) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Say something short."}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
        async for _line in response.content:
            pass


async def sustained_rate(url: str, concurrency: int, duration_s: float, max_tokens: int) -> float:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(_stream_chat(session, url, max_tokens) for _ in range(concurrency)))
        done = 0
        deadline = time.perf_counter() + duration_s

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await _stream_chat(session, url, max_tokens)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


async def measure(args: argparse.Namespace, direct: str, proxy: str) -> None:
    samples = await low_load_latency(direct, proxy, args.requests, args.max_new_tokens)
    print(f"\nlow-load latency, /generate, {args.requests} sequential requests each")
    print(f"{'':8}{'direct':>12}{'proxy':>12}{'added':>12}{'proxy/direct':>14}")
    for label, q in (("P50", 50.0), ("P99", 99.0)):
        d, p = percentile(samples["direct"], q), percentile(samples["proxy"], q)
        print(f"{label:8}{_ms(d):>12}{_ms(p):>12}{_ms(p - d):>12}{p / d:>14.2f}")
    mean_d, mean_p = statistics.fmean(samples["direct"]), statistics.fmean(samples["proxy"])
    print(f"{'mean':8}{_ms(mean_d):>12}{_ms(mean_p):>12}{_ms(mean_p - mean_d):>12}"
          f"{mean_p / mean_d:>14.2f}")  # fmt: skip

    rate_direct = await sustained_rate(direct, args.concurrency, args.duration_s, args.max_tokens)
    rate_proxy = await sustained_rate(proxy, args.concurrency, args.duration_s, args.max_tokens)
    print(
        f"\nsustained rate, streamed chat completions of {args.max_tokens} tokens, "
        f"{args.concurrency} concurrent clients, {args.duration_s:.0f} s each"
    )
    print(f"{'direct':>12}{'proxy':>12}{'proxy/direct':>14}")
    print(f"{rate_direct:>8.1f} r/s{rate_proxy:>8.1f} r/s{rate_proxy / rate_direct:>14.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_overhead", description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="low-load requests per side")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--max-new-tokens", type=int, default=4, help="low-load answer size")
    parser.add_argument("--max-tokens", type=int, default=8, help="streamed answer size")
    parser.add_argument("--speed", type=float, default=50.0, help="simulated engine speed")
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="prism-bench-"))
    sim_args = engine_args({"speed": args.speed, "log_level": "warning"})
    with run_server("prism_sim", sim_args, log_dir=log_dir) as sim:
        serve = proxy_args({"backend": sim.url, "policy": "fifo", "log_level": "warning",
                            "max_inflight": max(64, args.concurrency)})  # fmt: skip
        with run_server("prism_proxy", serve, log_dir=log_dir) as proxy:
            print(f"backend {sim.url} (prism-sim --speed {args.speed}), proxy {proxy.url} "
                  "(--policy fifo)")  # fmt: skip
            asyncio.run(measure(args, sim.url, proxy.url))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
