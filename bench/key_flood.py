"""A key flooding at 10x capacity beside a steady key (issue 36, must show).

    python -m bench.key_flood [--seconds 20] [--steady-qps 2] [--factor 10]
                              [--lines share:16,noshare:16,share:4]

prism-sim (real time, its defaults) behind the real proxy (`prism-proxy serve`, a
subprocess), with two API keys from a key file (PRISM_API_KEYS_FILE): `steady` and
`flood`, both with the per-key defaults of the line (PRISM_KEY_MAX_INFLIGHT,
PRISM_KEY_MAX_QUEUED, PRISM_FAIR_SHARE).

1. capacity: the flood's request shape (a unique prompt of `--flood-words` words,
   `--flood-tokens` out) in `--calibrate-loops` closed loops for `--calibrate-seconds`
   through a proxy without per-key limits (so that a line's limit does not lower it):
   answers per second.
2. solo: the steady key alone (the first line's proxy), streamed chats of one short
   prompt, open loop at `--steady-qps` (Poisson, seeded) for `--seconds`; TTFT to the
   first content chunk.
3. per line (a fresh proxy each): the same steady load, and beside it the flood key
   open loop at `--factor` x the capacity (Poisson), from another process so that its
   client's CPU is not the steady client's. The rate it reaches is printed: a Python
   client on a busy machine may not reach the target.

Every proxy is warmed before it is measured (`WARM_UP` steady requests, one at a time,
not counted): a fresh proxy's and connection's first request costs several times a
warm one (measured: 65 ms against 13-26 ms), and with ~40 samples a phase's P99 is
its largest sample, so an unwarmed solo phase would flatter the ratio.

Printed: the steady key's P50/P99 TTFT solo and beside the flood per line, the P99 ratio
(target <= 1.5), the flood's answers by status (429s expected), and whether every
request got exactly one response: a complete answer (a stream through `[DONE]`) or one
error status; a connection error, a timeout or a stream cut short counts as lost, and
the proxy must hold nothing once the phase's answers are in.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import multiprocessing
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from bench.engines import proxy_args
from loadgen.stack.processes import engine_args, run_server

WARM_UP = 5
STEADY_KEY = "sk-steady-" + "0" * 16
FLOOD_KEY = "sk-flood-" + "1" * 16
UNKNOWN_KEY = "sk-unknown-" + "2" * 16
WORDS = ("river", "delta", "basin", "bank", "ford", "weir", "lock", "estuary", "meander")


@dataclass
class Tally:
    """Each request's one outcome: `done` (complete answer) or a status in `statuses`
    (0: lost: connection error, timeout, or a stream cut short)."""

    ttfts_s: list[float] = field(default_factory=list)
    done: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    sent: int = 0

    def outcome(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    @property
    def answered(self) -> int:
        return self.done + sum(n for s, n in self.statuses.items() if s != 0)

    @property
    def lost(self) -> int:
        return self.statuses.get(0, 0)

    def as_json(self) -> dict[str, Any]:
        return {
            "ttfts_s": self.ttfts_s,
            "done": self.done,
            "sent": self.sent,
            "statuses": self.statuses,
        }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def steady_body() -> dict[str, Any]:
    return {
        "model": "m",
        "stream": True,
        "max_tokens": 16,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": "Which river flows through Paris?"},
        ],
    }


def flood_body(rng: random.Random, words: int, max_tokens: int) -> dict[str, Any]:
    """A unique prompt (nothing cached) asking for `max_tokens`."""
    text = " ".join(rng.choice(WORDS) + str(rng.randrange(100_000)) for _ in range(words))
    return {
        "model": "m",
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": text}],
    }


async def one_stream(
    client: httpx.AsyncClient, url: str, key: str, body: dict[str, Any], tally: Tally
) -> None:
    """One streamed chat: its TTFT and its one outcome."""
    tally.sent += 1
    start = time.monotonic()
    headers = {"Authorization": f"Bearer {key}"}
    try:
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                await response.aread()
                tally.outcome(response.status_code)
                return
            seen = finished = False
            async for line in response.aiter_lines():
                compact = line.replace(" ", "")
                if not seen and '"content":"' in compact and '"content":""' not in compact:
                    tally.ttfts_s.append(time.monotonic() - start)
                    seen = True
                if compact == "data:[DONE]":
                    finished = True
        if finished:
            tally.done += 1
        else:
            tally.outcome(0)  # cut short
    except httpx.HTTPError:
        tally.outcome(0)


async def open_loop(
    url: str, key: str, qps: float, seconds: float, seed: int, body_of: Any, connections: int
) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
        until = time.monotonic() + seconds
        tasks = []
        while time.monotonic() < until:
            tasks.append(asyncio.create_task(one_stream(client, url, key, body_of(rng), tally)))
            await asyncio.sleep(rng.expovariate(qps))
        await asyncio.gather(*tasks)
    return tally


async def closed_loops(
    url: str, loops: int, seconds: float, seed: int, args: argparse.Namespace
) -> Tally:
    """`loops` closed loops of flood-shaped requests for `seconds`: each sends its next
    request when its last one ends."""
    tally = Tally()
    rng = random.Random(seed)
    until = time.monotonic() + seconds

    async def loop(client: httpx.AsyncClient) -> None:
        while time.monotonic() < until:
            body = flood_body(rng, args.flood_words, args.flood_tokens)
            await one_stream(client, url, FLOOD_KEY, body, tally)

    async with httpx.AsyncClient(timeout=120.0) as client:
        await asyncio.gather(*(loop(client) for _ in range(loops)))
    return tally


async def capacity(url: str, args: argparse.Namespace) -> float:
    """Answers per second of the flood's shape from closed loops (the engine busy)."""
    began = time.monotonic()
    tally = await closed_loops(
        url, args.calibrate_loops, args.calibrate_seconds, args.seed + 1, args
    )
    return tally.done / (time.monotonic() - began)


