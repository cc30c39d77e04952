"""The sweep report: a markdown table and PNG plots (the paper's Figure 4 / Table 1).

Reads every ``*.json`` result in a directory (each carries its ``variant``: label,
QPS), and writes ``report.md`` (P99 TTFT and hit rate per variant and QPS, their sweep
averages, P99 reductions vs the strongest baseline and vs ``fifo``, and a detail table
with all TTFT percentiles and throughput) plus ``p99_ttft_vs_qps.png``,
``hit_rate_vs_qps.png`` and ``throughput_vs_qps.png``, and ``summaries.json`` (every
run's summary without the per-request records). Plots use matplotlib's Agg
backend (no display needed).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.variants import ALL_POLICIES, BASELINES


@dataclass(frozen=True)
class ReportPaths:
    table_text: str
    files: tuple[Path, ...]


def load_results(results_dir: Path) -> dict[str, dict[float, dict[str, Any]]]:
    """``{label: {qps: summary}}`` from a directory of result files.

    JSON files without a ``summary`` (the report's own ``summaries.json``, a sweep's
    ``sweep.json``) are not results and are skipped, so a report can be rebuilt in place.
    """
    table: dict[str, dict[float, dict[str, Any]]] = defaultdict(dict)
    for path in sorted(results_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or "summary" not in doc:
            continue
        variant = doc.get("variant") or {}
        label = variant.get("label") or doc.get("config", {}).get("api", path.stem)
        qps = variant.get("qps") or doc["summary"].get("request_rate") or 0.0
        table[label][float(qps)] = doc["summary"]
    return dict(table)


def _label_key(label: str) -> tuple[int, str]:
    known = ALL_POLICIES
    return (known.index(label) if label in known else len(known), label)


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _s(ms: float | None) -> str:
    return "—" if ms is None else f"{ms / 1000:.2f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _reduction(new: float | None, old: float | None) -> str:
    if new is None or not old:
        return "—"
    return f"{100 * (new - old) / old:+.1f}%"


def comparison_table(results: dict[str, dict[float, dict[str, Any]]]) -> str:
    """Markdown: P99 TTFT (s) and hit rate per QPS, sweep means, reductions."""
    labels = sorted(results, key=_label_key)
    qps_points = sorted({q for by_qps in results.values() for q in by_qps})
    p99 = {lb: [results[lb].get(q, {}).get("p99_ttft_ms") for q in qps_points] for lb in labels}
    hit = {lb: [results[lb].get(q, {}).get("hit_rate") for q in qps_points] for lb in labels}
    mean_p99 = {lb: _mean(p99[lb]) for lb in labels}
    baselines = [lb for lb in labels if lb in BASELINES and mean_p99[lb] is not None]
    strongest = min(baselines, key=lambda lb: mean_p99[lb] or 0.0) if baselines else None

    head = " | ".join(f"{q:g}" for q in qps_points)
    lines = [
        "**P99 TTFT (s) by offered QPS**",
        "",
        f"| policy | {head} | mean | vs strongest baseline | vs fifo |",
        "|---" * (len(qps_points) + 4) + "|",
    ]
    for lb in labels:
        cells = " | ".join(_s(v) for v in p99[lb])
        vs_best = _reduction(mean_p99[lb], mean_p99.get(strongest)) if strongest else "—"
        vs_fifo = _reduction(mean_p99[lb], mean_p99.get("fifo"))
        lines.append(f"| {lb} | {cells} | {_s(mean_p99[lb])} | {vs_best} | {vs_fifo} |")
    lines += [
        "",
        f"Strongest baseline (lowest mean P99 TTFT): {strongest or '—'}.",
        "",
        verdict(mean_p99, {lb: _mean(hit[lb]) for lb in labels}, strongest),
        "",
        "**Exact-prefix hit rate (cached / prompt tokens) by offered QPS**",
        "",
        f"| policy | {head} | mean |",
        "|---" * (len(qps_points) + 2) + "|",
    ]
    for lb in labels:
        cells = " | ".join(_pct(v) for v in hit[lb])
        lines.append(f"| {lb} | {cells} | {_pct(_mean(hit[lb]))} |")
    return "\n".join(lines)


def _change_words(new: float, old: float) -> str:
    change = 100 * (new - old) / old
    return f"{abs(change):.1f} % {'lower' if change < 0 else 'higher'}"


def verdict(
    mean_p99: dict[str, float | None],
    mean_hit: dict[str, float | None],
    strongest: str | None,
) -> str:
    """Which line has the lowest mean P99 TTFT, and how prism compares, in words."""
    ranked = sorted((v, lb) for lb, v in mean_p99.items() if v is not None)
    if not ranked:
        return "No line completed a request."
    best_p99, best = ranked[0]
    words = [f"**Winner on mean P99 TTFT: {best}** ({_s(best_p99)} s)."]
    prism_p99, prism_hit = mean_p99.get("prism"), mean_hit.get("prism")
    if prism_p99 is not None:
        for name in dict.fromkeys(["fifo", strongest]):
            other = mean_p99.get(name) if name else None
            if name and name != "prism" and other:
                words.append(
                    f"prism's mean P99 TTFT is {_change_words(prism_p99, other)} than {name}'s"
                    f" ({_s(prism_p99)} s vs {_s(other)} s)."
                )
    best_hit = max(((v, lb) for lb, v in mean_hit.items() if v is not None), default=None)
    if best_hit is not None:
        words.append(f"Highest mean hit rate: {best_hit[1]} ({_pct(best_hit[0])}).")
        if prism_hit is not None and best_hit[1] != "prism":
            words.append(f"prism's is {_pct(prism_hit)}.")
    return " ".join(words)


def detail_table(results: dict[str, dict[float, dict[str, Any]]]) -> str:
    lines = [
        "| policy | QPS | completed | failed | req/s | mean | P50 | P90 | P95 | P99 TTFT (s) "
        "| hit rate | hit (hot) | hit (cold) |",
        "|---" * 13 + "|",
    ]
    for lb in sorted(results, key=_label_key):
        for qps, s in sorted(results[lb].items()):
            lines.append(
                f"| {lb} | {qps:g} | {s['completed']} | {s['failed']} "
                f"| {s['request_throughput']:.1f} | {_s(s['mean_ttft_ms'])} "
                f"| {_s(s['median_ttft_ms'])} | {_s(s['p90_ttft_ms'])} | {_s(s['p95_ttft_ms'])} "
                f"| {_s(s['p99_ttft_ms'])} | {_pct(s['hit_rate'])} "
                f"| {_pct((s.get('hot') or {}).get('hit_rate'))} "
                f"| {_pct((s.get('cold') or {}).get('hit_rate'))} |"
            )
    return "\n".join(lines)


def _plot(
    results: dict[str, dict[float, dict[str, Any]]],
    metric: str,
    scale: float,
    ylabel: str,
    title: str,
    path: Path,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 4.0), dpi=120)
    for lb in sorted(results, key=_label_key):
        points = sorted((q, s.get(metric)) for q, s in results[lb].items())
        xs = [q for q, v in points if v is not None]
        ys = [v * scale for _, v in points if v is not None]
        ax.plot(xs, ys, marker="o", label=lb, linewidth=2.2 if lb == "prism" else 1.4)
    ax.set_xlabel("offered load (QPS)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(
    results_dir: Path, out_dir: Path | None = None, title: str = "PRISM sweep"
) -> ReportPaths:
    """Write ``report.md`` and the plots next to the results (or in ``out_dir``)."""
    out_dir = out_dir or results_dir
    results = load_results(results_dir)
    if not results:
        raise ValueError(f"{results_dir}: no result files")
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = (
        _plot(
            results,
            "p99_ttft_ms",
            1e-3,
            "P99 TTFT (s)",
            "P99 TTFT vs offered load",
            out_dir / "p99_ttft_vs_qps.png",
        ),
        _plot(
            results,
            "hit_rate",
            100.0,
            "exact-prefix hit rate (%)",
            "KV hit rate vs load",
            out_dir / "hit_rate_vs_qps.png",
        ),
        _plot(
            results,
            "request_throughput",
            1.0,
            "served (req/s)",
            "Throughput vs load",
            out_dir / "throughput_vs_qps.png",
        ),
    )
    table = comparison_table(results)
    manifest_path = out_dir / "sweep.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    body = [f"# {title}", ""]
    if manifest.get("command"):
        body += ["Produced by:", "", "```", manifest["command"], "```", ""]
    body += [table, "", "## All percentiles", "", detail_table(results), ""]
    body += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    report = out_dir / "report.md"
    report.write_text("\n".join(body))
    compact = out_dir / "summaries.json"
    compact.write_text(
        json.dumps(
            {
                lb: {f"{q:g}": s for q, s in sorted(by_qps.items())}
                for lb, by_qps in results.items()
            },
            indent=1,
        )
        + "\n"
    )
    return ReportPaths(table_text=table, files=(report, compact, *plots))
