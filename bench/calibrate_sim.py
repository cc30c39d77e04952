"""Calibration sweep of the simulated engine's default profile (SPEC §7, §8).

    python -m bench.calibrate_sim [--qps 40 50 60 70 80] [--requests 2048] [--speed 5]

Drives the engine open-loop with Poisson arrivals: ~768-token prompts made of a shared
prefix (drawn from a small pool, so it is cached after its first use) plus a unique
rest, so that ~49% of prompt tokens are cached (the paper's PRISM hit rate), and 32
decode tokens. For each QPS it prints served throughput (completed requests / span from
first arrival to last finish) and TTFT percentiles, all in modeled seconds, twice:

* `offline` — the scheduler replayed in pure modeled time (`prism_sim.offline`);
* `realtime` — the same trace through the asyncio engine loop at `--speed` (what the
  HTTP server runs), so the two columns show how much Python overhead leaks in;
  with `--http`, through a real `python -m prism_sim` subprocess over streaming
  `/generate` instead (TTFT measured by the client; the last column is then the
  server loop's lag at the end).

The plateau of served throughput is the profile's capacity; the paper reports ~50 req/s
(48.3 req/s served at 50 QPS). Nothing here asserts a number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prism_sim.engine_loop import EngineLoop
from prism_sim.offline import RequestResult, TraceRequest, replay
from prism_sim.radix_cache import RadixCache
from prism_sim.request import SimRequest
from prism_sim.scheduler import Scheduler, SchedulerConfig
from prism_sim.time_model import Profile, load_profile

FILLER_IDS = list(range(100, 164))


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int = 768
    shared_tokens: int = 376  # 376 / 768 ≈ 49% cached once the prefix is resident
    num_prefixes: int = 8
    decode_tokens: int = 32
    vocab_size: int = 8192


@dataclass(frozen=True)
class Summary:
    qps: float
    completed: int
    served_rps: float
    ttft_p50_s: float
    ttft_p99_s: float
    hit_rate: float
    extra: str = ""


def build_trace(qps: float, num_requests: int, workload: Workload, seed: int) -> list[TraceRequest]:
    """Poisson arrivals; prompt = one of `num_prefixes` shared prefixes + a unique rest."""
    rng = random.Random(seed)
    vocab = workload.vocab_size
    prefixes = [
        [rng.randrange(16, vocab) for _ in range(workload.shared_tokens)]
        for _ in range(workload.num_prefixes)
    ]
    rest = workload.prompt_tokens - workload.shared_tokens
    trace, t = [], 0.0
    for i in range(num_requests):
        t += rng.expovariate(qps)
        ids = rng.choice(prefixes) + [rng.randrange(16, vocab) for _ in range(rest)]
        trace.append(TraceRequest(f"cal-{i}", t, ids, workload.decode_tokens))
    return trace


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[rank]


def summarize(qps: float, results: Sequence[RequestResult], extra: str = "") -> Summary:
    done = [r for r in results if not math.isnan(r.finish_s)]
    span = max(r.finish_s for r in done) - min(r.arrival_s for r in results)
    ttfts = [r.ttft_s for r in done]
    prompt = sum(r.prompt_tokens for r in done)
    return Summary(
        qps=qps,
        completed=len(done),
        served_rps=len(done) / span,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        hit_rate=sum(r.cached_tokens for r in done) / prompt if prompt else 0.0,
        extra=extra,
    )


def make_scheduler(profile: Profile) -> Scheduler:
    return Scheduler(SchedulerConfig.from_profile(profile), profile, RadixCache("lru"), FILLER_IDS)


async def run_realtime(profile: Profile, trace: Sequence[TraceRequest], speed: float):
    """The trace through `EngineLoop` at `speed`; returns results and the loop's lag."""
    loop = EngineLoop(make_scheduler(profile), speed=speed)
    reqs: list[SimRequest] = []
    done = asyncio.Event()
    remaining = len(trace)

    def on_change(req: SimRequest) -> None:
        nonlocal remaining
        if req.finished:
            remaining -= 1
            if remaining == 0:
                done.set()

    async with loop:
        start = loop.now()
        for t in trace:
            delay = (start + t.arrival_s - loop.now()) / speed
            if delay > 0:
                await asyncio.sleep(delay)
            req = SimRequest(t.rid, list(t.input_ids), t.max_new_tokens, 0.0, listener=on_change)
            loop.submit(req)
            reqs.append(req)
        await done.wait()
    return [RequestResult.of(r, origin_s=start) for r in reqs], loop.max_lag_s


