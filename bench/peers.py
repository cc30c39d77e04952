"""The proxy's own cost beside the gateways users would run instead.

    make peers && python -m bench.peers [--quick]

One run, one machine, the same stub backend (`bench.stub_backend`) behind every
target, measured side by side:

* `direct`: the stub itself;
* `prism fifo`: `prism-proxy serve --policy fifo --window-ms 0` (admission without QAS);
* `prism`: the proxy's defaults (QAS `full`, 10 ms rounds, prefill pacing);
* each peer `make peers` installed (`loadgen/stack/peers_launch.py`): smg, sglang-router,
  ContextPilot, as plain pass-throughs (round robin, no retries, no circuit breaker).

What it measures, per target (non-streamed chat completions of 8 tokens unless said;
every request's user message is new, a counter, as real users' are):

1. added latency: `--sequential` requests one at a time, the targets interleaved
   request by request; P50 and P99, and P50 − direct's P50;
2. burst: `--burst` requests from 64 concurrent clients; requests/s, and the target's
   CPU seconds per 1,000 requests (user + system of its process, from /proc) and its
   RSS after the burst (1 / CPU s per request: requests/s per core);
3. streams: 64 and 256 concurrent streamed chat completions of 256 tokens, closed loop
   for `--stream-rounds` answers per client; content chunks received per second.
   Against a stub paced like a GPU's decode loop (`--step-ms`, one token per stream
   per step: 64 streams at 10 ms = 6,400 chunks/s), and unpaced (the relay's ceiling;
   with chunks relayed per CPU second of the target: chunks/s per core).

The stub streams cumulative `/generate` chunks, SGLang's default; `--incremental` has it
stream deltas, as the deployment's SGLang does (`--incremental-streaming-output`).

Every target shares the 2 cores with the stub and this client. No thresholds: it
prints the table and the ratios the issue names (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.stub_backend import run_stub
from loadgen.stack.peers_launch import installed_peers, start_peer
from loadgen.stack.processes import ServerProcess, proxy_args, run_server

MODEL = "stub-model"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Target:
    """One line of the table: a name and how to start it in front of a backend."""

    name: str
    start: Callable[[str, Path], contextlib.AbstractContextManager[ServerProcess | None]]
    results: dict[str, float] = field(default_factory=dict)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES


# --- targets -------------------------------------------------------------------------------
@contextlib.contextmanager
def _direct(backend: str, log_dir: Path) -> Iterator[None]:
    yield None


def _prism(**settings: Any) -> Callable[[str, Path], contextlib.AbstractContextManager]:
    @contextlib.contextmanager
    def start(backend: str, log_dir: Path) -> Iterator[ServerProcess]:
        # the stub engine cannot tokenize: the tokenizer is named (used unverified)
        defaults = {"backend": backend, "tokenizer": "builtin", "log_level": "warning"}
        args = proxy_args({**defaults, **settings})
        with run_server("prism_proxy", args, log_dir=log_dir, name="prism") as server:
            yield server

    return start


def _peer(peer) -> Callable[[str, Path], contextlib.AbstractContextManager]:
    @contextlib.contextmanager
    def start(backend: str, log_dir: Path) -> Iterator[ServerProcess]:
        with start_peer(peer, backend, client_model=MODEL, log_dir=log_dir) as server:
            yield server

    return start


def targets() -> list[Target]:
    lines = [
        Target("direct", _direct),
        Target("prism fifo", _prism(policy="fifo", window_ms=0)),
        Target("prism", _prism()),
    ]
    lines += [Target(peer.label, _peer(peer)) for peer in installed_peers()]
    return lines


# --- load ----------------------------------------------------------------------------------
_SENT = itertools.count()


def chat_body(**fields: Any) -> dict[str, Any]:
    """A short chat whose user message is new every time, as real users' are: no cache
    (the proxy's tokenized pieces, a peer's) answers a repeated prompt here."""
    message = {"role": "user", "content": f"Say something short. ({next(_SENT)})"}
    return {"model": MODEL, "messages": [message], **fields}


async def _chat(session: aiohttp.ClientSession, url: str, max_tokens: int) -> None:
    async with session.post(
        url + "/v1/chat/completions", json=chat_body(max_tokens=max_tokens)
    ) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")


async def _stream(session: aiohttp.ClientSession, url: str, max_tokens: int) -> int:
    body = chat_body(max_tokens=max_tokens, stream=True)
    events = 0
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}")
        async for line in response.content:
            if line.startswith(b"data: {"):
                events += 1
    return events


async def sequential(urls: dict[str, str], requests: int) -> dict[str, list[float]]:
    """Latency of one request at a time, the targets interleaved request by request."""
    samples: dict[str, list[float]] = {name: [] for name in urls}
    names = list(urls)
    async with aiohttp.ClientSession() as session:
        for name in names:  # warm connections, caches and tokenizers
            for _ in range(20):
                await _chat(session, urls[name], 8)
        for i in range(requests):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                started = time.perf_counter()
                await _chat(session, urls[name], 8)
                samples[name].append(time.perf_counter() - started)
    return samples


async def burst(url: str, requests: int, concurrency: int) -> float:
    """Requests/s of `requests` non-streamed chats from `concurrency` clients."""
    left = requests
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await _chat(session, url, 8)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return requests / (time.perf_counter() - started)


async def streams(url: str, concurrency: int, rounds: int, max_tokens: int) -> float:
    """Chunks/s received by `concurrency` clients streaming `rounds` answers each."""
    totals: list[int] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client() -> None:
            for _ in range(rounds):
                totals.append(await _stream(session, url, max_tokens))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return sum(totals) / (time.perf_counter() - started)


# --- the run -------------------------------------------------------------------------------
@contextlib.contextmanager
def running(lines: Sequence[Target], backend: str, log_dir: Path) -> Iterator[dict]:
    """Every target started in front of `backend`: name → (url, process or None)."""
    with contextlib.ExitStack() as stack:
        started = {}
        for line in lines:
            server = stack.enter_context(line.start(backend, log_dir))
            started[line.name] = (backend if server is None else server.url, server)
        yield started


def _latency_burst_unpaced(lines: list[Target], started: dict, args) -> None:
    urls = {name: url for name, (url, _) in started.items()}
    print(f"targets: {', '.join(urls)}", flush=True)
    samples = asyncio.run(sequential(urls, args.sequential))
    for line in lines:
        values = sorted(samples[line.name])
        line.results["p50_ms"] = statistics.median(values) * 1e3
        line.results["p99_ms"] = values[min(len(values) - 1, int(0.99 * len(values)))] * 1e3
    for line in lines:
        url, server = started[line.name]
        asyncio.run(burst(url, 200, args.concurrency))  # warm
        cpu_before = cpu_seconds(server.process.pid) if server else 0.0
        line.results["burst_rps"] = rate = asyncio.run(burst(url, args.burst, args.concurrency))
        if server is not None:
            cpu = cpu_seconds(server.process.pid) - cpu_before
            line.results["cpu_s_per_1k"] = cpu / args.burst * 1000
            line.results["rss_mb"] = rss_bytes(server.process.pid) / 2**20
        print(f"  burst {line.name}: {rate:,.0f} req/s", flush=True)
    for line in lines:
        url, server = started[line.name]
        cpu_before = cpu_seconds(server.process.pid) if server else 0.0
        started_at = time.perf_counter()
        rate = asyncio.run(streams(url, 64, args.stream_rounds, 256))
        line.results["chunks_64_unpaced"] = rate
        if server is not None:
            chunks = rate * (time.perf_counter() - started_at)
            cpu = cpu_seconds(server.process.pid) - cpu_before
            line.results["chunks_per_cpu_s"] = chunks / cpu if cpu > 0 else 0.0
        print(f"  64 unpaced streams {line.name}: {rate:,.0f} chunks/s", flush=True)


def _paced(lines: list[Target], started: dict, args) -> None:
    for concurrency in (64, 256):
        for line in lines:
            url, _ = started[line.name]
            rate = asyncio.run(streams(url, concurrency, args.stream_rounds, 256))
            line.results[f"chunks_{concurrency}"] = rate
            print(f"  {concurrency} paced streams {line.name}: {rate:,.0f} chunks/s", flush=True)


def measure(args: argparse.Namespace, log_dir: Path) -> list[Target]:
    lines = targets()
    if args.only:
        wanted = [name.strip() for name in args.only.split(",")]
        lines = [line for line in lines if line.name == "direct" or line.name in wanted]
    with (
        run_stub(log_dir, incremental=args.incremental) as plain,
        running(lines, plain.url, log_dir) as started,
    ):
        _latency_burst_unpaced(lines, started, args)
    with (
        run_stub(
            log_dir, incremental=args.incremental, step_ms=args.step_ms, name="paced"
        ) as paced,
        running(lines, paced.url, log_dir) as started,
    ):
        _paced(lines, started, args)
    return lines


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def report(lines: list[Target], args: argparse.Namespace) -> str:
    direct = lines[0].results
    rows = [
        "| target | P50 ms | added P50 ms | P99 ms | burst req/s | CPU s / 1k req | RSS MB "
        "| chunks/s 64 paced | 256 paced | 64 unpaced | chunks / CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for line in lines:
        r = line.results
        added = r["p50_ms"] - direct["p50_ms"]
        rows.append(
            f"| {line.name} | {r['p50_ms']:.2f} | {'' if line is lines[0] else f'{added:+.2f}'} "
            f"| {r['p99_ms']:.2f} | {r['burst_rps']:,.0f} | {_fmt(r.get('cpu_s_per_1k'), '.2f')} "
            f"| {_fmt(r.get('rss_mb'), '.0f')} | {r['chunks_64']:,.0f} | {r['chunks_256']:,.0f} "
            f"| {r['chunks_64_unpaced']:,.0f} | {_fmt(r.get('chunks_per_cpu_s'), ',.0f')} |"
        )
    by_name = {line.name: line.results for line in lines}
    out = ["\n".join(rows), ""]
    smg = next((r for name, r in by_name.items() if name.startswith("smg")), None)
    fifo_lines = [name for name in ("prism fifo", "prism") if name in by_name]
    for name in fifo_lines:
        r = by_name[name]
        ratios = ", ".join(
            f"{label} {r[key] / direct[key]:.2f}x"
            for label, key in (
                ("64 paced", "chunks_64"),
                ("256 paced", "chunks_256"),
                ("64 unpaced", "chunks_64_unpaced"),
            )
        )
        out.append(f"{name}: streamed chunks/s vs direct: {ratios}")
        if smg is not None:
            added, smg_added = r["p50_ms"] - direct["p50_ms"], smg["p50_ms"] - direct["p50_ms"]
            out.append(
                f"{name} vs smg: added P50 {added:+.2f} ms vs {smg_added:+.2f} ms; "
                f"burst {r['burst_rps'] / smg['burst_rps']:.2f}x"
            )
    out.append(
        f"(sequential {args.sequential} per target, burst {args.burst} at {args.concurrency} "
        f"concurrent, 256-token streams x {args.stream_rounds} per client, "
        f"step {args.step_ms:g} ms, {'incremental' if args.incremental else 'cumulative'} "
        "backend chunks)"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=300)
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--stream-rounds", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument(
        "--incremental",
        action="store_true",
        help="the stub streams deltas (SGLang's --incremental-streaming-output), not cumulative",
    )
    parser.add_argument(
        "--only", default="", help="comma-separated target names (direct is always run)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.sequential, args.burst, args.stream_rounds = 30, 300, 1
    with tempfile.TemporaryDirectory(prefix="prism-peers-") as tmp:
        lines = measure(args, Path(tmp))
    print()
    print(report(lines, args))


if __name__ == "__main__":
    main()
