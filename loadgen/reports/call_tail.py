"""What the slowest calls of an agent-sessions run are: the per-call records `prism-loadgen
sessions --save-calls` writes (`OUT/calls/<line>-<rate>-<scale>-<fraction>.jsonl`).

    python -m loadgen.reports.call_tail RUN.jsonl [RUN.jsonl ...] [--share 0.01]

For each run, its slowest calls by TTFT, a `--share` of its answered calls (1 %: about
those at or above its P99): how many, how many are a session's first call and how many a
continuation, what the continuation's pause was (the kind of tool the call before it
called, `session_trace.tool_kind`, and how long that tool ran), and what it prefilled
again of its history (prompt tokens less cached). Then the same over every run given.
Answers whether a tail is the engine's queue (short prompts waiting) or re-prefilled
histories (and which pauses lost their cache).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.reports.call_gap import load
from loadgen.workloads.session_trace import tool_kind

Call = dict[str, Any]


@dataclass(frozen=True)
class TailCall:
    """One call of the tail: its TTFT, its uncached tokens, and for a continuation
    (`after` the call before it) its pause: the tool that call called (None: it called
    none) and how long the tool ran. A continuation's `lost`: the part of its uncached tokens that
    was history (the call before's prompt and answer) prefilled again; the rest is new
    (the tool's output and what follows it)."""

    ttft_s: float
    uncached: int
    after: bool = False
    paused_by: str | None = None
    pause_s: float | None = None
    history: int = 0
    lost: int = 0


def tail(calls: Sequence[Call], share: float) -> tuple[float, list[TailCall]]:
    """The slowest `share` of the answered calls (at least one; ties at the cut go in),
    slowest first, and the TTFT that cuts them off."""
    answered = [c for c in calls if c.get("error") is None and c.get("ttft_s") is not None]
    if not answered:
        return 0.0, []
    ttfts = sorted(c["ttft_s"] for c in answered)
    cut = ttfts[len(ttfts) - max(1, round(share * len(ttfts)))]
    by_key = {(c["sid"], c["call"]): c for c in answered}
    out = []
    for call in answered:
        if call["ttft_s"] < cut:
            continue
        before = by_key.get((call["sid"], call["call"] - 1))
        uncached = max(0, call["prompt_tokens"] - call["cached_tokens"])
        if call["call"] == 0 or before is None:
            out.append(TailCall(call["ttft_s"], uncached))
            continue
        history = before["prompt_tokens"] + (before.get("completion_tokens") or 0)
        lost = min(uncached, max(0, history - call["cached_tokens"]))
        paused_by, pause_s = before.get("called"), before["tool_s"]
        out.append(TailCall(call["ttft_s"], uncached, True, paused_by, pause_s, history, lost))
    return cut, sorted(out, key=lambda t: -t.ttft_s)


def _kinds(calls: Sequence[TailCall]) -> str:
    """How many of `calls` came after each kind of tool, most first."""
    kinds = Counter("no tool" if t.paused_by is None else tool_kind(t.paused_by) for t in calls)
    return ", ".join(f"{kind} {n}" for kind, n in kinds.most_common()) or "none"


def describe(name: str, cut: float | None, calls: Sequence[TailCall]) -> list[str]:
    first = [t for t in calls if not t.after]
    continued = [t for t in calls if t.after]
    above = "" if cut is None else f" at or above {cut:.3f} s"
    lines = [f"{name}: {len(calls)} calls{above}"]
    if first:
        median = statistics.median(t.uncached for t in first)
        lines.append(f"  a session's first call: {len(first)} (uncached median {median:.0f})")
    if continued:
        lines.append(f"  continuations: {len(continued)}, after a tool of kind {_kinds(continued)}")
        pauses = [t.pause_s or 0.0 for t in continued]
        lines.append(
            f"  their pause median {statistics.median(pauses):.1f} s; uncached median "
            f"{statistics.median(t.uncached for t in continued):.0f} tokens, of which "
            f"history prefilled again {statistics.median(t.lost for t in continued):.0f} "
            f"and new {statistics.median(t.uncached - t.lost for t in continued):.0f}"
        )
        halves = [t for t in continued if 2 * t.lost > t.history]
        lines.append(f"  lost more than half their history: {len(halves)} (after {_kinds(halves)})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--share", type=float, default=0.01, help="the tail's share of calls")
    args = parser.parse_args(argv)
    if not 0 < args.share < 1:
        parser.error("--share must be in (0, 1)")
    every: list[TailCall] = []
    for path in args.runs:
        cut, found = tail(list(load(path).values()), args.share)
        every.extend(found)
        print("\n".join(describe(str(path), cut, found)))
    if len(args.runs) > 1 and every:
        print("\n".join(describe(f"the {len(args.runs)} runs' tails", None, every)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
