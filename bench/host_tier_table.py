"""The host tier's tables (issue 37's "host tier: a yes or no"): each seed's lines with
their hit rate counted with and without host hits, then each `X+host` line against `X`
over seeds as geometric means of per-seed ratios.

    python -m bench.host_tier_table DIR [DIR ...]

Each DIR is one seed's `prism-loadgen sessions --out DIR` (its `results.json`); DIRs of
the same name are one seed, read together (more lines run on the same seeds:
`bench.sessions_over_seeds.load`). Ratios over seeds are geometric means with a 95 %
interval on their logarithms (`sessions_over_seeds.geometric`). A line
with the host tier carries `engine_state.host_tier`; its hit rate without host hits is
the summary's hit rate less the share of prompt tokens loaded back from host.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.sessions_over_seeds import geometric, load


def hit_without_host(row: dict[str, Any]) -> float:
    """The row's hit rate counting only tokens found on the device."""
    host = row["engine_state"].get("host_tier")
    hit = float(row["summary"]["hit_rate"])
    if not host:
        return hit
    return hit - host["host_hit_tokens_total"] / host["prompt_tokens_total"]


def seed_table(name: str, rows: list[dict[str, Any]]) -> list[str]:
    first = rows[0]
    out = [
        f"### {name} (pool {first['pool_tokens']:,} tokens, commit {first['git_commit'][:7]})",
        "",
        "| line | hit incl. host | hit excl. host | host hits (tokens) | host load s (total) "
        "| mean JCT s | P99 TTFT ms | Belady (device pool, own run) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s, host = row["summary"], row["engine_state"].get("host_tier")
        hits = f"{host['host_hit_tokens_total']:,}" if host else "–"
        load = f"{host['host_load_s_total']:.2f}" if host else "–"
        out.append(
            f"| {row['line']} | {s['hit_rate']:.3f} | {hit_without_host(row):.3f} | {hits} | "
            f"{load} | {s['mean_jct_ms'] / 1e3:.1f} | {s['p99_ttft_ms']:.0f} | "
            f"{row['belady_hit_rate']:.3f} |"
        )
    return [*out, ""]


def pairs_table(runs: list[dict[str, dict[str, Any]]]) -> list[str]:
    """Every `X+host...` line against `X`, and the +host lines against each other."""
    names = list(runs[0])
    pairs = [(n, n.split("+host")[0]) for n in names if "+host" in n]
    pairs += [(n, n.split("/")[0]) for n in names if "+host/" in n]
    pairs = [(a, b) for a, b in pairs if b in runs[0]]
    if "prism+sessions+returns+host" in names and "sglang-lru+host" in names:
        pairs.append(("prism+sessions+returns+host", "sglang-lru+host"))
    if "prism+sessions+returns" in names and "sglang-lru" in names:
        pairs.append(("prism+sessions+returns", "sglang-lru"))
    out = [
        f"### Line against line, {len(runs)} seeds (geometric means of per-seed ratios)",
        "",
        "| pair | JCT ratio per seed | JCT geo. mean [95 %] | P99 TTFT ratio per seed | "
        "P99 geo. mean [95 %] | hit incl. host, difference (points, mean) |",
        "|---|---|---|---|---|---|",
    ]
    for a, b in pairs:
        sa = [run[a]["summary"] for run in runs]
        sb = [run[b]["summary"] for run in runs]
        jct = [x["mean_jct_ms"] / y["mean_jct_ms"] for x, y in zip(sa, sb, strict=True)]
        p99 = [x["p99_ttft_ms"] / y["p99_ttft_ms"] for x, y in zip(sa, sb, strict=True)]
        hit = [100 * (x["hit_rate"] - y["hit_rate"]) for x, y in zip(sa, sb, strict=True)]
        out.append(
            f"| {a} / {b} | {', '.join(f'{v:.3f}' for v in jct)} | {geometric(jct, 3)} "
            f"| {', '.join(f'{v:.2f}' for v in p99)} | {geometric(p99)} | "
            f"{sum(hit) / len(hit):+.1f} |"
        )
    return [*out, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    lines: list[str] = []
    for (rate, scale, fraction), seeds in load(args.dirs).items():
        lines += [
            f"## {rate:g} sessions/s, tool scale {scale:g}, pool {fraction:g} × live histories",
            "",
        ]
        for seed, rows in seeds.items():
            lines += seed_table(seed, list(rows.values()))
        lines += pairs_table(list(seeds.values()))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
