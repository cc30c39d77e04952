"""``make demo-real``: the main comparison on the real engine and a real model (issue 16).

An unmodified SGLang 0.5.23 on this CPU serving SmolLM2-135M-Instruct (prepared from
its PyPI wheel on first use), a fresh server per line, the zipf_hotspot trace (SPEC §6)
cut down to what a CPU serves in minutes: N = 60 requests, 16-token answers, Poisson
arrivals at 1.5 QPS, above the server's knee (~0.9 req/s under fifo here), where
admission order matters. Three lines, in real time:

* ``fifo``: the proxy releasing in arrival order, the client's document order (the
  baseline the paper beats);
* ``prism``: the proxy's QAS and DART's eviction order;
* ``sglang-fcfs``: no proxy, SGLang's own FCFS (what a user runs today).

It prints the comparison table (TTFT percentiles, served throughput, hit rate) and says
which policy wins. Everything else is `prism-loadgen sweep --backend sglang-cpu --model
smollm2` (docs/sglang-cpu.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from loadgen.sweep import SweepConfig, model_tokenizer, run_sweep
from loadgen.variants import base_variant

POLICIES = ("fifo", "prism", "sglang-fcfs")
QPS = 1.5
NUM_REQUESTS = 60
MAX_TOKENS = 16


def run_demo_real(out: Path, sglang_python: str, qps: float, num_requests: int) -> int:
    from loadgen.report import detail_table, load_results, write_report

    started = time.monotonic()
    config = SweepConfig(
        out=out,
        variants=tuple(base_variant(name) for name in POLICIES),
        qps=(qps,),
        num_requests=num_requests,
        max_tokens=MAX_TOKENS,
        backend="sglang-cpu",
        model="smollm2",
        sglang_python=sglang_python,
        tokenizer=model_tokenizer("smollm2", "builtin", sglang_python),
    )
    print(
        f"PRISM demo-real: SGLang 0.5.23 on this CPU serving SmolLM2-135M-Instruct, "
        f"zipf_hotspot N={num_requests} at {qps:g} QPS, {MAX_TOKENS}-token answers; "
        f"{', '.join(POLICIES)}, a fresh server each (about a minute and a half per line)",
        flush=True,
    )
    command = f"make demo-real (python -m loadgen.demo_real --out {out})"
    run_sweep(config, command=command)
    report = write_report(out / "results", out_dir=out, title="PRISM demo-real: SGLang on CPU")
    print("\n## fifo vs prism vs SGLang's FCFS on the real engine (real seconds)\n")
    print(detail_table(load_results(out / "results")))
    print()
    print(report.table_text.split("**Exact-prefix")[0].strip())
    print(f"\nreport: {out / 'report.md'}")
    print(f"demo-real finished in {time.monotonic() - started:.0f}s (wall)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadgen.demo_real")
    parser.add_argument("--out", default="runs/demo-real")
    parser.add_argument("--sglang-python", default=".venv-sglang/bin/python")
    parser.add_argument("--qps", type=float, default=QPS)
    parser.add_argument("--num-requests", type=int, default=NUM_REQUESTS)
    args = parser.parse_args(argv)
    return run_demo_real(Path(args.out), args.sglang_python, args.qps, args.num_requests)


if __name__ == "__main__":
    raise SystemExit(main())
