"""The sweep report: a markdown table and PNG plots (the paper's Figure 4 / Table 1).

Reads every ``*.json`` result in a directory (each carries its ``variant``: label,
QPS), and writes ``report.md`` (P99 TTFT and hit rate per variant and QPS, their sweep
averages, P99 reductions vs the strongest baseline and vs ``fifo``, and a detail table
with all TTFT percentiles and throughput) plus ``p99_ttft_vs_qps.png``,
``hit_rate_vs_qps.png`` and ``throughput_vs_qps.png``, and ``summaries.json`` (every
run's summary without the per-request records). Plots use matplotlib's Agg
backend (no display needed). A "Settings" section lists what each line ran with (the
QAS variant and its parameters, pacing, window, residency source, control RPC: issue
25), from the results and the sweep's ``sweep.json``.

Repeats over seeds (``--seed 0,1,2``: result files ``<label>_qps<λ>_seed<k>.json``, each
carrying its seed): the tables and plots show means over seeds, a section gives for
P99 TTFT, mean TTFT, hit rate and throughput the mean and its 95 % Student-t interval
per line and QPS, and a paired comparison of ``prism`` against every other line (the
per-seed ratio of P99 TTFT, and of mean TTFT, its mean and interval); the detail table
lists each seed, and ``summaries.json`` holds every run's summary with the aggregates.
With one seed per line and QPS the report and ``summaries.json`` are as before.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.stack.lines import ALL_POLICIES, BASELINES

# label -> QPS -> seed (None: not recorded) -> summary
Runs = dict[str, dict[float, dict[int | None, dict[str, Any]]]]
# What the over-seeds section aggregates, and how it shows them.
SEED_METRICS = ("p99_ttft_ms", "mean_ttft_ms", "hit_rate", "request_throughput")
REFERENCE = "prism"  # the line the paired comparison sets against every other
# Two-sided 95 % quantiles of Student's t, t_{0.975, df} for df = 1..30.
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
Z_975 = 1.959964


@dataclass(frozen=True)
class ReportPaths:
    table_text: str
    files: tuple[Path, ...]


def result_docs(results_dir: Path) -> list[dict[str, Any]]:
    """Every result document of a directory, each with ``_label``, ``_qps`` and
    ``_seed`` set (its line, offered QPS, and seed: the run's, else its trace's).

    JSON files without a ``summary`` (the report's own ``summaries.json``, a sweep's
    ``sweep.json``) are not results and are skipped, so a report can be rebuilt in place.
    """
    docs = []
    for path in sorted(results_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or "summary" not in doc:
            continue
        variant = doc.get("variant") or {}
        doc["_label"] = variant.get("label") or doc.get("config", {}).get("api", path.stem)
        doc["_qps"] = float(variant.get("qps") or doc["summary"].get("request_rate") or 0.0)
        seed = variant.get("seed", (doc.get("trace") or {}).get("seed"))
        doc["_seed"] = None if seed is None else int(seed)
        docs.append(doc)
    return docs


def runs_of(docs: Sequence[dict[str, Any]]) -> Runs:
    """``{label: {qps: {seed: summary}}}`` (a later file of the same run wins)."""
    runs: Runs = defaultdict(lambda: defaultdict(dict))
    for doc in docs:
        runs[doc["_label"]][doc["_qps"]][doc["_seed"]] = doc["summary"]
    return {label: dict(by_qps) for label, by_qps in runs.items()}


def load_runs(results_dir: Path) -> Runs:
    """``{label: {qps: {seed: summary}}}`` from a directory of result files."""
    return runs_of(result_docs(results_dir))


def repeated(runs: Runs) -> bool:
    """Whether some line ran some QPS under more than one seed."""
    return any(len(by_seed) > 1 for by_qps in runs.values() for by_seed in by_qps.values())


def seeds_of(runs: Runs) -> list[int]:
    return sorted({s for q in runs.values() for b in q.values() for s in b if s is not None})


def mean_summary(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One summary of several runs: each number the mean of the runs' (those that have
    one), nested groups (``hot``, ``cold``, lanes) likewise, anything else the first's."""
    if len(summaries) == 1:
        return summaries[0]
    out: dict[str, Any] = {}
    for key, first in summaries[0].items():
        values = [s.get(key) for s in summaries]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if isinstance(first, dict):
            out[key] = mean_summary([v for v in values if isinstance(v, dict)])
        elif numbers and len(numbers) == len([v for v in values if v is not None]):
            out[key] = sum(numbers) / len(numbers)
        else:
            out[key] = first
    return out


