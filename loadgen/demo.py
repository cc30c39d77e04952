"""``make demo``: fifo vs k-LPM vs PRISM on zipf_hotspot across the knee (issue 6).

A short sweep on the simulated engine with the default profile: three offered loads
around the knee (SPEC §7: between 50 and 60 QPS), the engine's clock sped up so the
whole demo fits in a few minutes on two cores, results kept in modeled seconds. Ends
with the comparison table and the paths of the report and plots.
"""

from __future__ import annotations

import time
from pathlib import Path

from loadgen.sweep import SweepConfig, make_variants, run_sweep

DEMO_QPS = (40.0, 60.0, 80.0)
DEMO_POLICIES = ["fifo", "klpm", "prism"]
DEMO_SPEED = 2.0
DEMO_REQUESTS = 1024


def run_demo(out: Path, speed: float | None = None, num_requests: int | None = None) -> int:
    from loadgen.report import write_report

    config = SweepConfig(
        out=out,
        variants=make_variants(DEMO_POLICIES, [], []),
        qps=DEMO_QPS,
        num_requests=num_requests or DEMO_REQUESTS,
        speed=speed or DEMO_SPEED,
    )
    started = time.monotonic()
    print(
        f"PRISM demo: zipf_hotspot (N={config.num_requests}, k=5) at "
        f"{', '.join(f'{q:g}' for q in config.qps)} QPS; policies {', '.join(DEMO_POLICIES)};"
        f" simulated engine (profile {config.profile}) at {config.speed:g}x speed",
        flush=True,
    )
    run_sweep(config, command=f"prism-loadgen demo --out {out}")
    paths = write_report(out / "results", out_dir=out, title="PRISM demo")
    print()
    print(paths.table_text)
    print()
    for path in paths.files:
        print(f"wrote {path}")
    print(f"demo finished in {time.monotonic() - started:.0f}s (times above are modeled seconds)")
    return 0
