"""How long costly bodies hold the proxy's event loop: `/health` latency while each is
handled.

    python -m bench.loop_stall [--repeat 3]

Starts prism-sim and `prism-proxy serve` (real subprocesses, defaults). For each body
below it sends the body `--repeat` times, one after the other, while a second client
asks `/health` every 5 ms, and prints the body's size, the proxy's answer and its
latency, and the P50 and largest `/health` latency while it was handled (with the idle
baseline first). No thresholds: it prints numbers (docs/reliability.md quotes them).

* 240,000 empty user messages (7.9 MB): the issue's body; more messages than allowed;
* 2,500 messages of 64 characters (within the limit: rendered, tokenized, served);
* 1.6 million empty JSON arrays (4.8 MB; orjson alone took 0.7 s on it);
* a hint of 100,000 segments;
* 2 million token ids (more than the prompt limit).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.large_prompt import health_latencies
from bench.proxy_overhead import percentile
from loadgen.processes import ServerProcess, run_server


def bodies() -> dict[str, tuple[str, bytes]]:
    """name -> (path, body)."""
    chat = "/v1/chat/completions"
    empty = json.dumps({"model": "m", "messages": [{"role": "user", "content": ""}] * 240_000})
    many = [{"role": "user" if i % 2 else "assistant", "content": "w" * 64} for i in range(2500)]
    segments = [{"id": f"d{i}", "text": "t"} for i in range(100_000)]
    return {
        "240k empty messages": (chat, empty.encode()),
        "2.5k messages of 64 chars": (chat, json.dumps({"model": "m", "messages": many,
                                                        "max_tokens": 1}).encode()),
        "1.6M empty arrays": (chat, b"[" + b",".join([b"[]"] * 1_600_000) + b"]"),
        "100k-segment hint": (chat, json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "q"}], "prism": {"segments": segments}}).encode()),
        "2M token ids": ("/generate", b'{"input_ids":[' + b",".join([b"7"] * 2_000_000) + b"]}"),
    }  # fmt: skip


async def measure(proxy: ServerProcess, repeat: int) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        stop = asyncio.Event()
        idle = asyncio.create_task(health_latencies(session, proxy.url, stop))
        await asyncio.sleep(1.0)
        stop.set()
        baseline = await idle
        print(f"/health idle: P50 {1000 * percentile(baseline, 50):.1f} ms, "
              f"max {1000 * max(baseline):.1f} ms ({len(baseline)} probes)")  # fmt: skip
        headers = {"Content-Type": "application/json"}
        for name, (path, data) in bodies().items():
            stop = asyncio.Event()
            during = asyncio.create_task(health_latencies(session, proxy.url, stop))
            answers = []
            for _ in range(repeat):
                started = time.perf_counter()
                body = io.BytesIO(data)  # raw bytes would hold this client's own loop
                async with session.post(proxy.url + path, data=body, headers=headers) as response:
                    await response.read()
                answers.append((response.status, time.perf_counter() - started))
            stop.set()
            probes = await during
            statuses = sorted({status for status, _ in answers})
            slowest = max(elapsed for _, elapsed in answers)
            print(
                f"{name:28s} {len(data) / 1e6:5.1f} MB  HTTP {statuses} in <= {slowest:.2f} s;"
                f"  /health P50 {1000 * percentile(probes, 50):.1f} ms,"
                f" max {1000 * max(probes):.1f} ms ({len(probes)} probes)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="prism-bench-"))
    sim_args = ["--speed", "20", "--log-level", "warning"]
    with run_server("prism_sim", sim_args, log_dir=logs, name="sim") as sim:
        proxy_args = ["serve", "--backend", sim.url, "--log-level", "warning"]
        with run_server("prism_proxy", proxy_args, log_dir=logs, name="proxy") as proxy:
            asyncio.run(measure(proxy, args.repeat))


if __name__ == "__main__":
    main()