async def warm_up(url: str) -> None:
    """`WARM_UP` steady requests one at a time, not counted (module docstring)."""
    async with httpx.AsyncClient(timeout=120.0) as client:
        for _ in range(WARM_UP):
            await one_stream(client, url, STEADY_KEY, steady_body(), Tally())


def flood_process(
    url: str, key: str, qps: float, args: argparse.Namespace, out: Connection
) -> None:
    """The flood key's open loop, in a process of its own; sends its tally to `out`."""

    def body_of(rng: random.Random) -> dict[str, Any]:
        return flood_body(rng, args.flood_words, args.flood_tokens)

    tally = asyncio.run(open_loop(url, key, qps, args.seconds, args.seed + 2, body_of, 256))
    out.send(tally.as_json())


def closed_flood_process(url: str, loops: int, args: argparse.Namespace, out: Connection) -> None:
    """The flood as `loops` closed loops for `args.seconds` (a `direct:N` line), in a
    process of its own; sends its tally to `out`."""
    tally = asyncio.run(closed_loops(url, loops, args.seconds, args.seed + 2, args))
    out.send(tally.as_json())


def proxy_holds_nothing(url: str) -> bool:
    health = httpx.get(url + "/health", timeout=10.0).json()
    return health["queue_depth"] == 0 and health["inflight"] == 0


@dataclass(frozen=True)
class Line:
    """One proxy configuration the flood phase runs against."""

    name: str
    fair_share: bool
    key_max_inflight: int
    flood_key: str = FLOOD_KEY
    direct: bool = False