async def run_http(profile_spec: str | None, trace: Sequence[TraceRequest], speed: float):
    """The trace through a real `python -m prism_sim` subprocess over streaming
    `/generate`; TTFT is the first chunk's wall delay × speed (lag included)."""
    import aiohttp

    from loadgen.stack.processes import engine_args, run_server

    settings = {"speed": speed, "log_level": "warning", "profile": profile_spec or None}
    with run_server("prism_sim", engine_args(settings)) as server:
        url = server.url + "/generate"
        start = time.monotonic()

        def modeled() -> float:
            return (time.monotonic() - start) * speed

        async def one(session: aiohttp.ClientSession, t: TraceRequest) -> RequestResult:
            await asyncio.sleep(max(0.0, t.arrival_s / speed - (time.monotonic() - start)))
            body = {
                "input_ids": t.input_ids,
                "rid": t.rid,
                "stream": True,
                "sampling_params": {"max_new_tokens": t.max_new_tokens},
            }
            sent, first, meta = modeled(), math.nan, {}
            async with session.post(url, json=body) as resp:
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: {"):
                        continue
                    if math.isnan(first):
                        first = modeled()
                    meta = json.loads(line[len("data: ") :])["meta_info"]
            return RequestResult(
                t.rid, sent, first, modeled(), meta.get("prompt_tokens", 0),
                meta.get("cached_tokens", 0), meta.get("completion_tokens", 0),
            )  # fmt: skip

        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            results = await asyncio.gather(*(one(session, t) for t in trace))
        info = await asyncio.to_thread(_server_lag, server.url)
    return list(results), info


def _server_lag(url: str) -> float:
    import httpx

    states = httpx.get(url + "/server_info", timeout=10).json()["internal_states"][0]
    return float(states["loop_lag_s"])


def print_table(rows: Sequence[tuple[Summary, Summary | None]]) -> None:
    head = (
        f"{'QPS':>5} | {'served req/s':>12} {'P50 TTFT':>9} {'P99 TTFT':>9} {'hit':>6}"
        f" {'cpu max speed':>13}"
        f" || {'rt served':>9} {'rt P99':>8} {'rt/off P99':>10} {'max lag':>7}"
    )
    print(head)
    print("-" * len(head))
    for off, rt in rows:
        line = (
            f"{off.qps:5.0f} | {off.served_rps:12.1f} {off.ttft_p50_s:8.2f}s {off.ttft_p99_s:8.2f}s"
            f" {off.hit_rate:6.1%} {off.extra:>13}"
        )
        if rt is not None:
            ratio = rt.ttft_p99_s / off.ttft_p99_s if off.ttft_p99_s > 0 else math.nan
            line += f" || {rt.served_rps:9.1f} {rt.ttft_p99_s:7.2f}s {ratio:10.2f} {rt.extra:>7}"
        print(line)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.calibrate_sim", description=__doc__)
    p.add_argument("--qps", type=float, nargs="+", default=[40, 50, 60, 70, 80])
    p.add_argument("--requests", type=int, default=2048)
    p.add_argument("--profile", default=None)
    p.add_argument("--speed", type=float, default=5.0, help="real-time run's time scale")
    p.add_argument("--no-realtime", action="store_true", help="offline replay only")
    p.add_argument(
        "--http",
        action="store_true",
        help="right-hand columns through a prism_sim subprocess over streaming HTTP "
        "(client-side TTFT; heavier: use fewer requests or a lower speed)",
    )
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    profile = load_profile(args.profile)
    workload = Workload()
    print(
        f"profile {profile.name}: c0={profile.prefill_overhead_s * 1e3:.1f} ms, "
        f"R_pf={profile.prefill_tokens_per_s:.0f} tok/s, d0={profile.decode_overhead_s * 1e3:.1f}"
        f" ms, d1={profile.decode_per_request_s * 1e3:.3f} ms/req, "
        f"KV={profile.kv_capacity_tokens} tokens, chunk={profile.chunked_prefill_size}"
    )
    print(
        f"workload: {args.requests} requests/point, {workload.prompt_tokens}-token prompts "
        f"({workload.shared_tokens} shared from {workload.num_prefixes} prefixes), "
        f"{workload.decode_tokens} decode tokens; times in modeled seconds"
    )
    rows = []
    for qps in args.qps:
        trace = build_trace(qps, args.requests, workload, args.seed)
        t0 = time.perf_counter()
        results = replay(make_scheduler(profile), trace)
        replay_wall_s = time.perf_counter() - t0
        span_s = max(r.finish_s for r in results) - min(r.arrival_s for r in results)
        # Modeled seconds the scheduler can process per CPU second: the highest --speed
        # one core could sustain on this load (HTTP handling comes on top).
        offline = summarize(qps, results, extra=f"{span_s / replay_wall_s:.0f}x")
        rt = None
        if args.http:
            results, lag = asyncio.run(run_http(args.profile, trace, args.speed))
            rt = summarize(qps, results, extra=f"{lag:.2f}")
        elif not args.no_realtime:
            results, lag = asyncio.run(run_realtime(profile, trace, args.speed))
            rt = summarize(qps, results, extra=f"{lag:.2f}")
        rows.append((offline, rt))
        print(f"  ... {qps:.0f} QPS done in {time.perf_counter() - t0:.1f}s wall", flush=True)
    print()
    print_table(rows)


if __name__ == "__main__":
    main()
