"""Where two runs of the same agent sessions differ, call by call: the per-call records
`prism-loadgen sessions --save-calls` writes (`OUT/calls/<line>-<rate>-<scale>-<fraction>.jsonl`),
of the twin and the real stack or of two lines, matched by (session, call number).

    python -m loadgen.reports.call_gap TWIN.jsonl REAL.jsonl

Printed per component, each run's median and mean, the mean difference (second minus
first) and that difference summed over a session's calls (what it adds to the mean job
time): the client's time to its first delta, and within it the engine's wait for
admission and its prefill; the engine's decode; the client's whole call; the answer's
tokens as served and the tokens it asked for; the time from a call's end to the next
call's send (the tool's run); and the engine's waiting and running requests when the
call arrived. The engine's part needs its timeline of the call (the twin's always, the
real engine's when the client's rid reached it: lines without the proxy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Call = dict[str, Any]
Key = tuple[str, int]


def load(path: Path) -> dict[Key, Call]:
    """A run's calls by (session, call number)."""
    rows = (json.loads(line) for line in path.read_text().splitlines() if line)
    return {(row["sid"], row["call"]): row for row in rows}


def _engine(call: Call, start: str, end: str) -> float | None:
    engine = call.get("engine")
    if not engine or engine.get(start) is None or engine.get(end) is None:
        return None
    return engine[end] - engine[start]


def _queue(calls: dict[Key, Call]) -> dict[Key, tuple[int, int]]:
    """(waiting, running) requests at the engine when each call arrived there."""
    timed = {k: c["engine"] for k, c in calls.items() if c.get("engine")}
    spans = [(e["arrival_s"], e["admitted_s"], e["finish_s"]) for e in timed.values()]
    out = {}
    for key, engine in timed.items():
        t = engine["arrival_s"]
        waiting = sum(1 for a, admitted, _ in spans if a < t < admitted)
        running = sum(1 for _, admitted, finish in spans if admitted <= t < finish)
        out[key] = (waiting, running)
    return out


def components(calls: dict[Key, Call]) -> dict[str, Callable[[Key], float | None]]:
    """Each component's value for one call of `calls` (None: not known)."""
    queue = _queue(calls)

    def gap_to_next(key: Key) -> float | None:
        following = calls.get((key[0], key[1] + 1))
        return None if following is None else following["sent"] - calls[key]["end"]

    def client(key: Key, what: str) -> float | None:
        call = calls[key]
        if call.get("ttft_s") is None:
            return None
        return call["ttft_s"] if what == "ttft" else call["end"] - call["sent"] - call["ttft_s"]

    return {
        "send -> first delta (client) s": lambda k: client(k, "ttft"),
        "  engine wait for admission s": lambda k: _engine(calls[k], "arrival_s", "admitted_s"),
        "  engine prefill s": lambda k: _engine(calls[k], "admitted_s", "first_token_s"),
        "engine decode s": lambda k: _engine(calls[k], "first_token_s", "finish_s"),
        "first delta -> end (client) s": lambda k: client(k, "decode"),
        "whole call (client) s": lambda k: calls[k]["end"] - calls[k]["sent"],
        "answer tokens served": lambda k: calls[k].get("completion_tokens"),
        "answer tokens asked": lambda k: (calls[k].get("engine") or {}).get("max_new_tokens"),
        "end -> next send s": gap_to_next,
        "engine waiting at arrival": lambda k: queue[k][0] if k in queue else None,
        "engine running at arrival": lambda k: queue[k][1] if k in queue else None,
    }


def compare(first: dict[Key, Call], second: dict[Key, Call]) -> list[dict[str, Any]]:
    """Per component: both runs' median and mean over the calls both made, the mean
    difference (second - first) and its sum per session."""
    keys = sorted(first.keys() & second.keys())
    sessions = len({sid for sid, _ in keys}) or 1
    ones, twos = components(first), components(second)
    rows = []
    for name, of_first in ones.items():
        pairs = [(of_first(k), twos[name](k)) for k in keys]
        known = [(a, b) for a, b in pairs if a is not None and b is not None]
        if not known:
            continue
        a, b = [p[0] for p in known], [p[1] for p in known]
        difference = [y - x for x, y in known]
        rows.append({
            "component": name,
            "calls": len(known),
            "first": (statistics.median(a), statistics.fmean(a)),
            "second": (statistics.median(b), statistics.fmean(b)),
            "mean_difference": statistics.fmean(difference),
            "per_session": sum(difference) / sessions,
        })  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadgen.reports.call_gap")
    parser.add_argument("first", type=Path, help="a run's calls (OUT/calls/*.jsonl)")
    parser.add_argument("second", type=Path, help="another run's calls, of the same trace")
    args = parser.parse_args(argv)
    first, second = load(args.first), load(args.second)
    matched = len(first.keys() & second.keys())
    print(f"{matched} calls matched ({len(first)} and {len(second)} made)")
    print("| component | first median / mean | second median / mean | mean diff | per session |")
    print("|---|---|---|---|---|")
    for row in compare(first, second):
        (m1, a1), (m2, a2) = row["first"], row["second"]
        print(
            f"| {row['component'].strip()} | {m1:.3f} / {a1:.3f} | {m2:.3f} / {a2:.3f} | "
            f"{row['mean_difference']:+.3f} | {row['per_session']:+.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
