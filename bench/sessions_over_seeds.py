"""One line of the agent_sessions sweep against every other, over seeds (issue 37's
must-show table).

    python -m bench.sessions_over_seeds DIR [DIR ...] [--line LINE] [--without LINE]

Each DIR is one seed's `prism-loadgen sessions --out DIR` (its `results.json`); DIRs of
the same name are one seed's runs of more lines (the twin is deterministic: a line run
alone gives the row it gives among others), merged. Rows are grouped by point (rate,
tool scale, pool fraction). Per point, seed by seed:

* hit: the line's hit rate, its own run's Belady bound, and the best other line's;
* mean JCT: the part recovered of what is avoidable, (best native − line) / (best
  native − never-evict), where best native is the sglang-* line with the lowest mean
  JCT and never-evict the sweep's run with an unlimited pool; and continuum-style's;
* P99 TTFT as a ratio to sglang-lru's, to the best other line's and to
  continuum-style's.

Over seeds: ratios are summarised as a geometric mean with a 95 % t-interval on their
logarithms (a ratio's interval then stays positive, as a raw-ratio interval need not);
differences and fractions as a mean with a 95 % t-interval.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from loadgen.reports.report import t_interval

NATIVE_PREFIX = "sglang-"
CONTINUUM = "continuum-style"


def geometric(ratios: Sequence[float], digits: int = 2) -> str:
    """Geometric mean [95 % interval on the logs]."""
    found = t_interval([math.log(r) for r in ratios if r > 0])
    if found is None:
        return "–"
    if found.half_width is None:
        return f"{math.exp(found.mean):.{digits}f}"
    low, high = math.exp(found.mean - found.half_width), math.exp(found.mean + found.half_width)
    return f"{math.exp(found.mean):.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def arithmetic(values: Sequence[float], scale: float = 1.0, digits: int = 2) -> str:
    found = t_interval([v * scale for v in values])
    if found is None:
        return "–"
    if found.half_width is None:
        return f"{found.mean:.{digits}f}"
    return f"{found.mean:.{digits}f} ± {found.half_width:.{digits}f}"


def load(
    dirs: Sequence[Path], without: Collection[str] = ()
) -> dict[tuple[float, float, float], dict[str, dict[str, Any]]]:
    """{point: {seed dir name: {line: row}}} (dirs of one name merged), the lines named
    in `without` left out."""
    points: dict[tuple[float, float, float], dict[str, dict[str, Any]]] = {}
    for directory in dirs:
        for row in json.loads((directory / "results.json").read_text()):
            if row["line"] in without:
                continue
            point = (row["rate"], row["tool_scale"], row["kv_fraction"])
            points.setdefault(point, {}).setdefault(directory.name, {})[row["line"]] = row
    return points


def point_report(line: str, seeds: dict[str, dict[str, Any]]) -> list[str]:
    out = [
        f"| seed | hit | own Belady | best other hit | mean JCT s | best native JCT | "
        f"never-evict JCT | recovered | {CONTINUUM} JCT | P99 s | P99 / sglang-lru | "
        f"P99 / best other | P99 / {CONTINUUM} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    gaps, above, recovered, jct_vs_cont, p99_lru, p99_other, p99_cont = [], [], [], [], [], [], []
    for seed, rows in seeds.items():
        if line not in rows:
            continue
        ours = rows[line]
        mine = ours["summary"]
        others = {name: row["summary"] for name, row in rows.items() if name != line}
        native = {n: s for n, s in others.items() if n.startswith(NATIVE_PREFIX)}
        best_hit = max(others.items(), key=lambda item: item[1]["hit_rate"])
        best_p99 = min(others.items(), key=lambda item: item[1]["p99_ttft_ms"])
        best_native = min(native.values(), key=lambda s: s["mean_jct_ms"])
        never = ours["unlimited"]["mean_jct_ms"]
        avoidable = best_native["mean_jct_ms"] - never
        part = (best_native["mean_jct_ms"] - mine["mean_jct_ms"]) / avoidable if avoidable else 0
        cont = others.get(CONTINUUM)
        gaps.append(ours["belady_hit_rate"] - mine["hit_rate"])
        above.append(mine["hit_rate"] - best_hit[1]["hit_rate"])
        recovered.append(part)
        p99_lru.append(mine["p99_ttft_ms"] / others["sglang-lru"]["p99_ttft_ms"])
        p99_other.append(mine["p99_ttft_ms"] / best_p99[1]["p99_ttft_ms"])
        if cont:
            jct_vs_cont.append(mine["mean_jct_ms"] / cont["mean_jct_ms"])
            p99_cont.append(mine["p99_ttft_ms"] / cont["p99_ttft_ms"])
        cont_jct = f"{cont['mean_jct_ms'] / 1e3:.1f}" if cont else "–"
        cont_p99 = f"{p99_cont[-1]:.2f}" if cont else "–"
        out.append(
            f"| {seed} | {mine['hit_rate']:.3f} | {ours['belady_hit_rate']:.3f} | "
            f"{best_hit[1]['hit_rate']:.3f} ({best_hit[0]}) | {mine['mean_jct_ms'] / 1e3:.1f} | "
            f"{best_native['mean_jct_ms'] / 1e3:.1f} | {never / 1e3:.1f} | {part:.2f} | "
            f"{cont_jct} | {mine['p99_ttft_ms'] / 1e3:.2f} | {p99_lru[-1]:.2f} | "
            f"{p99_other[-1]:.2f} ({best_p99[0]}) | {cont_p99} |"
        )
    if not gaps:
        return [f"no `{line}` rows"]
    out += [
        "",
        f"Over {len(gaps)} seeds:",
        f"* hit: own Belady − hit {arithmetic(gaps, 100, 1)} points (largest "
        f"{100 * max(gaps):.1f}); hit − best other line's {arithmetic(above, 100, 1)} points "
        f"(smallest {100 * min(above):+.1f}; at or above every other line on "
        f"{sum(a >= 0 for a in above)} of {len(above)} seeds)",
        f"* mean JCT: recovered {arithmetic(recovered)} of the avoidable part; / {CONTINUUM} "
        f"{geometric(jct_vs_cont)}",
        f"* P99 TTFT: / sglang-lru {geometric(p99_lru)}; / best other line "
        f"{geometric(p99_other)} (largest {max(p99_other):.2f}); / {CONTINUUM} "
        f"{geometric(p99_cont)}",
    ]
    return out


def report(dirs: Sequence[Path], line: str, without: Collection[str] = ()) -> str:
    out = [f"`{line}` against every other line, seeds {', '.join(d.name for d in dirs)}"]
    if without:
        out.append(f"(left out: {', '.join(sorted(without))})")
    out.append("")
    for (rate, scale, fraction), seeds in sorted(load(dirs, without).items()):
        out += [f"## {rate:g} sessions/s, tool scale {scale:g}, pool {fraction:g}", ""]
        out += point_report(line, seeds)
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sessions_over_seeds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="one sweep dir per seed")
    parser.add_argument("--line", default="prism+sessions+returns")
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="LINE",
        help="a line of the dirs not to compare with (repeatable)",
    )
    args = parser.parse_args(argv)
    print(report(args.dirs, args.line, set(args.without)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
