"""agent_sessions experiments in the twin (`prism-loadgen sessions`): every line at each
point of a sweep over session rate, tool-duration scale and KV pool, with the Belady
bound of each run and a report.

The pool is given as a fraction of the live sessions' unique KV (`--kv-fraction`): at
each (rate, tool scale) a first run with a pool too large to evict
(`UNLIMITED_TOKENS`) measures the time-averaged KV the live sessions hold, each agent
type's shared prefix and each task's part counted once however many live sessions
share it (`session_replay.live_unique_tokens`); a fraction f gives a pool of f times
that. 1 is "everything live fits", 0.5 "the pool holds half of it". Each row also
records the live histories counted per session (`live_history_tokens`), by which the
pools of runs before this definition were set; `--trace-param pool_basis=histories`
sets the pool from them again (to reproduce those runs).

Each row's `summary.reprefill_tokens` says what the continuations re-prefilled of their
own history and why (`prism_proxy.admission.reprefill`).

The lines are `session_lines.LINES`, each a `Line` (`loadgen.stack.lines`) from which
a run takes its twin setup and session features (`loadgen.twin.line_setup`) with the
point's pool.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from loadgen.experiments.session_lines import LINES, REAL_LINES
from loadgen.experiments.session_real import run_real_line
from loadgen.experiments.sweep import git_commit
from loadgen.twin.line_setup import session_features, twin_setup
from loadgen.twin.session_twin import shared_tokens, simulate_sessions
from loadgen.workloads.session_trace import (
    SessionParams,
    SessionTrace,
    belady_bound,
    build_session_trace,
    unlimited_kv_bound,
)
from loadgen.workloads.session_trace import (
    summary as trace_summary,
)
from prism_proxy.admission.reprefill import Cause
from prism_tokens.tokenizer import Tokenizer, load_tokenizer

UNLIMITED_TOKENS = 50_000_000
NATIVE = tuple(name for name, line in LINES.items() if line.policy is None)  # no proxy


@dataclass(frozen=True)
class Point:
    rate: float
    tool_scale: float
    kv_fraction: float


def run_line(
    name: str, trace: SessionTrace, pool: int, tokenizer: Tokenizer, save_calls: bool = False
) -> dict[str, Any]:
    """One line on one trace with a pool of `pool` tokens: its summary and Belady's
    bound on its own calls; with `save_calls`, its per-call records (`calls`: the
    client's sessions, `engine_records`: the engine's timeline of each request)."""
    line = LINES[name]
    started = time.monotonic()
    setup = twin_setup(line, kv_capacity_tokens=pool)
    out = simulate_sessions(trace, setup, tokenizer, session_features(line))
    calls = [
        (c["sid"], c["sent"] + c["ttft_s"], c["end"], c["prompt_tokens"])
        for r in out["sessions"]
        for c in r["calls"]
        if c["prompt_tokens"] is not None and c["ttft_s"] is not None
    ]
    bound = belady_bound(trace, calls, shared_tokens(trace, tokenizer), pool)
    saved = (
        {"calls": out["sessions"], "engine_records": out["engine_records"]} if save_calls else {}
    )
    return {
        "line": name,
        "summary": out["summary"],
        "belady_hit_rate": bound.hit_rate,
        "belady_non_global_hit_rate": bound.non_global_hit_rate,
        "engine_state": out["engine_state"],
        "session_table": out["session_table"],
        "config": out["config"],
        "wall_s": time.monotonic() - started,
        "git_commit": git_commit(),
        **saved,
    }


def _job(args: tuple[str, SessionParams, int, int, str, bool]) -> dict[str, Any]:
    name, params, seed, pool, tokenizer_spec, save_calls = args
    tokenizer = load_tokenizer(tokenizer_spec)
    trace = build_session_trace(params, tokenizer, seed)
    return run_line(name, trace, pool, tokenizer, save_calls)


def unlimited_reference(params: SessionParams, tokenizer: Tokenizer, seed: int) -> dict[str, Any]:
    """The trace of `params` played by sglang-lru with a pool that never evicts: the
    live KV a point's pool is a fraction of, and the bounds without eviction."""
    trace = build_session_trace(params, tokenizer, seed)
    ref = run_line("sglang-lru", trace, UNLIMITED_TOKENS, tokenizer)
    return {
        "live_history_tokens": ref["summary"]["live_history_tokens"],
        "live_unique_tokens": ref["summary"]["live_unique_tokens"],
        "unlimited": ref["summary"],
        "unlimited_kv_bound": asdict(unlimited_kv_bound(trace, tokenizer)),
        "trace": trace_summary(trace),
    }