def seed_means(runs: Runs) -> dict[str, dict[float, dict[str, Any]]]:
    """``{label: {qps: summary}}``: the run's summary, or the mean over its seeds."""
    return {
        label: {qps: mean_summary(list(by_seed.values())) for qps, by_seed in by_qps.items()}
        for label, by_qps in runs.items()
    }


def load_results(results_dir: Path) -> dict[str, dict[float, dict[str, Any]]]:
    """``{label: {qps: summary}}`` from a directory of result files (with several seeds
    of a line and QPS: the mean over them, `seed_means`)."""
    return seed_means(load_runs(results_dir))


def t_quantile_975(df: int) -> float:
    """t_{0.975, df}: the table up to 30 degrees of freedom, beyond it the
    Cornish-Fisher expansion around the normal quantile (within 1e-4)."""
    if df < 1:
        raise ValueError("a t-interval needs at least two values")
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Interval:
    """The mean of n values and the half-width of its 95 % Student-t interval
    (None with one value: no spread to estimate)."""

    mean: float
    half_width: float | None
    n: int

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width

    def to_json(self) -> dict[str, Any]:
        return {
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "half_width": self.half_width,
            "n": self.n,
        }


def t_interval(values: Sequence[float | None]) -> Interval | None:
    """Mean ± t_{0.975, n-1} · s / √n of the values present (s: sample deviation)."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    n = len(present)
    mean = sum(present) / n
    if n == 1:
        return Interval(mean, None, 1)
    variance = sum((v - mean) ** 2 for v in present) / (n - 1)
    return Interval(mean, t_quantile_975(n - 1) * math.sqrt(variance / n), n)


def _seed_key(seed: int | None) -> str:
    return "?" if seed is None else str(seed)


def over_seeds(runs: Runs) -> dict[str, dict[float, dict[str, dict[str, Any] | None]]]:
    """Per line and QPS, for each of `SEED_METRICS`: the interval over seeds
    (`Interval.to_json`) plus ``values``, each seed's value; None when no seed has it."""
    out: dict[str, dict[float, dict[str, dict[str, Any] | None]]] = {}
    for label, by_qps in runs.items():
        out[label] = {}
        for qps, by_seed in sorted(by_qps.items()):
            cells: dict[str, dict[str, Any] | None] = {}
            for metric in SEED_METRICS:
                values = {_seed_key(s): summary.get(metric) for s, summary in by_seed.items()}
                interval = t_interval(list(values.values()))
                cells[metric] = (
                    None if interval is None else {**interval.to_json(), "values": values}
                )
            out[label][qps] = cells
    return out


def paired(runs: Runs, reference: str = REFERENCE) -> dict[str, dict[float, dict[str, Any]]]:
    """`reference` against every other line, paired by seed: per QPS the per-seed
    ratios reference / line of P99 TTFT and of mean TTFT (below 1: `reference` lower)
    with their mean and 95 % t-interval. Empty without the reference line."""
    ours = runs.get(reference)
    if not ours:
        return {}
    out: dict[str, dict[float, dict[str, Any]]] = {}
    for label in sorted(runs, key=_label_key):
        if label == reference:
            continue
        by_qps: dict[float, dict[str, Any]] = {}
        for qps, theirs in sorted(runs[label].items()):
            mine = ours.get(qps, {})
            cells: dict[str, Any] = {}
            for metric in ("p99_ttft_ms", "mean_ttft_ms"):
                ratios: dict[str, float] = {}
                for seed in sorted(set(mine) & set(theirs), key=seed_order):
                    a, b = mine[seed].get(metric), theirs[seed].get(metric)
                    if a is not None and b:
                        ratios[_seed_key(seed)] = a / b
                interval = t_interval(list(ratios.values()))
                key = metric.removesuffix("_ms") + "_ratio"
                cells[key] = None if interval is None else {**interval.to_json(), "values": ratios}
            if any(cells.values()):
                by_qps[qps] = cells
        if by_qps:
            out[label] = by_qps
    return out


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


