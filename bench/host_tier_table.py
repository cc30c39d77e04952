"""The host tier's tables (issue 37's "host tier: a yes or no"): each seed's lines with
their hit rate counted with and without host hits, then each `X+host` line against `X`
over seeds as geometric means of per-seed ratios.

    python -m bench.host_tier_table DIR [DIR ...] [--also DIR [DIR ...]]

Each DIR is one seed's `prism-loadgen sessions --out DIR` (its `results.json`); `--also`
adds, seed by seed in the same order, the rows of more lines run on the same seeds. A line
with the host tier carries `engine_state.host_tier`; its hit rate without host hits is
the summary's hit rate less the share of prompt tokens loaded back from host.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def hit_without_host(row: dict[str, Any]) -> float:
    """The row's hit rate counting only tokens found on the device."""
    host = row["engine_state"].get("host_tier")
    hit = float(row["summary"]["hit_rate"])
    if not host:
        return hit
    return hit - host["host_hit_tokens_total"] / host["prompt_tokens_total"]


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


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
        "| pair | JCT ratio per seed | JCT geo. mean | P99 TTFT ratio per seed | "
        "P99 geo. mean | hit incl. host, difference (points, mean) |",
        "|---|---|---|---|---|---|",
    ]
    for a, b in pairs:
        sa = [run[a]["summary"] for run in runs]
        sb = [run[b]["summary"] for run in runs]
        jct = [x["mean_jct_ms"] / y["mean_jct_ms"] for x, y in zip(sa, sb, strict=True)]
        p99 = [x["p99_ttft_ms"] / y["p99_ttft_ms"] for x, y in zip(sa, sb, strict=True)]
        hit = [100 * (x["hit_rate"] - y["hit_rate"]) for x, y in zip(sa, sb, strict=True)]
        out.append(
            f"| {a} / {b} | {', '.join(f'{v:.3f}' for v in jct)} | {geometric_mean(jct):.3f} "
            f"| {', '.join(f'{v:.2f}' for v in p99)} | {geometric_mean(p99):.2f} | "
            f"{sum(hit) / len(hit):+.1f} |"
        )
    return [*out, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--also", nargs="+", type=Path, default=[])
    args = parser.parse_args()
    if args.also and len(args.also) != len(args.dirs):
        parser.error("--also needs one DIR per seed DIR")
    # point (rate, tool scale, pool fraction) -> one {line: row} per seed
    points: dict[tuple[float, float, float], list[dict[str, dict[str, Any]]]] = {}
    tables: dict[tuple[float, float, float], list[str]] = {}
    for n, d in enumerate(args.dirs):
        rows = json.loads((d / "results.json").read_text())
        if args.also:
            rows += json.loads((args.also[n] / "results.json").read_text())
        by_point: dict[tuple[float, float, float], list[dict[str, Any]]] = {}
        for row in rows:
            by_point.setdefault((row["rate"], row["tool_scale"], row["kv_fraction"]), []).append(
                row
            )
        for point, group in by_point.items():
            tables.setdefault(point, []).extend(seed_table(d.name, group))
            points.setdefault(point, []).append({row["line"]: row for row in group})
    lines: list[str] = []
    for point, runs in points.items():
        rate, scale, fraction = point
        lines += [
            f"## {rate:g} sessions/s, tool scale {scale:g}, pool {fraction:g} × live histories",
            "",
        ]
        lines += tables[point] + pairs_table(runs)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
