"""A largest-allowed prompt against the proxy: how long `/health` waits, and RSS.

    python -m bench.large_prompt [--chars 1000000] [--requests 3]

Starts the simulated engine and `prism-proxy serve` (real subprocesses), then sends
`--requests` unhinted chat requests whose user message has `--chars` characters (the
proxy's default `max_prompt_chars`), one after the other, while a second client asks
`/health` every 5 ms. Prints, for the idle baseline and during the large requests, the
P50 and the largest `/health` latency, the large requests' own latency, and the proxy's
RSS (from /proc) before, right after each request (the largest) and 2 s after the last
one. One request over the limit shows the 413. No thresholds: it prints numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.proxy_overhead import percentile
from loadgen.stack.processes import ServerProcess, engine_args, proxy_args, run_server

WORDS = [
    "the",
    "river",
    "runs",
    "past",
    "the",
    "old",
    "mill",
    "and",
    "the",
    "children",
    "count",
    "the",
    "boats",
]


def prompt_text(chars: int) -> str:
    """English-like text of exactly `chars` characters (a realistic tokenization load)."""
    out: list[str] = []
    size = 0
    i = 0
    while size < chars:
        word = WORDS[i % len(WORDS)] + f"{i % 97} "
        out.append(word)
        size += len(word)
        i += 1
    return "".join(out)[:chars]


def rss_mb(server: ServerProcess) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def health_latencies(
    session: aiohttp.ClientSession, url: str, stop: asyncio.Event
) -> list[float]:
    samples = []
    while not stop.is_set():
        started = time.perf_counter()
        async with session.get(url + "/health") as response:
            await response.read()
        samples.append(time.perf_counter() - started)
        await asyncio.sleep(0.005)
    return samples


async def measure(proxy: ServerProcess, chars: int, requests: int) -> None:
    text = prompt_text(chars)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 1,
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        stop = asyncio.Event()
        idle = asyncio.create_task(health_latencies(session, proxy.url, stop))
        await asyncio.sleep(1.0)
        stop.set()
        baseline = await idle
        rss_before = rss_mb(proxy)

        stop = asyncio.Event()
        during = asyncio.create_task(health_latencies(session, proxy.url, stop))
        durations, peak = [], rss_before
        for _ in range(requests):
            started = time.perf_counter()
            async with session.post(proxy.url + "/v1/chat/completions", json=body) as response:
                await response.read()
                status = response.status
            durations.append(time.perf_counter() - started)
            peak = max(peak, rss_mb(proxy))
            if status != 200:
                raise RuntimeError(f"large request: HTTP {status}")
        stop.set()
        busy = await during
        await asyncio.sleep(2.0)
        rss_after = rss_mb(proxy)

        over = {**body, "messages": [{"role": "user", "content": text + "x"}]}
        async with session.post(proxy.url + "/v1/chat/completions", json=over) as response:
            over_status = response.status

    def ms(values: list[float], q: float) -> str:
        return f"{1000 * percentile(values, q):.1f} ms"

    print(f"prompt: {chars:,} characters, {requests} requests, one at a time")
    probes = len(baseline)
    print(f"/health idle:   P50 {ms(baseline, 50)}, max {ms(baseline, 100)} ({probes} probes)")
    print(f"/health during: P50 {ms(busy, 50)}, max {ms(busy, 100)} ({len(busy)} probes)")
    print(f"large request latency: {', '.join(f'{d:.2f} s' for d in durations)}")
    print(
        f"proxy RSS: {rss_before:.0f} MB before, at most {peak:.0f} MB right after a"
        f" request, {rss_after:.0f} MB 2 s after the last"
    )
    print(f"one character over the limit: HTTP {over_status}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chars", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=3)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="prism-bench-"))
    sim_args = engine_args({"speed": 20, "log_level": "warning"})
    with run_server("prism_sim", sim_args, log_dir=logs, name="sim") as sim:
        settings = {"backend": sim.url, "log_level": "warning", "max_prompt_chars": args.chars}
        with run_server("prism_proxy", proxy_args(settings), log_dir=logs, name="proxy") as proxy:
            asyncio.run(measure(proxy, args.chars, args.requests))


if __name__ == "__main__":
    main()
