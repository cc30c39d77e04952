"""The pacing squat (issue 34): can one client's requests make every other client wait
in the proxy? Another client's TTFT alone, then beside the squat, per line, in one run.

    python -m bench.pacing_squat [--engine sglang|sim] [--before DIR] [--seconds 40]

The squat: `--large` large unique prompts sent at once as the phase starts (every
prompt new, so the proxy's B falls to about one: B is the prefill budget over the
uncached tokens a request brings) and `--logprob` closed loops of non-streamed chats
that generate
`--logprob-tokens` tokens with top logprobs (SGLang's own endpoint serves them; a proxy
that waits for the whole answer before it counts their prefill done holds its pacing
for as long). The victim: streamed chats of one short prompt, open loop at
`--victim-qps` (Poisson, seeded), its TTFT to the first content chunk.

Lines, each on a flushed engine:
* `direct`: victim and squat straight to the engine (SGLang's own FCFS);
* `prism`: through this checkout's proxy (`prism-proxy serve`, defaults);
* `prism-before`: through the proxy of the checkout at `--before` (e.g. a git worktree
  of an older commit), run the same way.

Printed: the victim's P50 and P99 TTFT alone and beside the squat, the ratio of the two
P99s per line, and how many squat and victim requests completed or failed. Beside the
squat, the victim's calls are also split at the moment the last large prompt was
answered: sent during the burst (they wait for prefill the engine runs whoever sent it,
the `direct` line too) and after it (the logprob loops alone: what pacing decides).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.engines import engine, proxy_args
from loadgen.stack.processes import parse_line, run_server

SYSTEM = "You answer questions about rivers in one short sentence."
WORDS = ("river", "delta", "basin", "bank", "ford", "weir", "lock", "estuary", "meander")


@dataclass
class Tally:
    ttfts_s: list[float] = field(default_factory=list)
    sent_s: list[float] = field(default_factory=list)  # each TTFT's send, from the phase start
    ended_s: list[float] = field(default_factory=list)  # each answer's end, from the phase start
    done: int = 0
    failed: int = 0
    statuses: dict[int, int] = field(default_factory=dict)

    def fail(self, status: int) -> None:
        self.failed += 1
        self.statuses[status] = self.statuses.get(status, 0) + 1


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def victim(
    client: httpx.AsyncClient, url: str, qps: float, began: float, until: float, seed: int
) -> Tally:
    """Streamed chats of one short prompt, Poisson arrivals; TTFT to the first content."""
    rng = random.Random(seed)
    tally = Tally()
    body = {
        "model": "m", "stream": True, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": "Which river flows through Paris?"}],
    }  # fmt: skip

    async def one() -> None:
        start = time.monotonic()
        try:
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    tally.fail(r.status_code)
                    return
                seen = False
                async for line in r.aiter_lines():
                    compact = line.replace(" ", "")
                    if not seen and '"content":"' in compact and '"content":""' not in compact:
                        tally.ttfts_s.append(time.monotonic() - start)
                        tally.sent_s.append(start - began)
                        seen = True
            tally.done += 1
        except httpx.HTTPError:
            tally.fail(0)

    tasks = []
    while time.monotonic() < until:
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(rng.expovariate(qps))
    await asyncio.gather(*tasks)
    return tally


async def squatter(
    client: httpx.AsyncClient,
    url: str,
    until: float,
    body_of: Any,
    tally: Tally,
    began: float,
    first: bool = False,
) -> None:
    """A closed loop: the next request when the last one ended (`first`: one request
    whatever the time)."""
    n = 0
    while first or time.monotonic() < until:
        first = False
        n += 1
        try:
            r = await client.post(url + "/v1/chat/completions", json=body_of(n))
            tally.ended_s.append(time.monotonic() - began)
            if r.status_code == 200:
                tally.done += 1
            else:
                tally.fail(r.status_code)
                await asyncio.sleep(0.5)
        except httpx.HTTPError:
            tally.fail(0)
            await asyncio.sleep(0.5)


def large_body(loop: int, words: int) -> Any:
    def body(n: int) -> dict[str, Any]:
        rng = random.Random(f"{loop}-{n}-{secrets.token_hex(4)}")  # unique every time
        text = " ".join(rng.choice(WORDS) + str(rng.randrange(1000)) for _ in range(words))
        return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}]}

    return body


def logprob_body(tokens: int) -> Any:
    def body(n: int) -> dict[str, Any]:
        return {
            "model": "m", "max_tokens": tokens, "logprobs": True, "top_logprobs": 5,
            "messages": [{"role": "user", "content": f"Tell a long story, part {n}."}],
        }  # fmt: skip

    return body


async def phase(url: str, args: argparse.Namespace, squat: bool) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=600.0, limits=limits) as client:
        began = time.monotonic()
        until = began + args.seconds
        large, logprob = Tally(), Tally()
        loops = []
        if squat:
            once = time.monotonic()  # one request each: the loop ends after it
            loops += [
                squatter(client, url, once, large_body(i, args.large_words), large, began, True)
                for i in range(args.large)
            ]
            loops += [
                squatter(client, url, until, logprob_body(args.logprob_tokens), logprob, began)
                for _ in range(args.logprob)
            ]
        squat_task = asyncio.gather(*loops)
        seen = await victim(client, url, args.victim_qps, began, until, args.seed)
        await squat_task
    return {
        "victim_p50_s": percentile(seen.ttfts_s, 0.5),
        "victim_p99_s": percentile(seen.ttfts_s, 0.99),
        "victim_ttfts_s": [
            [round(a, 3), round(t, 4)] for a, t in zip(seen.sent_s, seen.ttfts_s, strict=True)
        ],
        "large_last_s": max(large.ended_s, default=0.0),
        "victim_done": seen.done, "victim_failed": seen.failed, "victim_statuses": seen.statuses,
        "large_done": large.done, "large_failed": large.failed, "large_statuses": large.statuses,
        "logprob_done": logprob.done, "logprob_failed": logprob.failed,
        "logprob_statuses": logprob.statuses,
    }  # fmt: skip


def split_at_burst(squat: dict[str, Any]) -> tuple[list[float], list[float]]:
    """The victim's TTFTs sent while the large prompts were still unanswered (the burst:
    prefill the engine runs whoever sends it), and after (the logprob loops alone)."""
    end = squat["large_last_s"]
    burst = [ttft for sent, ttft in squat["victim_ttfts_s"] if sent < end]
    after = [ttft for sent, ttft in squat["victim_ttfts_s"] if sent >= end]
    return burst, after


def _file_name(line: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sglang", "sim"), default="sglang")
    parser.add_argument("--before", type=Path, default=None, help="an older checkout")
    parser.add_argument("--seconds", type=float, default=40.0, help="each phase")
    parser.add_argument("--victim-qps", type=float, default=2.0)
    parser.add_argument("--large", type=int, default=12)
    parser.add_argument("--large-words", type=int, default=1200)
    parser.add_argument("--logprob", type=int, default=2)
    parser.add_argument("--logprob-tokens", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sglang-python", default=".venv-sglang/bin/python")
    parser.add_argument(
        "--lines",
        default="direct,prism",
        help="comma-separated: direct, prism, prism[KEY=VALUE;...] (proxy settings, as "
        "`--set`; e.g. prism[prefill_piece_tokens=0]); prism-before is added with --before",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pacing-squat-"))
    lines = args.lines.split(",") + (["prism-before"] if args.before else [])
    results: dict[str, dict[str, Any]] = {}
    with engine(args.engine, work, args.sglang_python) as server:
        for line in lines:
            httpx.post(server.url + "/flush_cache", timeout=30.0)
            serve = proxy_args(args.engine, server.url, parse_line(line)[1])
            cwd = args.before if line == "prism-before" else None
            with contextlib.ExitStack() as stack:
                url = server.url
                if line != "direct":
                    proxy = stack.enter_context(
                        run_server(
                            "prism_proxy", serve, log_dir=work, name=_file_name(line), cwd=cwd
                        )
                    )
                    url = proxy.url
                solo = asyncio.run(phase(url, args, squat=False))
                squat = asyncio.run(phase(url, args, squat=True))
            results[line] = {"solo": solo, "squat": squat}
            print(f"  {line}: solo P99 {solo['victim_p99_s']:.3f} s, beside the squat "
                  f"{squat['victim_p99_s']:.3f} s", file=sys.stderr, flush=True)  # fmt: skip
    print(
        f"\npacing squat on {args.engine}: victim {args.victim_qps:g} QPS for "
        f"{args.seconds:g} s per phase; squat {args.large} x {args.large_words}-word unique "
        f"prompts and {args.logprob} x {args.logprob_tokens}-token non-streamed logprob chats"
    )
    print("| line | victim P50 alone | P99 alone | P50 beside | P99 beside | P99 ratio | "
          "burst: victims, max | after it: P99, ratio to alone | "
          "victim done/failed | large done/failed | logprob done/failed |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for line, r in results.items():
        solo, squat = r["solo"], r["squat"]
        ratio = squat["victim_p99_s"] / solo["victim_p99_s"]
        burst, after = split_at_burst(squat)
        after_p99 = percentile(after, 0.99)
        print(
            f"| {line} | {solo['victim_p50_s']:.3f} s | {solo['victim_p99_s']:.3f} s | "
            f"{squat['victim_p50_s']:.3f} s | {squat['victim_p99_s']:.3f} s | {ratio:.2f} | "
            f"{len(burst)}, {max(burst, default=float('nan')):.3f} s | "
            f"{after_p99:.3f} s, {after_p99 / solo['victim_p99_s']:.2f} | "
            f"{squat['victim_done']}/{squat['victim_failed']} | "
            f"{squat['large_done']}/{squat['large_failed']} | "
            f"{squat['logprob_done']}/{squat['logprob_failed']} {squat['logprob_statuses'] or ''} |"
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        document = {"argv": sys.argv, "commit": commit,
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "results": results}  # fmt: skip
        (args.out / "pacing_squat.json").write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
