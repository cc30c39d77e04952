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

    python -m bench.loop_stall --hinted-seconds 30 [--senders 4] [--idle-seconds 10]

The issue-36 case instead: the probe alone first (`--idle-seconds`, the machine's own
delays), then for `--hinted-seconds` `--senders` clients each send 1 MB hinted chat
requests back to back (one segment of 999,000 characters, over the 256,000 a
piece may hold: each refused with a 400), while *another process* asks `/health` every
20 ms on its own connection. Prints the requests sent and their answers, the probes'
P50, P99 and largest latency, how many took over 100 ms, and the load average (the
probe's latency includes the machine's own scheduling delays).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from bench.large_prompt import health_latencies, prompt_text
from bench.proxy_overhead import percentile
from loadgen.stack.processes import ServerProcess, engine_args, proxy_args, run_server


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


PROBE_INTERVAL_S = 0.020
HINTED_CHARS = 999_000  # under max_prompt_chars (1,000,000), over max_piece_chars


def probe(url: str, seconds: float) -> None:
    """In its own process: GET /health every 20 ms for `seconds` on one keep-alive
    connection (stdlib, nothing else in this process); prints the latencies as JSON."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        connection.request("GET", "/health")
        connection.getresponse().read()
        samples.append(time.perf_counter() - started)
        time.sleep(max(0.0, PROBE_INTERVAL_S - (time.perf_counter() - started)))
    print(json.dumps(samples))


def hinted_body() -> bytes:
    segment = {"id": "doc-0", "text": prompt_text(HINTED_CHARS)}
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "q"}],
                       "prism": {"segments": [segment]}, "max_tokens": 1}).encode()  # fmt: skip


def probe_summary(probes: list[float]) -> str:
    over = sum(1 for value in probes if value > 0.100)
    return (
        f"P50 {1000 * percentile(probes, 50):.1f} ms, P99 {1000 * percentile(probes, 99):.1f}"
        f" ms, max {1000 * max(probes):.1f} ms; {over} of {len(probes)} probes over 100 ms"
    )


def start_probe(url: str, seconds: float) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "bench.loop_stall", "--probe", url, "--seconds", str(seconds)]
    return subprocess.Popen(command, stdout=subprocess.PIPE)


async def hinted_flood(proxy: ServerProcess, seconds: float, senders: int, idle_s: float) -> None:
    data = hinted_body()
    load_idle = os.getloadavg()
    idle, _ = start_probe(proxy.url, idle_s).communicate()  # the machine's own delays
    prober = start_probe(proxy.url, seconds)
    statuses: dict[int, int] = {}
    headers = {"Content-Type": "application/json"}

    async def send(session: aiohttp.ClientSession) -> None:
        while prober.poll() is None:
            body = io.BytesIO(data)  # raw bytes would hold this client's own loop
            async with session.post(proxy.url + "/v1/chat/completions", data=body,
                                    headers=headers) as response:  # fmt: skip
                await response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1

    load_before = os.getloadavg()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        await asyncio.gather(*(send(session) for _ in range(senders)))
    out, _ = prober.communicate()
    load_after = os.getloadavg()
    print(
        f"{sum(statuses.values())} hinted requests of {len(data) / 1e6:.1f} MB from {senders}"
        f" senders in {seconds:.0f} s: HTTP {dict(sorted(statuses.items()))}"
    )
    every = f"every {1000 * PROBE_INTERVAL_S:.0f} ms"
    print(f"/health from another process {every}, idle proxy {idle_s:.0f} s first:"
          f" {probe_summary(json.loads(idle))}")  # fmt: skip
    print(f"/health from another process {every}, during: {probe_summary(json.loads(out))}")
    print(f"load average (1 min): {load_idle[0]:.1f} at the idle probes, {load_before[0]:.1f}"
          f" before the flood, {load_after[0]:.1f} after")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hinted-seconds", type=float, default=None,
                        help="the issue-36 case: 1 MB hinted prompts for this long")  # fmt: skip
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)  # the probe process
    parser.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--proxy-python", default=sys.executable,
                        help="the Python (and cwd: its checkout) that runs the proxy")  # fmt: skip
    parser.add_argument("--proxy-cwd", type=Path, default=None)
    args = parser.parse_args()
    if args.probe is not None:
        probe(args.probe, args.seconds)
        return
    logs = Path(tempfile.mkdtemp(prefix="prism-bench-"))
    sim_args = engine_args({"speed": 20, "log_level": "warning"})
    with run_server("prism_sim", sim_args, log_dir=logs, name="sim") as sim:
        serve = proxy_args({"backend": sim.url, "log_level": "warning"})
        with run_server("prism_proxy", serve, log_dir=logs, name="proxy",
                        python=args.proxy_python, cwd=args.proxy_cwd) as proxy:  # fmt: skip
            if args.hinted_seconds is not None:
                asyncio.run(
                    hinted_flood(proxy, args.hinted_seconds, args.senders, args.idle_seconds)
                )
            else:
                asyncio.run(measure(proxy, args.repeat))


if __name__ == "__main__":
    main()
