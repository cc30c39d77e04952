"""Two lines of the agent_sessions sweep side by side, seed by seed (one change at a
time: a line against the same line without it).

    python -m bench.sessions_paired DIR [DIR ...] --pair BASE,CHANGED [--pair ...]

Each DIR is one seed's `prism-loadgen sessions --out DIR` (its `results.json`, where both
lines ran on the same trace and pool). Per point (rate, tool scale, pool fraction) and
seed: hit, P99 TTFT and mean JCT of both, and the re-prefilled history by cause
(`prism_proxy.admission.reprefill`). Over seeds: the hit's mean change (points), the
JCT and P99 ratios' geometric means with a 95 % interval on their logarithms, and each
cause's total.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.sessions_over_seeds import arithmetic, geometric, load
from prism_proxy.admission.reprefill import Cause


def pair_report(base: str, changed: str, seeds: dict[str, dict[str, Any]]) -> list[str]:
    # the causes the files know (a file made before a cause existed lacks its key)
    known = {k for rows in seeds.values() for row in rows.values()
             for k in row["summary"].get("reprefill_tokens", {})}  # fmt: skip
    causes = [c.value for c in Cause if c.value in known]
    out = [
        "| seed | hit | P99 s | mean JCT s | re-prefilled | "
        + " | ".join(c.replace("_", " ") for c in causes)
        + " |",
        "|---" * (5 + len(causes)) + "|",
    ]
    hits, jcts, p99s = [], [], []
    totals = {name: [0, 0] for name in (*causes, "total")}
    for seed, rows in seeds.items():
        if base not in rows or changed not in rows:
            continue
        a, b = rows[base]["summary"], rows[changed]["summary"]
        ra, rb = a["reprefill_tokens"], b["reprefill_tokens"]
        hits.append(b["hit_rate"] - a["hit_rate"])
        jcts.append(b["mean_jct_ms"] / a["mean_jct_ms"])
        p99s.append(b["p99_ttft_ms"] / a["p99_ttft_ms"])
        for name, pair in totals.items():
            pair[0] += ra.get(name, 0)
            pair[1] += rb.get(name, 0)
        cells = [
            f"{a['hit_rate']:.3f} → {b['hit_rate']:.3f}",
            f"{a['p99_ttft_ms'] / 1e3:.2f} → {b['p99_ttft_ms'] / 1e3:.2f}",
            f"{a['mean_jct_ms'] / 1e3:.1f} → {b['mean_jct_ms'] / 1e3:.1f}",
            *(f"{ra.get(name, 0):,} → {rb.get(name, 0):,}" for name in ("total", *causes)),
        ]
        out.append(f"| {seed} | " + " | ".join(cells) + " |")
    if not hits:
        return [*out, "", "(no seed ran both lines)"]
    out += [
        "",
        f"Over {len(hits)} seeds: hit {arithmetic(hits, scale=100.0)} points; mean JCT "
        f"ratio {geometric(jcts, 3)}; P99 ratio {geometric(p99s, 3)}; re-prefilled "
        + ", ".join(f"{name.replace('_', ' ')} {a:,} → {b:,}" for name, (a, b) in totals.items()),
    ]
    return out


def report(dirs: Sequence[Path], pairs: Sequence[tuple[str, str]]) -> str:
    out: list[str] = []
    for (rate, scale, fraction), seeds in sorted(load(dirs).items()):
        for base, changed in pairs:
            out += [
                f"## {rate:g} sessions/s, tool scale {scale:g}, pool {fraction:g}: "
                f"`{changed}` against `{base}`",
                "",
                *pair_report(base, changed, seeds),
                "",
            ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sessions_paired", description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path, help="seed directories")
    parser.add_argument(
        "--pair", action="append", required=True, help="BASE,CHANGED: two lines of the runs"
    )
    args = parser.parse_args(argv)
    pairs = []
    for text in args.pair:
        base, _, changed = text.partition(",")
        if not base or not changed:
            parser.error(f"--pair: expected BASE,CHANGED, got {text!r}")
        pairs.append((base, changed))
    print(report(args.dirs, pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
