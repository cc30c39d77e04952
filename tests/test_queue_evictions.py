"""The probe of what evictions take from the engine's queue (`bench.queue_evictions`),
on the twin."""

from __future__ import annotations

from typing import Any

import pytest

from bench.queue_evictions import LAST_PLACE, QueueEvictions, main
from loadgen.experiments.session_lines import LINES
from loadgen.twin.line_setup import session_features, twin_setup
from loadgen.twin.session_twin import SessionTwin
from loadgen.workloads.session_trace import SessionParams, build_session_trace
from prism_tokens.tokenizer import load_tokenizer

# Sessions arriving faster than the engine serves them, over a pool a few histories fill,
# so that requests wait in the engine's queue while others evict.
LOADED = SessionParams(num_sessions=30, session_rate=6.0, tool_scale=0.3, min_calls=4,
                       max_calls=6)  # fmt: skip
POOL = 7_500


def _place_from_scratch(twin: SessionTwin, node: Any) -> int | None:
    """The place of the oldest waiting request whose cached path holds `node`."""
    waiting = sorted(twin.scheduler.waiting, key=lambda req: req.arrival_s)
    for place, req in enumerate(waiting):
        if any(n is node for n, _, _ in twin.scheduler.cache.walk(req.input_ids[:-1])):
            return min(place, LAST_PLACE)
    return None


@pytest.mark.parametrize("name", ["sglang-lru", "prism+sessions+returns"])
def test_every_evicted_token_is_counted_once_by_its_place_in_the_queue(name: str) -> None:
    tokenizer = load_tokenizer("builtin")
    trace = build_session_trace(LOADED, tokenizer, seed=3)
    line = LINES[name]
    twin = SessionTwin(trace, twin_setup(line, kv_capacity_tokens=POOL), tokenizer,
                       session_features(line))  # fmt: skip
    probe = QueueEvictions(twin)
    expected: dict[int | None, int] = {}

    def check(node: Any) -> None:  # runs after the probe's own listener
        place = _place_from_scratch(twin, node)
        expected[place] = expected.get(place, 0) + len(node.key)

    twin.engine.cache.evict_listeners.append(check)
    twin.run()

    assert sum(probe.tokens.values()) == twin.engine.cache.evicted_tokens_total > 0
    counted: dict[int | None, int] = {}
    for (place, _), tokens in probe.tokens.items():
        counted[place] = counted.get(place, 0) + tokens
    assert counted == expected
    assert any(place is not None for place in counted)  # the queue was reached
    classes = {dart_class for _, dart_class in probe.tokens}
    if line.eviction == "dart":
        assert classes and classes <= {0, 1, 2, 3}
    else:
        assert classes == {None}


def test_the_command_prints_one_table_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--seed", "3", "--sessions", "12", "--rate", "6", "--tool-scale", "0.3",
            "--kv-fraction", "0.2", "--lines", "sglang-lru,prism+sessions+returns"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("seed 3, 6.0 sessions/s, tool scale 0.3, pool ")
    assert "sglang-lru: " in out and "prism+sessions+returns: " in out
    assert "| place in queue | tokens | share | class 0 |" in out
    with pytest.raises(SystemExit):
        main(["--lines", "no-such-line"])
