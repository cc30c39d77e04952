"""``make demo``: the main comparison on zipf_hotspot across the knee.

1. **The twin** (``prism-loadgen simulate``): fifo, klpm, contextpilot-style and prism through
   the proxy's admission core, and native SGLang FCFS with no proxy, at 40, 60 and
   80 QPS, N = 2048 (SPEC §6), in modeled time on the default engine profile. This is
   the comparison table; it states the winner in words.
2. **The real stack** at one point: fifo and prism through the real proxy and the
   simulated engine over HTTP, in real time, at 60 QPS with N = 1024; the same point
   in the twin beside it shows how far the twin is from the real stack.

About three minutes here.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadgen.experiments.sweep import SweepConfig, run_sweep
from loadgen.stack.lines import base_line

DEMO_QPS = (40.0, 60.0, 80.0)
DEMO_POLICIES = ("fifo", "klpm", "contextpilot-style", "prism", "sglang-fcfs")
REAL_QPS = (60.0,)
REAL_POLICIES = ("fifo", "prism")
REAL_REQUESTS = 1024


def _summaries(results_dir: Path) -> dict[tuple[str, float], dict[str, Any]]:
    from loadgen.reports.report import load_results

    return {
        (label, qps): summary
        for label, by_qps in load_results(results_dir).items()
        for qps, summary in by_qps.items()
    }


def agreement_table(twin: Path, real: Path) -> str:
    """Markdown: the real stack's points beside the twin's."""
    twin_runs, real_runs = _summaries(twin), _summaries(real)
    lines = [
        "| policy | QPS | engine | P99 TTFT | mean TTFT | hit rate | served |",
        "|---|---|---|---|---|---|---|",
    ]
    for (label, qps), measured in sorted(real_runs.items()):
        for engine, s in (("real stack", measured), ("twin", twin_runs.get((label, qps)))):
            if s is None:
                continue
            lines.append(
                f"| {label} | {qps:g} | {engine} | {s['p99_ttft_ms'] / 1000:.2f} s "
                f"| {s['mean_ttft_ms'] / 1000:.2f} s | {100 * s['hit_rate']:.1f} % "
                f"| {s['request_throughput']:.1f} req/s |"
            )
    return "\n".join(lines)


def run_demo(out: Path, speed: float | None = None, num_requests: int | None = None) -> int:
    from loadgen.reports.report import write_report

    started = time.monotonic()
    twin = SweepConfig(
        out=out / "twin",
        lines=tuple(base_line(name) for name in DEMO_POLICIES),
        qps=DEMO_QPS,
        num_requests=num_requests or 2048,
        engine="twin",
    )
    print(
        f"PRISM demo 1/2: the twin, zipf_hotspot N={twin.num_requests} at "
        f"{', '.join(f'{q:g}' for q in twin.qps)} QPS; {', '.join(DEMO_POLICIES)}",
        flush=True,
    )
    run_sweep(twin, command=f"prism-loadgen demo --out {out} (twin part)")
    twin_report = write_report(twin.out / "results", out_dir=twin.out, title="PRISM demo: twin")

    real = replace(
        twin,
        out=out / "real",
        lines=tuple(base_line(name) for name in REAL_POLICIES),
        qps=REAL_QPS,
        num_requests=REAL_REQUESTS,
        engine="sim",
        speed=speed or 1.0,
    )
    print(
        f"\nPRISM demo 2/2: the real stack (proxy + simulated engine over HTTP, real time), "
        f"N={real.num_requests} at {', '.join(f'{q:g}' for q in real.qps)} QPS; "
        f"{', '.join(REAL_POLICIES)}",
        flush=True,
    )
    run_sweep(real, command=f"prism-loadgen demo --out {out} (real-stack part)")
    write_report(real.out / "results", out_dir=real.out, title="PRISM demo: real stack")
    check = replace(real, out=out / "twin-check", engine="twin")
    run_sweep(check, command=f"prism-loadgen demo --out {out} (twin at the real points)")

    print("\n## The comparison (twin, modeled seconds)\n")
    print(twin_report.table_text)
    print("\n## The real stack beside the twin\n")
    print(agreement_table(check.out / "results", real.out / "results"))
    print(f"\nreports: {twin.out / 'report.md'}, {real.out / 'report.md'}")
    print(f"demo finished in {time.monotonic() - started:.0f}s (times above are modeled seconds)")
    print("How to read it, and the full sweeps: docs/results/README.md")
    return 0
