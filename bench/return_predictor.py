"""How well the proxy predicts when a paused agent session returns (issue 37).

    python -m bench.return_predictor [--seeds 0,1,2,3,4] [--sessions 200] [--rate 2]
                                     [--tool-model by_tool]

For each seed, the agent_sessions trace (`loadgen.session_trace`, `--tool-model`) is
played in time order: a session pauses when a call ends in a tool call and returns when
the tool has run (`--call-s` of model time between a return and the next pause, the
same for every call, only to order the events). At each pause the model predicts the
delay from what it has seen so far; at each return it learns the delay. So every
prediction is of a delay the model has not seen (held out, online).

Two predictors, side by side:

* `tool`: `prism_proxy.admission.returns.ReturnModel`, per (agent type, tool);
* `head`: the same model with every tool named alike, i.e. delays per agent type only
  (what the session keeper's TTL rule learns from).

Printed per tool kind (`loadgen.session_trace.tool_kind`) and overall: the returns
predicted, the median absolute error in seconds, the mean absolute error of the log
(a factor: 0.69 is a factor of two), and r² of log delay (1 − residual / total sum of
squares around the kind's own mean; negative when a prediction is worse than that
mean). Errors are over returns after each model's warm-up (`min_samples` per key).
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadgen.workloads.session_trace import (
    SessionParams,
    SessionTrace,
    build_session_trace,
    tool_kind,
)
from prism_proxy.admission.returns import ANY_TOOL, ReturnModel
from prism_tokens.tokenizer import load_tokenizer

PREDICTORS = ("tool", "head")


@dataclass
class Scores:
    """(predicted, actual) delays of one predictor over one group of returns."""

    pairs: list[tuple[float, float]] = field(default_factory=list)

    def add(self, predicted: float, actual: float) -> None:
        self.pairs.append((predicted, actual))

    def row(self) -> tuple[int, float, float, float]:
        """(n, median |error| s, mean |log error|, r² of log delay)."""
        n = len(self.pairs)
        if n == 0:
            return 0, math.nan, math.nan, math.nan
        errors = sorted(abs(p - a) for p, a in self.pairs)
        logs = [(math.log(p), math.log(a)) for p, a in self.pairs]
        mean_actual = sum(a for _, a in logs) / n
        residual = sum((p - a) ** 2 for p, a in logs)
        total = sum((a - mean_actual) ** 2 for _, a in logs)
        r2 = 1.0 - residual / total if total > 0 else math.nan
        mean_log = sum(abs(p - a) for p, a in logs) / n
        return n, errors[n // 2], mean_log, r2


def play(trace: SessionTrace, call_s: float, scores: dict[tuple[str, str], Scores]) -> None:
    """Predict each pause's delay, learn it at its return, in time order."""
    models = {name: ReturnModel() for name in PREDICTORS}
    # (time, order, kind, session index, step index); returns sort before pauses at a tie
    events: list[tuple[float, int, str, int, int]] = []
    for index, session in enumerate(trace.sessions):
        if session.steps:
            heapq.heappush(events, (session.arrival + call_s, 1, "pause", index, 0))
    predicted: dict[tuple[int, int], dict[str, tuple[float, str]]] = {}
    while events:
        now, _, kind, index, step = heapq.heappop(events)
        session = trace.sessions[index]
        tool = session.steps[step].tool
        keys = {"tool": tool, "head": ANY_TOOL}
        if kind == "pause":
            fits = {name: models[name].fit(session.domain, keys[name]) for name in PREDICTORS}
            predicted[index, step] = {name: (f.median_s(), f.level) for name, f in fits.items()}
            heapq.heappush(events, (now + session.steps[step].duration_s, 0, "return", index, step))
            continue
        delay = session.steps[step].duration_s
        guesses = predicted.pop((index, step))
        for name in PREDICTORS:
            guess, level = guesses[name]
            if level != "prior":
                scores[name, tool_kind(tool)].add(guess, delay)
                scores[name, "all"].add(guess, delay)
            models[name].observe(session.domain, keys[name], delay)
        if step + 1 < len(session.steps):
            heapq.heappush(events, (now + call_s, 1, "pause", index, step + 1))


def run(args: argparse.Namespace) -> dict[tuple[str, str], Scores]:
    tokenizer = load_tokenizer("builtin")
    scores: dict[tuple[str, str], Scores] = {}
    for seed in args.seeds:
        params = SessionParams(
            num_sessions=args.sessions, session_rate=args.rate, tool_model=args.tool_model
        )
        trace = build_session_trace(params, tokenizer, seed)
        seed_scores: dict[tuple[str, str], Scores] = {}
        for name in PREDICTORS:
            for group in (*KINDS, "all"):
                seed_scores[name, group] = Scores()
        play(trace, args.call_s, seed_scores)
        for key, value in seed_scores.items():
            scores.setdefault(key, Scores()).pairs.extend(value.pairs)
    return scores


KINDS = ("lookup", "write", "search", "code", "human")


def report(scores: dict[tuple[str, str], Scores], args: argparse.Namespace) -> None:
    print(
        f"return delays predicted online: seeds {','.join(map(str, args.seeds))}, "
        f"{args.sessions} sessions each at {args.rate:g}/s, tool model {args.tool_model}"
    )
    print("| tool kind | predictor | returns | median abs error | mean abs log error | r² (log) |")
    print("|---|---|---|---|---|---|")
    for group in (*KINDS, "all"):
        for name in PREDICTORS:
            n, median, mean_log, r2 = scores.get((name, group), Scores()).row()
            if n == 0:
                continue
            print(f"| {group} | {name} | {n} | {median:.3f} s | {mean_log:.2f} | {r2:.2f} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.return_predictor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--seeds", default="0,1,2,3,4", type=lambda s: [int(x) for x in s.split(",")]
    )
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--call-s", type=float, default=0.5, help="model time per call")
    parser.add_argument("--tool-model", choices=("by_tool", "independent"), default="by_tool")
    args = parser.parse_args(argv)
    report(run(args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
