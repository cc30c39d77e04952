"""What the engine's evictions take from the requests waiting in its queue, in the twin.

    python -m bench.queue_evictions --seed 10 --rate 0.5 --tool-scale 1 --kv-fraction 0.5 \
        --trace-param tool_model=by_tool --trace-param pool_basis=histories \
        --lines sglang-lru+host,prism+sessions+returns/unpaced+host

Takes `prism-loadgen sessions`' trace and line arguments (one point: the first rate,
tool scale and pool fraction), sizes the pool as that sweep does, and plays the
agent_sessions trace through the twin one line at a time. Every token the device's radix
cache evicts is counted by where it lay when it went: on the cached path of a request
waiting in the engine's queue, by that request's place in arrival order (0: the oldest,
the one FCFS admits next; places past 3 counted as 4+), or on no waiting request's path.
For a line with DART the evicted node's DART class is given too
(`backend_plugin.dart.keys`: 0 private or discarded, 1 segment, 2 retained, 3 protected).

It answers whether a policy's evictions make the queue's next request prefill its cached
history again: under SGLang's LRU the next request's path is the freshest (each
admission attempt matches it, which refreshes its access time), so LRU evicts it last.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from typing import Any

from loadgen.cli import build_parser, session_params
from loadgen.experiments.session_lines import LINES
from loadgen.experiments.session_sweep import pool_tokens, unlimited_reference
from loadgen.twin.line_setup import session_features, twin_setup
from loadgen.twin.session_twin import SessionTwin
from loadgen.workloads.session_trace import build_session_trace
from prism_tokens.tokenizer import load_tokenizer

LAST_PLACE = 4  # places in the queue from here on are counted together


class QueueEvictions:
    """Counts a twin's device evictions by (place in the queue, DART class)."""

    def __init__(self, twin: SessionTwin) -> None:
        self.twin = twin
        self.tokens: Counter[tuple[int | None, int | None]] = Counter()
        self._places: dict[int, int] | None = None
        strategy = getattr(twin.engine.extension, "strategy", None)
        self._key = None if strategy is None else strategy.get_priority
        cache = twin.engine.cache
        cache.evict_begin_listeners.append(self.begin_pass)
        cache.evict_listeners.append(self.on_evict)

    def begin_pass(self) -> None:
        """An eviction pass starts: the queue and the tree may have changed since the
        last one (within a pass neither does, but for the nodes it removes)."""
        self._places = None

    def _queue_places(self) -> dict[int, int]:
        """id(node) -> the place of the oldest waiting request whose cached path holds it."""
        if self._places is None:
            scheduler, self._places = self.twin.scheduler, {}
            waiting = sorted(scheduler.waiting, key=lambda req: req.arrival_s)
            for place, req in enumerate(waiting):
                for node, _start, _end in scheduler.cache.walk(req.input_ids[:-1]):
                    self._places.setdefault(id(node), min(place, LAST_PLACE))
        return self._places

    def on_evict(self, node: Any) -> None:
        place = self._queue_places().get(id(node))
        dart_class = None if self._key is None else self._key(node)[0]
        self.tokens[place, dart_class] += len(node.key)


def table(name: str, tokens: Counter[tuple[int | None, int | None]]) -> list[str]:
    total = sum(tokens.values())
    places: list[int | None] = [*range(LAST_PLACE + 1), None]
    classes = sorted({c for _, c in tokens}, key=lambda c: -1 if c is None else c)
    rows = [f"{name}: {total:,} tokens evicted", "| place in queue | tokens | share |"
            + "".join(f" class {c} |" for c in classes if c is not None)]  # fmt: skip
    rows.append("|---|---|---|" + "---|" * sum(c is not None for c in classes))
    for place in places:
        here = {c: tokens.get((place, c), 0) for c in classes}
        count = sum(here.values())
        label = "none" if place is None else (f"{place}+" if place == LAST_PLACE else str(place))
        shares = "".join(f" {here[c]:,} |" for c in classes if c is not None)
        rows.append(f"| {label} | {count:,} | {count / max(total, 1):.3f} |{shares}")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(["sessions", "--out", "-", *(argv or sys.argv[1:])])
    names = args.lines.split(",") if args.lines else []
    unknown = [name for name in names if name not in LINES]
    if not names or unknown:
        raise SystemExit(f"--lines: one or more of {', '.join(LINES)}")
    base = session_params(args)
    rate, scale, fraction = (float(x.split(",")[0]) for x in
                             (args.rate, args.tool_scale, args.kv_fraction))  # fmt: skip
    tokenizer = load_tokenizer(args.tokenizer)
    params = replace(base, session_rate=rate, tool_scale=scale)
    pool = pool_tokens(base, unlimited_reference(params, tokenizer, args.seed), fraction)
    trace = build_session_trace(params, tokenizer, args.seed)
    print(f"seed {args.seed}, {rate} sessions/s, tool scale {scale}, pool {pool:,} tokens\n")
    for name in names:
        line = LINES[name]
        twin = SessionTwin(trace, twin_setup(line, kv_capacity_tokens=pool), tokenizer,
                           session_features(line))  # fmt: skip
        probe = QueueEvictions(twin)
        twin.run()
        print("\n".join(table(name, probe.tokens)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
