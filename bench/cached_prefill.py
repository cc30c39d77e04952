"""What a cached prefix saves on the real CPU engine, stock cache vs DART.

    flock /tmp/prism-measure.lock .venv/bin/python -m bench.cached_prefill [--repeats 5]

For each server the twin-vs-real sweep runs (SmolLM2 on SGLang's own cache, the `fifo`
line; the same with the DART plugin and its control RPC, the `prism` line), times
single `/generate` requests of a zipf_hotspot-sized prompt (`--prompt` tokens, one
output token, client-side): fully uncached, and with its first `--cached` tokens
already in the cache. Prints the medians beside the `cpu-smollm2` model's prediction
(docs/results/twin-vs-real/). Nothing here asserts a number.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
from pathlib import Path

import httpx

from bench.fit_cpu_profile import Probe
from loadgen.experiments.sweep import SweepConfig, sglang_cpu_command
from loadgen.stack.lines import base_line
from loadgen.stack.processes import free_port, run_server
from prism_sim.time_model import PrefillItem, load_profile, prefill_time_s


async def _times(url: str, prompt: int, cached: int, repeats: int) -> dict[str, float]:
    probe = Probe(url, seed=1)
    uncached, with_prefix = [], []
    async with httpx.AsyncClient(timeout=600.0) as client:
        await probe.prefill(client, [probe.ids(prompt)])  # warm-up
        for _ in range(repeats):
            uncached += await probe.prefill(client, [probe.ids(prompt)])
            prefix = probe.ids(cached)
            await probe.prefill(client, [prefix + probe.ids(1)])
            with_prefix += await probe.prefill(client, [prefix + probe.ids(prompt - cached)])
    return {"uncached": statistics.median(uncached), "cached": statistics.median(with_prefix)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cached_prefill")
    parser.add_argument("--prompt", type=int, default=764)
    parser.add_argument("--cached", type=int, default=330)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sglang-python", default=".venv-sglang/bin/python")
    args = parser.parse_args(argv)
    profile = load_profile("cpu-smollm2")
    new = args.prompt - args.cached
    print(
        f"model: uncached {prefill_time_s(profile, [PrefillItem(args.prompt, args.prompt)]):.3f}"
        f" s, {args.cached} cached {prefill_time_s(profile, [PrefillItem(new, args.prompt)]):.3f} s"
    )
    config = SweepConfig(
        out=Path("/tmp"), lines=(), backend="sglang-cpu", model="smollm2",
        sglang_python=args.sglang_python,
    )  # fmt: skip
    for label in ("fifo", "prism"):
        control, token = free_port(), secrets.token_hex(8)
        serve = sglang_cpu_command(config, base_line(label), control)
        with run_server(
            "sglang_cpu.serve", serve, python=args.sglang_python,
            startup_timeout_s=300.0, name=f"cached-prefill-{label}",
            env={"PRISM_CONTROL_TOKEN": token},
        ) as server:  # fmt: skip
            t = asyncio.run(_times(server.url, args.prompt, args.cached, args.repeats))
        eviction = "stock" if base_line(label).eviction == "lru" else "dart"
        print(
            f"{label} server (--eviction {eviction}): uncached {t['uncached']:.3f} s, "
            f"{args.cached} cached {t['cached']:.3f} s (median of {args.repeats})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