def comparison_table(results: dict[str, dict[float, dict[str, Any]]], over: str = "") -> str:
    """Markdown: P99 TTFT (s) and hit rate per QPS, sweep means, reductions (`over`:
    words after the captions, e.g. ", mean over 3 seeds")."""
    labels = sorted(results, key=_label_key)
    qps_points = sorted({q for by_qps in results.values() for q in by_qps})
    p99 = {lb: [results[lb].get(q, {}).get("p99_ttft_ms") for q in qps_points] for lb in labels}
    hit = {lb: [results[lb].get(q, {}).get("hit_rate") for q in qps_points] for lb in labels}
    mean_p99 = {lb: _mean(p99[lb]) for lb in labels}
    baselines = [lb for lb in labels if lb in BASELINES and mean_p99[lb] is not None]
    strongest = min(baselines, key=lambda lb: mean_p99[lb] or 0.0) if baselines else None

    head = " | ".join(f"{q:g}" for q in qps_points)
    lines = [
        f"**P99 TTFT (s) by offered QPS{over}**",
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
        f"**Exact-prefix hit rate (cached / prompt tokens) by offered QPS{over}**",
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


def _detail_cells(s: dict[str, Any]) -> str:
    return (
        f"{s['completed']} | {s['failed']} "
        f"| {s['request_throughput']:.1f} | {_s(s['mean_ttft_ms'])} "
        f"| {_s(s['median_ttft_ms'])} | {_s(s['p90_ttft_ms'])} | {_s(s['p95_ttft_ms'])} "
        f"| {_s(s['p99_ttft_ms'])} | {_pct(s['hit_rate'])} "
        f"| {_pct((s.get('hot') or {}).get('hit_rate'))} "
        f"| {_pct((s.get('cold') or {}).get('hit_rate'))} |"
    )


_DETAIL_HEAD = (
    "completed | failed | req/s | mean | P50 | P90 | P95 | P99 TTFT (s) "
    "| hit rate | hit (hot) | hit (cold) |"
)


def detail_table(results: dict[str, dict[float, dict[str, Any]]]) -> str:
    lines = [f"| policy | QPS | {_DETAIL_HEAD}", "|---" * 13 + "|"]
    for lb in sorted(results, key=_label_key):
        for qps, s in sorted(results[lb].items()):
            lines.append(f"| {lb} | {qps:g} | {_detail_cells(s)}")
    return "\n".join(lines)


def seed_detail_table(runs: Runs) -> str:
    """`detail_table` with one row per seed (the per-seed values of every metric)."""
    lines = [f"| policy | QPS | seed | {_DETAIL_HEAD}", "|---" * 14 + "|"]
    for lb in sorted(runs, key=_label_key):
        for qps, by_seed in sorted(runs[lb].items()):
            for seed, s in sorted_seeds(by_seed):
                lines.append(f"| {lb} | {qps:g} | {_seed_key(seed)} | {_detail_cells(s)}")
    return "\n".join(lines)


# How each aggregated metric is shown: (column, value -> text, half-width -> text)
_SHOW = {
    "p99_ttft_ms": ("P99 TTFT (s)", _s, lambda h: f"{h / 1000:.2f}"),
    "mean_ttft_ms": ("mean TTFT (s)", _s, lambda h: f"{h / 1000:.2f}"),
    "hit_rate": ("hit rate", _pct, lambda h: f"{100 * h:.1f}"),
    "request_throughput": ("req/s", lambda v: f"{v:.1f}", lambda h: f"{h:.1f}"),
}


def _with_interval(metric: str, cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "—"
    _, show, width = _SHOW[metric]
    text = show(cell["mean"])
    return text if cell["half_width"] is None else f"{text} ± {width(cell['half_width'])}"


def _ratio(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "—"
    if cell["half_width"] is None:
        return f"{cell['mean']:.2f}"
    return f"{cell['mean']:.2f} [{cell['low']:.2f}, {cell['high']:.2f}]"


def seeds_section(runs: Runs) -> str:
    """Markdown: per line and QPS the mean over seeds ± its 95 % t half-width, and the
    paired ratios of `REFERENCE` against every other line."""
    seeds = seeds_of(runs)
    aggregate = over_seeds(runs)
    head = " | ".join(_SHOW[m][0] for m in SEED_METRICS)
    lines = [
        f"**Over {len(seeds)} seeds ({', '.join(map(str, seeds))}): mean ± half-width of "
        "the 95 % Student-t interval** (hit rate: ± points)",
        "",
        f"| policy | QPS | seeds | {head} |",
        "|---" * (len(SEED_METRICS) + 3) + "|",
    ]
    for lb in sorted(aggregate, key=_label_key):
        for qps, cells in aggregate[lb].items():
            n = max((c["n"] for c in cells.values() if c is not None), default=0)
            row = " | ".join(_with_interval(m, cells[m]) for m in SEED_METRICS)
            lines.append(f"| {lb} | {qps:g} | {n} | {row} |")
    pairs = paired(runs)
    if pairs:
        lines += [
            "",
            f"**{REFERENCE} / each line, paired by seed: mean ratio [95 % t-interval]**"
            f" (below 1: {REFERENCE} lower)",
            "",
            "| line | QPS | P99 TTFT ratio | per seed | mean TTFT ratio |",
            "|---" * 5 + "|",
        ]
        for lb, by_qps in pairs.items():
            for qps, cells in by_qps.items():
                p99 = cells["p99_ttft_ratio"]
                each = ", ".join(f"{v:.2f}" for v in (p99 or {}).get("values", {}).values())
                lines.append(
                    f"| {lb} | {qps:g} | {_ratio(p99)} | {each or '—'} "
                    f"| {_ratio(cells['mean_ttft_ratio'])} |"
                )
    return "\n".join(lines)


def seeds_json(runs: Runs) -> dict[str, Any]:
    """``summaries.json`` of a repeated sweep: every run's summary by line, QPS and
    seed, the aggregates over seeds, and the paired ratios."""
    aggregate = over_seeds(runs)
    return {
        "seeds": seeds_of(runs),
        "confidence": 0.95,
        "lines": {
            lb: {
                f"{qps:g}": {
                    "seeds": {_seed_key(seed): summary for seed, summary in sorted_seeds(by_seed)},
                    "over_seeds": aggregate[lb][qps],
                }
                for qps, by_seed in sorted(by_qps.items())
            }
            for lb, by_qps in runs.items()
        },
        "paired": {
            "reference": REFERENCE,
            "ratio": f"{REFERENCE} / line",
            "against": {
                lb: {f"{qps:g}": cells for qps, cells in by_qps.items()}
                for lb, by_qps in paired(runs).items()
            },
        },
    }


def seed_order(seed: int | None) -> tuple[bool, int]:
    """Seeds in order, an unrecorded one (None) last."""
    return (seed is None, seed or 0)


def sorted_seeds(by_seed: dict[int | None, Any]) -> list[tuple[int | None, Any]]:
    return sorted(by_seed.items(), key=lambda item: seed_order(item[0]))


def _qas_text(name: str | None, params: dict[str, Any] | None) -> str:
    """A QAS variant and its parameters that differ from the variant's preset."""
    from prism_proxy.qas.params import QAS_VARIANTS, qas_params

    if name not in QAS_VARIANTS:
        return name or "?"
    if not params:
        return name
    preset = qas_params(name)
    changed = [
        f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
        for key, value in params.items()
        if hasattr(preset, key) and not _same(getattr(preset, key), value)
    ]
    return ", ".join([name, *changed])


def _same(a: Any, b: Any) -> bool:
    """Equal, numbers up to rounding (a wall-clock time scaled back by the speed)."""
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _span(mode: str | None, values: Sequence[int]) -> str:
    """ "auto (12–30)", "auto (16)", "16", or "auto"."""
    if not values:
        return mode or "—"
    low, high = min(values), max(values)
    shown = f"{low}" if low == high else f"{low}–{high}"
    return f"auto ({shown})" if mode == "auto" else shown


def _doc_settings(doc: dict[str, Any], planned: dict[str, Any]) -> dict[str, Any]:
    """One run's settings, from the proxy's own account (real stack), the twin's
    setup, or failing both the sweep's plan (`sweep.json`)."""
    variant = doc.get("variant") or {}
    ps = variant.get("proxy_settings") or {}
    ts = variant.get("twin_setup") or {}
    state = doc.get("proxy_state") or {}
    policy = variant.get("policy", planned.get("policy"))
    eviction = variant.get("eviction", planned.get("eviction"))
    schedule = variant.get("schedule_policy", planned.get("schedule_policy")) or "fcfs"
    engine = "—" if eviction is None else eviction
    if eviction is not None and (schedule != "fcfs" or policy is None):
        engine += f" ({schedule})"
    clients = variant.get("client_api") or planned.get("client_api") or "—"
    layout = variant.get("layout") or planned.get("layout")
    out: dict[str, Any] = {
        "engine": engine,
        "clients": f"{clients} ({layout})" if layout else clients,
    }
    peer = variant.get("peer_server") or {}
    if peer:  # a third party's server in the proxy's place (loadgen.stack.peer_lines)
        return {**out, "qas": f"{peer.get('name')} {peer.get('version')}", "control": "off"}
    if policy is None and ("policy" in variant or "policy" in planned):
        return {**out, "qas": "no proxy", "control": "off"}
    if policy == "prism":
        name = ps.get("qas_variant") or planned.get("qas_variant") or variant.get("qas")
        params = ps.get("qas") or ts.get("qas") or planned.get("qas")
        if ps.get("qas"):  # the proxy's account is in wall ms: the report's are modeled
            speed = float(variant.get("speed") or 1.0)
            params = {
                key: value * speed
                if key.endswith("_ms") and isinstance(value, float | int)
                else value
                for key, value in params.items()
            }
        out["qas"] = _qas_text(name, params)
    else:
        out["qas"] = "—"
    if ps:
        batch, backstop = ps.get("prefill_batch") or {}, ps.get("backstop") or {}
        out["b_mode"], out["b"] = batch.get("mode"), batch.get("value")
        out["backstop_mode"], out["backstop"] = backstop.get("mode"), backstop.get("value")
        window = ps.get("window_ms")
        out["window"] = None if window is None else window * float(variant.get("speed") or 1.0)
        out["residency"], out["control"] = ps.get("residency"), ps.get("control_rpc")
    elif ts:
        out["b_mode"] = "fixed" if ts.get("prefill_batch") else "auto"
        out["b"] = state.get("prefill_batch_final") or ts.get("prefill_batch") or None
        out["backstop_mode"] = "fixed" if ts.get("max_inflight") else "auto"
        out["backstop"] = state.get("backstop") or ts.get("max_inflight") or None
        out["window"] = 1000.0 * ts["window_s"] if "window_s" in ts else None
        out["residency"] = state.get("residency")
        out["control"] = state.get("control_rpc")
    else:
        batch = planned.get("prefill_batch")
        out["b_mode"] = "auto" if batch == "auto" else ("fixed" if batch else None)
        out["b"] = batch if isinstance(batch, int) else None
        out["window"] = planned.get("window_ms")
        out["residency"], out["control"] = planned.get("residency"), planned.get("control_rpc")
    if isinstance(out["control"], bool):
        out["control"] = "on" if out["control"] else "off"
    return out


def _pacing(rows: list[dict[str, Any]], mode_key: str, value_key: str) -> str:
    modes = {r.get(mode_key) for r in rows} - {None}
    values = [r[value_key] for r in rows if isinstance(r.get(value_key), int)]
    return _span(next(iter(modes)) if len(modes) == 1 else None, values)


def settings_table(docs: Sequence[dict[str, Any]], manifest: dict[str, Any]) -> str:
    """Markdown: per line the QAS variant (and parameters changed from its preset), the
    prefill batch B and the backstop (fixed, or "auto" with the values seen), the QAS
    window in modeled ms, the residency source, the control RPC, the engine's eviction
    (and schedule policy) and how clients talked."""
    planned = manifest.get("settings") or {}
    by_label: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for doc in docs:
        by_label[doc["_label"]].append(_doc_settings(doc, planned.get(doc["_label"]) or {}))
    lines = [
        "| line | QAS | B | backstop | window (ms) | residency | control RPC | engine | clients |",
        "|---" * 9 + "|",
    ]

    def one(rows: list[dict[str, Any]], key: str) -> str:
        seen = sorted({str(r[key]) for r in rows if r.get(key) is not None})
        return " / ".join(seen) or "—"

    for label in sorted(by_label, key=_label_key):
        rows = by_label[label]
        if rows[0].get("qas") == "no proxy":
            pacing = "— | —"
        else:
            pacing = (
                f"{_pacing(rows, 'b_mode', 'b')} | {_pacing(rows, 'backstop_mode', 'backstop')}"
            )
        windows = sorted({f"{r['window']:g}" for r in rows if r.get("window") is not None})
        lines.append(
            f"| {label} | {one(rows, 'qas')} | {pacing} | {' / '.join(windows) or '—'} "
            f"| {one(rows, 'residency')} | {one(rows, 'control')} | {one(rows, 'engine')} "
            f"| {one(rows, 'clients')} |"
        )
    return "\n".join(lines)


def _plot(
    results: dict[str, dict[float, dict[str, Any]]],
    metric: str,
    scale: float,
    ylabel: str,
    title: str,
    path: Path,
    spread: dict[str, dict[float, dict[str, dict[str, Any] | None]]] | None = None,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 4.0), dpi=120)
    for lb in sorted(results, key=_label_key):
        points = sorted((q, s.get(metric)) for q, s in results[lb].items())
        xs = [q for q, v in points if v is not None]
        ys = [v * scale for _, v in points if v is not None]
        width = 2.2 if lb == "prism" else 1.4
        if spread is None:
            ax.plot(xs, ys, marker="o", label=lb, linewidth=width)
            continue
        cells = [(spread.get(lb, {}).get(q) or {}).get(metric) or {} for q in xs]
        errors = [(c.get("half_width") or 0.0) * scale for c in cells]
        ax.errorbar(xs, ys, yerr=errors, marker="o", label=lb, linewidth=width, capsize=3)
    ax.set_xlabel("offered load (QPS)")
    ax.set_ylabel(ylabel)
    ax.set_title(title if spread is None else f"{title} (mean, 95 % t-interval)")
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
    docs = result_docs(results_dir)
    runs = runs_of(docs)
    results = seed_means(runs)
    if not results:
        raise ValueError(f"{results_dir}: no result files")
    many = repeated(runs)
    spread = over_seeds(runs) if many else None
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = (
        _plot(
            results,
            "p99_ttft_ms",
            1e-3,
            "P99 TTFT (s)",
            "P99 TTFT vs offered load",
            out_dir / "p99_ttft_vs_qps.png",
            spread,
        ),
        _plot(
            results,
            "hit_rate",
            100.0,
            "exact-prefix hit rate (%)",
            "KV hit rate vs load",
            out_dir / "hit_rate_vs_qps.png",
            spread,
        ),
        _plot(
            results,
            "request_throughput",
            1.0,
            "served (req/s)",
            "Throughput vs load",
            out_dir / "throughput_vs_qps.png",
            spread,
        ),
    )
    seeds = seeds_of(runs)
    table = comparison_table(results, f", mean over {len(seeds)} seeds" if many else "")
    if many:
        table = seeds_section(runs) + "\n\n" + table
    manifest_path = out_dir / "sweep.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    body = [f"# {title}", ""]
    if manifest.get("command"):
        body += ["Produced by:", "", "```", manifest["command"], "```", ""]
    if manifest.get("git_commit"):
        body += [f"at commit `{manifest['git_commit']}`.", ""]
    if manifest.get("settings") or any((d.get("variant") or {}).get("eviction") for d in docs):
        body += ["## Settings", "", settings_table(docs, manifest), ""]
    body += [table, "", "## All percentiles", ""]
    body += [seed_detail_table(runs) if many else detail_table(results), ""]
    body += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    report = out_dir / "report.md"
    report.write_text("\n".join(body))
    compact = out_dir / "summaries.json"
    summaries: dict[str, Any] = (
        seeds_json(runs)
        if many
        else {
            lb: {f"{q:g}": s for q, s in sorted(by_qps.items())} for lb, by_qps in results.items()
        }
    )
    compact.write_text(json.dumps(summaries, indent=1) + "\n")
    return ReportPaths(table_text=table, files=(report, compact, *plots))