def parse_lines(text: str) -> list[Line]:
    """`share:16,noshare:16,share:4`: fair share on/off and the per-key in-flight limit.
    `refused:N` sends the flood with a key the proxy does not know, so every flood
    request is refused (401) from its headers and none reaches the engine: what the
    flood costs the machine alone (its client and the proxy's refusals), the floor under
    every admission rule. `direct:N` sends both keys straight to the engine, the flood as
    N closed loops (N of its requests at the engine at all times, none queued): what the
    engine's own batches cost the steady key when a gateway lets N flood requests
    through and never holds a steady one, measured against the steady key alone
    straight at the engine."""
    lines = []
    for item in text.split(","):
        mode, _, inflight = item.strip().partition(":")
        if mode not in ("share", "noshare", "refused", "direct") or not inflight.isdigit():
            raise SystemExit(
                f"--lines: expected share:N, noshare:N, refused:N or direct:N, got {item!r}"
            )
        key = UNKNOWN_KEY if mode == "refused" else FLOOD_KEY
        line = Line(item.strip(), mode != "noshare", int(inflight), key, mode == "direct")
        if line.direct and line.key_max_inflight < 1:
            raise SystemExit(f"--lines: direct:N needs N >= 1, got {item!r}")
        lines.append(line)
    return lines


def steady_phase(url: str, args: argparse.Namespace, seed: int) -> Tally:
    return asyncio.run(
        open_loop(
            url, STEADY_KEY, args.steady_qps, args.seconds, seed, lambda rng: steady_body(), 64
        )
    )


