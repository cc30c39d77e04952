"""The twin against the real engine: one table.

    python -m loadgen.experiments.twin_vs_real --real runs/twin-vs-real/real \\
        --profile cpu-smollm2 \\
        [--twin-out runs/twin-vs-real/twin] [--out docs/results/twin-vs-real/table.md]

`--real` is a finished `prism-loadgen sweep --backend sglang-cpu` directory. This
replays its very trace files in the twin (`loadgen.twin.twin`, modeled time) with the same
policies, QPS and tokenizer and the given engine profile, then prints each point's
real and twin rows side by side: TTFT P50/P90/P99, served throughput, hit rate, and the
median time per output token (TPOT, (e2e − TTFT)/(tokens − 1) per request), with the
twin/real ratio of each. The twin's KV pool is the profile's; with `cpu-smollm2` that
is the sweep servers' 131,072 tokens (SPEC §7).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadgen.experiments.sweep import SweepConfig, result_path, run_sweep
from loadgen.reports.report import write_report
from loadgen.stack.lines import base_line
from prism_sim.time_model import PrefillItem, Profile, load_profile, prefill_time_s

COLUMNS = ("P50 TTFT", "P90 TTFT", "P99 TTFT", "served", "hit rate", "TPOT")


def tpot_ms(requests: list[dict[str, Any]]) -> float | None:
    """Median over completed requests of (e2e − TTFT) / (output tokens − 1), in ms."""
    values = [
        (r["e2e_latency_ms"] - r["ttft_ms"]) / (r["completion_tokens"] - 1)
        for r in requests
        if r.get("success") and r.get("ttft_ms") is not None and (r["completion_tokens"] or 0) > 1
    ]
    return statistics.median(values) if values else None


def point_metrics(doc: dict[str, Any]) -> dict[str, float | None]:
    """The compared numbers of one result document (seconds, req/s, fraction, ms)."""
    s = doc["summary"]
    return {
        "P50 TTFT": s["median_ttft_ms"] / 1000,
        "P90 TTFT": s["p90_ttft_ms"] / 1000,
        "P99 TTFT": s["p99_ttft_ms"] / 1000,
        "served": s["request_throughput"],
        "hit rate": s["hit_rate"],
        "TPOT": tpot_ms(doc["requests"]),
    }


def idle_arrivals(requests: list[dict[str, Any]], profile: Profile) -> tuple[int, float, float]:
    """Requests that arrived with nothing else in flight: how many, their median TTFT
    and the median of the profile's prefill time for their own uncached tokens (s)."""
    done = [r for r in requests if r.get("success") and r.get("ttft_ms") is not None]
    spans = [(r["arrival_s"], r["arrival_s"] + r["e2e_latency_ms"] / 1e3) for r in done]
    measured, modeled = [], []
    for r in done:
        t = r["arrival_s"]
        if any(start < t < end for start, end in spans if start != t):
            continue
        new = r["prompt_tokens"] - r["cached_tokens"]
        measured.append(r["ttft_ms"] / 1e3)
        modeled.append(prefill_time_s(profile, [PrefillItem(new, r["prompt_tokens"])]))
    if not measured:
        return 0, float("nan"), float("nan")
    return len(measured), statistics.median(measured), statistics.median(modeled)


def _fmt(column: str, value: float | None) -> str:
    if value is None:
        return "—"
    if column == "hit rate":
        return f"{100 * value:.1f} %"
    if column == "served":
        return f"{value:.2f}"
    if column == "TPOT":
        return f"{value:.0f}"
    return f"{value:.2f}"


def comparison_table(rows: list[tuple[str, float, dict[str, Any], dict[str, Any]]]) -> str:
    """Markdown: per (policy, QPS) a real row, a twin row and a twin/real ratio row."""
    header = "| policy | QPS | engine | P50 TTFT (s) | P90 TTFT (s) | P99 TTFT (s) "
    header += "| served (req/s) | hit rate | TPOT (ms) |"
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    for label, qps, real, twin in rows:
        for engine, m in (("real", real), ("twin", twin)):
            cells = " | ".join(_fmt(c, m[c]) for c in COLUMNS)
            lines.append(f"| {label} | {qps:g} | {engine} | {cells} |")
        ratios = [
            "—" if not real[c] or twin[c] is None else f"{twin[c] / real[c]:.2f}" for c in COLUMNS
        ]
        lines.append(f"| {label} | {qps:g} | twin/real | {' | '.join(ratios)} |")
    return "\n".join(lines)


def run(real_dir: Path, profile: str, twin_dir: Path) -> str:
    """Replay the real sweep's traces in the twin; the comparison table."""
    manifest = json.loads((real_dir / "sweep.json").read_text())
    labels = [v["label"] for v in manifest["variants"]]
    config = SweepConfig(
        out=twin_dir,
        lines=tuple(base_line(label) for label in labels),
        qps=tuple(manifest["qps"]),
        workload=manifest["workload"],
        num_requests=manifest["num_requests"],
        seed=manifest["seed"],
        profile=profile,
        tokenizer=manifest["tokenizer"],
        engine="twin",
        model=manifest.get("model", "tiny"),
        **manifest.get("trace_overrides", {}),
    )
    (twin_dir / "traces").mkdir(parents=True, exist_ok=True)
    for trace in (real_dir / "traces").glob("*.jsonl"):  # the very same requests
        shutil.copy(trace, twin_dir / "traces" / trace.name)
    command = f"python -m loadgen.experiments.twin_vs_real --real {real_dir} --profile {profile}"
    run_sweep(config, command=command)
    write_report(twin_dir / "results", out_dir=twin_dir, title="The twin at the real points")
    rows, idle, model = [], [], load_profile(profile)
    for line in config.lines:
        for qps in config.qps:
            real = json.loads(result_path(replace(config, out=real_dir), line, qps).read_text())
            twin = json.loads(result_path(config, line, qps).read_text())
            rows.append((line.label, qps, point_metrics(real), point_metrics(twin)))
            idle.append((line.label, qps, *idle_arrivals(real["requests"], model)))
    lines = ["", "Real requests that arrived at an idle engine (nothing else in flight):", ""]
    lines += ["| policy | QPS | requests | median TTFT (s) | model prefill (s) |"]
    lines += ["|---|---|---|---|---|"]
    lines += [f"| {lb} | {q:g} | {n} | {t:.2f} | {m:.2f} |" for lb, q, n, t, m in idle]
    return comparison_table(rows) + "\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadgen.experiments.twin_vs_real")
    parser.add_argument("--real", required=True, help="a `sweep --backend sglang-cpu` dir")
    parser.add_argument("--profile", default="cpu-smollm2")
    parser.add_argument("--twin-out", default=None, help="default: <real>/../twin")
    parser.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = parser.parse_args(argv)
    real = Path(args.real)
    table = run(real, args.profile, Path(args.twin_out or real.parent / "twin"))
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
