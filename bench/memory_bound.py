"""Distinct segments uploaded through the proxy: its RSS stays within its cache bounds.

    python -m bench.memory_bound [--megabytes 1024] [--cache-mib 64]

Starts prism-sim (a KV pool too small for these prompts, so it refuses each with 400
at once, as an engine refuses prompts beyond its context) and `prism-proxy serve` as
real subprocesses. Then it sends hinted chat requests, two at a time, each with four
distinct segments of random text (~240,000 characters each, about one token per
character: the costliest text to keep) until `--megabytes` of segment text went up.
The proxy tokenizes every segment at admission (its skeleton's token lengths), keeps
the ids in its caches and forwards the request. Every cache is given `--cache-mib`
(every `*_cache_bytes` setting and the QAS view), or each keeps its default; the
capacity compared against is what `/metrics` says the caches may hold.

It prints the proxy's RSS (from /proc) after a warm-up and after the upload (each read
after one request sent alone, so nothing is in flight and the proxy has given its free
heap back), the growth against the caches' configured bytes, and the bytes `/metrics`
says the caches hold.
No thresholds: it prints numbers (tests/test_memory_bound.py asserts the bound on a
smaller upload).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import httpx

from loadgen.stack.processes import ServerProcess, engine_args, run_server
from loadgen.stack.processes import proxy_args as launch_proxy
from prism_proxy.config import ProxyConfig

SEGMENT_CHARS = 240_000
SEGMENTS_PER_REQUEST = 4
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MemoryRun:
    """RSS before and after an upload, and what the caches report."""

    uploaded_mb: float
    rss_warm_mb: float
    rss_after_mb: float
    cache_capacity_mb: float
    cache_held_mb: float
    statuses: dict[int, int]

    @property
    def growth_mb(self) -> float:
        return self.rss_after_mb - self.rss_warm_mb


def rss_mb(server: ServerProcess) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def segment_texts(seed: int) -> Iterator[str]:
    """Distinct random texts of `SEGMENT_CHARS` characters (base64 of random bytes)."""
    rng = random.Random(seed)
    while True:
        yield base64.b64encode(rng.randbytes(SEGMENT_CHARS * 3 // 4)).decode()


def request_body(texts: Iterator[str], number: int) -> dict[str, object]:
    segments = [{"id": f"u{number}-{k}", "text": next(texts)} for k in range(SEGMENTS_PER_REQUEST)]
    return {
        "model": "m",
        "max_tokens": 1,
        "messages": [
            {"role": "system", "content": f"System prompt {number}."},
            {"role": "user", "content": "Which segment mentions the river?"},
        ],
        "prism": {"segments": segments},
    }


def metric_sum(metrics_text: str, name: str) -> float:
    """The sum of `name` over its labels (every cache the proxy exports)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics_text.splitlines()
        if line.startswith(name + "{")
    )


async def upload(proxy_url: str, megabytes: float, seed: int) -> dict[int, int]:
    """Send requests of distinct segments, two at a time, until `megabytes` of segment
    text went up (at least one request); returns the count of each answer status."""
    texts = segment_texts(seed)
    per_request = SEGMENTS_PER_REQUEST * SEGMENT_CHARS
    total = int(megabytes * 1e6 // per_request) or 1
    statuses: dict[int, int] = {}
    numbers = iter(range(total))

    async def client(http: httpx.AsyncClient) -> None:
        for number in numbers:
            answer = await http.post("/v1/chat/completions", json=request_body(texts, number))
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1

    async with httpx.AsyncClient(base_url=proxy_url, timeout=120.0) as http:
        await asyncio.gather(*(client(http) for _ in range(min(2, total))))
    return statuses


# Every setting that bounds one of the proxy's caches (`--cache-mib` sets each).
CACHE_KEYS = (
    *(field.name for field in fields(ProxyConfig) if field.name.endswith("_cache_bytes")),
    "cache_view_bytes",
)


def proxy_args(sim: ServerProcess, cache_mib: int | None) -> list[str]:
    settings = {"backend": sim.url, "health_interval_s": 0, "log_level": "warning"}
    for key in CACHE_KEYS if cache_mib is not None else ():
        settings[key] = cache_mib * MIB
    return launch_proxy(settings)


def measure(megabytes: float, cache_mib: int | None, log_dir: Path, seed: int = 0) -> MemoryRun:
    sim_args = engine_args({"kv_capacity_tokens": 20000, "speed": 50, "log_level": "warning"})
    with (
        run_server("prism_sim", sim_args, log_dir=log_dir) as sim,
        run_server("prism_proxy", proxy_args(sim, cache_mib), log_dir=log_dir) as proxy,
    ):
        asyncio.run(upload(proxy.url, 8, seed + 1))  # warm-up: allocators, threads
        asyncio.run(upload(proxy.url, 0, seed + 2))  # one alone: trimmed, nothing in flight
        warm = rss_mb(proxy)
        statuses = asyncio.run(upload(proxy.url, megabytes, seed))
        asyncio.run(upload(proxy.url, 0, seed + 3))
        after = rss_mb(proxy)
        metrics = httpx.get(proxy.url + "/metrics").text
    return MemoryRun(
        uploaded_mb=megabytes,
        rss_warm_mb=warm,
        rss_after_mb=after,
        cache_capacity_mb=metric_sum(metrics, "prism:cache_capacity_bytes") / 1e6,
        cache_held_mb=metric_sum(metrics, "prism:cache_bytes") / 1e6,
        statuses=statuses,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=1024.0)
    parser.add_argument(
        "--cache-mib", type=int, default=None, help="each cache's bytes (default: the defaults)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as log_dir:
        run = measure(args.megabytes, args.cache_mib, Path(log_dir))
    print(f"uploaded {run.uploaded_mb:.0f} MB of distinct segments; answers {run.statuses}")
    print(f"proxy RSS after warm-up {run.rss_warm_mb:.0f} MB, after {run.rss_after_mb:.0f} MB")
    print(
        f"growth {run.growth_mb:.0f} MB; caches configured {run.cache_capacity_mb:.0f} MB, "
        f"holding {run.cache_held_mb:.0f} MB"
    )


if __name__ == "__main__":
    main()