def flood_phase(
    url: str, line: Line, args: argparse.Namespace, flood_qps: float
) -> tuple[Tally, Tally]:
    """The steady key here and the flood from another process, at once: open loop at
    `flood_qps` (sent with the line's key), or the line's closed loops when direct."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    if line.direct:
        target, head = closed_flood_process, (url, line.key_max_inflight)
    else:
        target, head = flood_process, (url, line.flood_key, flood_qps)
    child = context.Process(target=target, args=(*head, args, send))
    child.start()
    beside = steady_phase(url, args, args.seed + 10)
    if not receive.poll(args.seconds + 300):
        child.kill()
        raise RuntimeError("the flood's process sent no tally")
    data = receive.recv()
    child.join()
    flood = Tally(**data)
    flood.statuses = {int(k): v for k, v in data["statuses"].items()}
    return beside, flood


def settle(url: str) -> bool:
    """Whether the proxy holds nothing once the phase's answers are in (waits up to 30 s
    for handlers that are still returning)."""
    deadline = time.monotonic() + 30.0
    while not proxy_holds_nothing(url):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def run(args: argparse.Namespace) -> int:
    lines = parse_lines(args.lines)
    ok = True
    with tempfile.TemporaryDirectory(prefix="key-flood-") as tmp:
        work = Path(tmp)
        keys = work / "keys"
        key_lines = [
            f"sha256:{hashlib.sha256(key.encode()).hexdigest()} name={name}"
            for key, name in ((STEADY_KEY, "steady"), (FLOOD_KEY, "flood"))
        ]
        keys.write_text("\n".join(key_lines) + "\n")
        with run_server("prism_sim", engine_args({"log_level": "warning"}), log_dir=work) as sim:
            serve = proxy_args("sim", sim.url)

            def env_of(fair_share: bool, inflight: int, queued: int) -> dict[str, str]:
                return {
                    "PRISM_API_KEYS_FILE": str(keys),
                    "PRISM_KEY_MAX_INFLIGHT": str(inflight),
                    "PRISM_KEY_MAX_QUEUED": str(queued),
                    "PRISM_FAIR_SHARE": "true" if fair_share else "false",
                }

            unlimited = env_of(True, 0, 0)
            with run_server(
                "prism_proxy", serve, log_dir=work, name="capacity", env=unlimited
            ) as proxy:
                cap = asyncio.run(capacity(proxy.url, args))
            flood_qps = args.factor * cap
            print(
                f"capacity (flood shape: {args.flood_words} unique words, "
                f"{args.flood_tokens} tokens out; {args.calibrate_loops} closed loops, no "
                f"per-key limit): {cap:.2f} answers/s; flood target "
                f"{args.factor:g}x = {flood_qps:.1f} req/s",
                flush=True,
            )
            solo: Tally | None = None
            direct_solo: Tally | None = None
            for line in (line for line in lines if line.direct):
                if direct_solo is None:
                    asyncio.run(warm_up(sim.url))
                    direct_solo = steady_phase(sim.url, args, args.seed)
                    print("straight to the engine, no proxy:", flush=True)
                    report_solo(direct_solo)
                beside, flood = flood_phase(sim.url, line, args, 0.0)
                ok &= report_line(args, line, direct_solo, beside, flood, True)
            for index, line in enumerate(line for line in lines if not line.direct):
                env = env_of(line.fair_share, line.key_max_inflight, args.key_max_queued)
                name = f"proxy-{index}"
                with run_server("prism_proxy", serve, log_dir=work, name=name, env=env) as proxy:
                    url = proxy.url
                    asyncio.run(warm_up(url))
                    if solo is None:
                        solo = steady_phase(url, args, args.seed)
                        ok &= settle(url)
                        report_solo(solo)
                    beside, flood = flood_phase(url, line, args, flood_qps)
                    idle = settle(url)
                    ok &= report_line(args, line, solo, beside, flood, idle)
    print(f"every request got exactly one response, every line: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


def ms(value: float) -> str:
    return f"{value * 1000:.1f} ms"


def report_solo(solo: Tally) -> None:
    print(
        f"steady solo: {solo.sent} sent, {solo.done} done, P50 "
        f"{ms(percentile(solo.ttfts_s, 0.5))}, P99 {ms(percentile(solo.ttfts_s, 0.99))}",
        flush=True,
    )


def report_line(
    args: argparse.Namespace, line: Line, solo: Tally, beside: Tally, flood: Tally, idle: bool
) -> bool:
    solo_p99, beside_p99 = percentile(solo.ttfts_s, 0.99), percentile(beside.ttfts_s, 0.99)
    ratio = beside_p99 / solo_p99
    verdict = "met" if ratio <= 1.5 else "MISSED"
    share = "on" if line.fair_share else "off"
    tallies = (solo, beside, flood)
    exact = all(t.answered == t.sent and t.lost == 0 for t in tallies) and idle
    others = {s: n for s, n in flood.statuses.items() if s != 429}
    if line.direct:
        setting = f"no proxy, {line.key_max_inflight} flood requests at the engine at a time"
    else:
        setting = (
            f"fair share {share}, per-key max_inflight {line.key_max_inflight}, "
            f"max_queued {args.key_max_queued}"
        )
    print(
        f"[{line.name}] {setting}\n"
        f"  steady beside flood: {beside.sent} sent, {beside.done} done "
        f"{beside.statuses or ''}, P50 {ms(percentile(beside.ttfts_s, 0.5))}, P99 "
        f"{ms(beside_p99)}; P99 ratio {ratio:.2f} (target <= 1.5: {verdict})\n"
        f"  flood: {flood.sent} sent ({flood.sent / args.seconds:.1f} req/s), {flood.done} "
        f"answered, {flood.statuses.get(429, 0)} x 429, other {others}\n"
        f"  exactly one response each: {'yes' if exact else 'NO'} (lost "
        f"{sum(t.lost for t in tallies)}, proxy idle after: {idle})",
        flush=True,
    )
    return exact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.key_flood",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    parser.add_argument("--steady-qps", type=float, default=2.0)
    parser.add_argument("--factor", type=float, default=10.0, help="flood rate / capacity")
    parser.add_argument("--flood-words", type=int, default=150)
    parser.add_argument("--flood-tokens", type=int, default=32)
    parser.add_argument("--calibrate-seconds", type=float, default=10.0)
    parser.add_argument("--calibrate-loops", type=int, default=16)
    parser.add_argument(
        "--lines",
        default="share:16,noshare:16,share:4",
        help="lines for the flood phase: share|noshare|refused|direct:<per-key max_inflight>",
    )
    parser.add_argument("--key-max-queued", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