def pool_tokens(base: SessionParams, reference: dict[str, Any], kv_fraction: float) -> int:
    """A point's pool: `kv_fraction` of the mean live KV (`pool_basis`) of its reference."""
    basis = "live_unique_tokens" if base.pool_basis == "unique" else "live_history_tokens"
    return max(1, int(kv_fraction * reference[basis]["mean"]))


def sweep(
    base: SessionParams,
    points: list[Point],
    lines: tuple[str, ...],
    out: Path,
    *,
    seed: int = 0,
    tokenizer_spec: str = "builtin",
    jobs: int = 1,
    real_speed: float | None = None,
    save_calls: bool = False,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every line at every point; writes `out/results.json` and `out/report.md`. With
    `real_speed`, the lines run on the real stack (`session_real`) at that engine speed,
    one after the other; the pool still comes from the twin's unlimited run. With
    `save_calls`, each run's per-call records go to `out/calls/` (`save_call_records`)."""
    tokenizer = load_tokenizer(tokenizer_spec)
    out.mkdir(parents=True, exist_ok=True)
    reference: dict[tuple[float, float], dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=jobs) as pool_:
        for point in points:
            params = replace(base, session_rate=point.rate, tool_scale=point.tool_scale)
            key = (point.rate, point.tool_scale)
            if key not in reference:
                reference[key] = unlimited_reference(params, tokenizer, seed)
                mean = reference[key]["live_unique_tokens"]["mean"]
                jct = reference[key]["unlimited"]["mean_jct_ms"] / 1e3
                log(f"rate {point.rate} scale {point.tool_scale}: live unique KV {mean:.0f} "
                    f"tokens (mean), unlimited JCT {jct:.1f} s")  # fmt: skip
            pool = pool_tokens(base, reference[key], point.kv_fraction)
            work = [(name, params, seed, pool, tokenizer_spec, save_calls) for name in lines]
            if real_speed is None:
                results = pool_.map(_job, work)
            else:
                trace = build_session_trace(params, tokenizer, seed)
                logs = out / "logs"
                results = (
                    run_real_line(
                        REAL_LINES[name], trace, pool, real_speed, tokenizer, logs, save_calls
                    )
                    for name in lines
                )
            calls_trace = build_session_trace(params, tokenizer, seed) if save_calls else None
            for result in results:
                if calls_trace is not None:
                    save_call_records(out, point, result, calls_trace)
                row = {**asdict(point), "pool_tokens": pool, **reference[key], **result}
                rows.append(row)
                s = result["summary"]
                jct = None if s["mean_jct_ms"] is None else s["mean_jct_ms"] / 1e3
                log(f"  {point} pool {pool} {result['line']:19s} "
                    f"p99 {_shown(s['p99_ttft_ms'], '.0f')} ms JCT {_shown(jct, '.1f')} s "
                    f"hit {_shown(s['hit_rate'], '.3f')} "
                    f"(Belady {_shown(result['belady_hit_rate'], '.3f')})")  # fmt: skip
            (out / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    (out / "report.md").write_text(report(rows, base, seed))
    return rows


def save_call_records(out: Path, point: Point, result: dict[str, Any], trace: SessionTrace) -> Path:
    """Take `calls` and `engine_records` out of `result` and write them, one JSON a
    line per call, to `out/calls/<line>-<rate>-<tool scale>-<fraction>.jsonl`: the
    client's times (sent, TTFT, end; trace seconds), prompt, cached and completion
    tokens as served, the tool's time before the next call, and the engine's timeline
    of the same request (`engine`, modeled seconds; matched by rid `<sid>-<call:02d>`)."""
    calls = result.pop("calls")
    engine = {r["rid"]: r for r in result.pop("engine_records")}
    steps = {s.sid: s.steps for s in trace.sessions}
    path = (
        out
        / "calls"
        / (
            f"{result['line'].replace('/', '_')}-{point.rate:g}-{point.tool_scale:g}-"
            f"{point.kv_fraction:g}.jsonl"
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for session in calls:
            for call in session["calls"]:
                sid, number = call["sid"], call["call"]
                step = steps[sid][number] if number < len(steps[sid]) else None
                row = {
                    **call,
                    "first_token": (
                        None if call["ttft_s"] is None else call["sent"] + call["ttft_s"]
                    ),
                    "tool_s": step.duration_s if step is not None else None,
                    "arrival": session["arrival"],
                    "engine": engine.get(f"{sid}-{number:02d}"),
                }
                f.write(json.dumps(row) + "\n")
    return path


def _shown(value: float | None, spec: str) -> str:
    """`value` in `spec`, or "–" when the run has none (no call answered, no session
    completed: a pool smaller than every prompt)."""
    return "–" if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if not a or not b else f"{a / b:.2f}"


def _reprefill_table(group: list[dict[str, Any]]) -> list[str]:
    """Each line's re-prefilled history tokens by cause (`reprefill`), where measured."""
    measured = [r for r in group if "reprefill_tokens" in r["summary"]]
    if not measured:
        return []
    causes = [c.value for c in Cause if any(c.value in r["summary"]["reprefill_tokens"]
                                            for r in measured)]  # fmt: skip
    out = [
        "",
        "History the continuations re-prefilled, in tokens, by cause "
        "(`prism_proxy.admission.reprefill`):",
        "",
        f"| line | re-prefilled (of history) | {' | '.join(causes)} |",
        f"|---|---|{'---|' * len(causes)}",
    ]
    for row in measured:
        counts = row["summary"]["reprefill_tokens"]
        parts = " | ".join(f"{counts[c]:,}" for c in causes)
        out.append(f"| {row['line']} | {counts['total']:,} (of {counts['history']:,}) | {parts} |")
    return out


def report(rows: list[dict[str, Any]], base: SessionParams, seed: int) -> str:
    """One table per point: every line's TTFT, JCT and hit rates beside the Belady bound,
    then prism+sessions against the best native line and the best other line."""
    engine = rows[0].get("engine", "twin") if rows else "twin"
    where = (
        f"on the real stack (prism-sim at {rows[0]['speed']:g}x)"
        if engine == "real"
        else "in the twin"
    )
    tools = (
        f"tool durations lognormal (median {base.tool_median_s} s, σ {base.tool_sigma}) × "
        f"tool scale, outputs lognormal (median {base.output_median_tokens} tokens)"
        if base.tool_model == "independent"
        else "tools behave like their kind (`tool_model` by_tool: lookup, write, search, "
        "code, human; `loadgen.session_trace.TOOL_KINDS`) × tool scale"
    )
    lines = [
        f"# agent_sessions {where}",
        "",
        f"Trace: {base.num_sessions} sessions, seed {seed}, calls {base.min_calls}–"
        f"{base.max_calls}, {tools}.",
        "",
    ]
    points: dict[tuple[float, float, float], list[dict[str, Any]]] = {}
    for row in rows:
        points.setdefault((row["rate"], row["tool_scale"], row["kv_fraction"]), []).append(row)
    for (rate, scale, fraction), group in points.items():
        first = group[0]
        pool, histories = first["pool_tokens"], first["live_history_tokens"]["mean"]
        if "live_unique_tokens" not in first:  # rows made before the unique measure
            basis = f"live histories ({pool:,} of {histories:,.0f} tokens)"
        elif base.pool_basis == "histories":
            live = first["live_unique_tokens"]["mean"]
            basis = f"live histories ({pool:,} of {histories:,.0f} tokens; "
            basis += f"live unique KV: {live:,.0f})"
        else:
            live = first["live_unique_tokens"]["mean"]
            basis = f"live unique KV ({pool:,} of {live:,.0f} tokens; "
            basis += f"live histories counted per session: {histories:,.0f})"
        lines += [
            f"## {rate} sessions/s, tool scale {scale}, pool {fraction:g} × {basis}",
            "",
            "| line | P50 TTFT ms | P99 TTFT ms | mean JCT s | hit | non-global hit | "
            "Belady hit (own run) | completed |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in group:
            s = row["summary"]
            jct = None if s["mean_jct_ms"] is None else s["mean_jct_ms"] / 1e3
            lines.append(
                f"| {row['line']} | {_shown(s['p50_ttft_ms'], '.0f')} | "
                f"{_shown(s['p99_ttft_ms'], '.0f')} | {_shown(jct, '.1f')} | "
                f"{_shown(s['hit_rate'], '.3f')} | {_shown(s['non_global_hit_rate'], '.3f')} | "
                f"{_shown(row['belady_hit_rate'], '.3f')} | "
                f"{s['completed_sessions']}/{s['sessions']} |"
            )
        lines += _reprefill_table(group)
        # the comparison needs every line's numbers (none when a line answered nothing)
        answered = all(r["summary"]["p99_ttft_ms"] is not None for r in group)
        by = {row["line"]: row["summary"] for row in group} if answered else {}
        ours = by.get("prism+sessions")
        natives = [by[n] for n in NATIVE if n in by]
        if ours and natives:
            best_native = min(natives, key=lambda s: s["p99_ttft_ms"])
            others = [s for n, s in by.items() if n in OTHERS]
            best_other = min(others, key=lambda s: s["p99_ttft_ms"]) if others else None
            lru = by.get("sglang-lru")
            own = next(r for r in group if r["line"] == "prism+sessions")
            jct = _ratio(ours["mean_jct_ms"], best_native["mean_jct_ms"])
            lines += [
                "",
                f"prism+sessions: mean JCT {jct}"
                f"× the best native line's (by P99); P99 TTFT "
                f"{_ratio(ours['p99_ttft_ms'], best_native['p99_ttft_ms'])}× it and "
                f"{_ratio(ours['p99_ttft_ms'], best_other['p99_ttft_ms'] if best_other else None)}"
                f"× the best other line's; hit rate "
                f"{100 * (ours['hit_rate'] - (lru['hit_rate'] if lru else 0)):+.1f} points over "
                f"sglang-lru, {100 * (own['belady_hit_rate'] - ours['hit_rate']):.1f} points "
                "under its Belady bound.",
            ]
        lines.append("")
    return "\n".join(lines)


# the lines prism+sessions is held against ("the best other line")
OTHERS = ("sglang-lru", "sglang-lpm", "sglang-slru", "sglang-tlru", "fifo", "continuum-style",
          "prism")  # fmt: skip


def seeds_report(dirs: list[Path], kv_fraction: float | None = None) -> str:
    """The same point run on several seeds (one `results.json` per dir, its rows at
    `kv_fraction` when given): each line's mean over seeds with a 95 % t interval, then
    the must-show ratios seed by seed."""
    from loadgen.reports.report import t_interval

    runs = [
        [
            row
            for row in json.loads((d / "results.json").read_text())
            if kv_fraction is None or row["kv_fraction"] == kv_fraction
        ]
        for d in dirs
    ]
    names = [row["line"] for row in runs[0]]
    by_seed = [{row["line"]: row for row in run} for run in runs]

    def interval(values: list[float]) -> str:
        found = t_interval(values)
        if found is None or found.half_width is None:
            return "–" if found is None else f"{found.mean:.3g}"
        return f"{found.mean:.3g} ± {found.half_width:.2g}"

    out = [
        f"{len(dirs)} seeds ({', '.join(d.name for d in dirs)}); mean ± 95 % half-width",
        "",
        "| line | P99 TTFT s | mean JCT s | hit | non-global hit | Belady hit (own run) |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        rows = [seed[name] for seed in by_seed if name in seed]
        p99 = [r["summary"]["p99_ttft_ms"] / 1e3 for r in rows]
        jct = [r["summary"]["mean_jct_ms"] / 1e3 for r in rows]
        hit = [r["summary"]["hit_rate"] for r in rows]
        non_global = [r["summary"]["non_global_hit_rate"] for r in rows]
        out.append(
            f"| {name} | {interval(p99)} | {interval(jct)} | {interval(hit)} | "
            f"{interval(non_global)} | {interval([r['belady_hit_rate'] for r in rows])} |"
        )
    out += [
        "",
        "| seed | JCT / best native | P99 / best native | P99 / best other | hit − sglang-lru "
        "(points) | Belady − hit (points) |",
        "|---|---|---|---|---|---|",
    ]
    for d, seed in zip(dirs, by_seed, strict=True):
        ours = seed["prism+sessions"]["summary"]
        native = min((seed[n]["summary"] for n in NATIVE if n in seed),
                     key=lambda s: s["p99_ttft_ms"])  # fmt: skip
        other = min((seed[n]["summary"] for n in OTHERS if n in seed),
                    key=lambda s: s["p99_ttft_ms"])  # fmt: skip
        out.append(
            f"| {d.name} | {ours['mean_jct_ms'] / native['mean_jct_ms']:.2f} | "
            f"{ours['p99_ttft_ms'] / native['p99_ttft_ms']:.2f} | "
            f"{ours['p99_ttft_ms'] / other['p99_ttft_ms']:.2f} | "
            f"{100 * (ours['hit_rate'] - seed['sglang-lru']['summary']['hit_rate']):+.1f} | "
            f"{100 * (seed['prism+sessions']['belady_hit_rate'] - ours['hit_rate']):.1f} |"
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="one point over seeds: means and ratios")
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep dirs, one per seed")
    parser.add_argument("--kv-fraction", type=float, default=None)
    args = parser.parse_args()
    print(seeds_report(args.dirs, args.kv_fraction))
