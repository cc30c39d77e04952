"""The tail report of an agent-sessions run's call records (`loadgen.reports.call_tail`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.reports.call_tail import describe, main, tail


def _call(sid: str, n: int, ttft: float, prompt: int, cached: int, called: str | None, tool: float):
    return {"sid": sid, "call": n, "ttft_s": ttft, "prompt_tokens": prompt,
            "cached_tokens": cached, "called": called, "tool_s": tool, "error": None}  # fmt: skip


def _run() -> list[dict]:
    """99 quick calls over 33 sessions, then one slow continuation after a human's step
    and one slow first call; one failed call that must not count."""
    calls = [
        _call(f"s{i}", n, 0.1 + 0.001 * n, 1000, 900, "get_order_status", 1.0)
        for i in range(33)
        for n in range(3)
    ]
    calls.append(_call("s0", 3, 2.0, 9000, 1000, "get_order_status", 1.0))
    # s0's call 2 (8,520 tokens with its answer) paused for a human; call 3 found 1,000
    # of them cached: 7,520 prefilled again, 480 new
    calls[2].update(called="transfer_to_human_agents", tool_s=120.0, prompt_tokens=8500)
    calls[2]["completion_tokens"] = 20
    calls.append(_call("s99", 0, 1.5, 5000, 0, "search_flights", 2.0))
    calls.append({**_call("s98", 0, 9.0, 10, 0, "x", 0.0), "error": "boom"})
    return calls


def test_the_tail_is_the_slowest_calls_with_their_pauses() -> None:
    cut, found = tail(_run(), share=0.02)
    assert cut == 1.5
    assert [(t.ttft_s, t.uncached, t.after, t.paused_by, t.pause_s, t.lost) for t in found] == [
        (2.0, 8000, True, "transfer_to_human_agents", 120.0, 7520),
        (1.5, 5000, False, None, None, 0),
    ]
    with pytest.raises(SystemExit):
        main(["x.jsonl", "--share", "1.5"])


def test_the_report_names_the_pauses_by_kind(tmp_path: Path, capsys) -> None:
    path = tmp_path / "line-0.5-1-0.5.jsonl"
    path.write_text("\n".join(json.dumps(call) for call in _run()))
    assert main([str(path), str(path), "--share", "0.02"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: 2 calls at or above 1.500 s"
    assert "a session's first call: 1 (uncached median 5000)" in out[1]
    assert out[2] == "  continuations: 1, after a tool of kind human 1"
    assert out[3] == (
        "  their pause median 120.0 s; uncached median 8000 tokens, of which history "
        "prefilled again 7520 and new 480"
    )
    assert out[4] == "  lost more than half their history: 1 (after human 1)"
    assert out[10] == "the 2 runs' tails: 4 calls"


def test_a_continuation_after_an_answer_without_a_call_is_still_one() -> None:
    calls = [_call("s0", 0, 0.1, 1000, 0, None, 0.0), _call("s0", 1, 3.0, 1500, 1000, "x", 0)]
    _, found = tail(calls, share=0.5)
    assert [(t.after, t.paused_by) for t in found] == [(True, None)]
    assert "after a tool of kind no tool 1" in "\n".join(describe("run", None, found))
