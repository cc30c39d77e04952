"""When paused agent sessions return: the return model, the `predicted` retention order
and the trace whose tools behave like their kind (issue 37)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from loadgen.workloads.session_trace import (
    TOOL_KINDS,
    SessionParams,
    build_session_trace,
    tool_kind,
)
from prism_proxy.admission.returns import ANY_TOOL, ReturnModel, tool_key
from prism_proxy.admission.sessions import SessionParams as TableParams
from prism_proxy.admission.sessions import SessionTable
from prism_tokens.tokenizer import load_tokenizer
from prism_wire import Retention


def test_the_model_learns_each_tools_median_and_falls_back_until_it_has() -> None:
    rng = random.Random(7)
    model = ReturnModel(min_samples=4, prior_s=10.0)
    assert model.fit("agent", "search").level == "prior"
    assert model.predict("agent", "search") == pytest.approx(10.0)
    truth = {"lookup": 0.05, "search": 2.0, "handoff": 60.0}
    for _ in range(300):
        tool = rng.choice(sorted(truth))
        model.observe("agent", tool, rng.lognormvariate(math.log(truth[tool]), 0.5))
    for tool, median in truth.items():
        fit = model.fit("agent", tool)
        assert fit.level == "tool"
        assert fit.sigma == pytest.approx(0.5, rel=0.3)
        assert model.predict("agent", tool) == pytest.approx(median, rel=0.25)
    # a tool not seen yet: the agent type's delays over every tool; another type: all
    assert model.fit("agent", "new tool").level == "head"
    assert model.fit("other agent", "search").level == "all"


def test_the_median_of_a_tool_still_running_grows_with_how_long_it_has_run() -> None:
    model = ReturnModel(min_samples=2)
    for delay in (1.0, 2.0, 4.0, 0.5, 8.0):
        model.observe("a", "t", delay)
    median = model.predict("a", "t")
    later = [model.predict("a", "t", elapsed) for elapsed in (0.5, median, 4.0, 30.0, 1e4)]
    assert later == sorted(later)
    assert all(v >= e for v, e in zip(later, (0.5, median, 4.0, 30.0, 1e4), strict=True))
    assert model.predict("a", "t", median) > median
    q90 = model.quantile("a", "t", 0.9)
    assert model.quantile("a", "t", 0.5) == pytest.approx(median) and q90 > median


def test_the_model_is_bounded() -> None:
    model = ReturnModel(window=8, max_keys=10)
    for number in range(500):
        model.observe(f"head {number % 40}", f"tool {number}", 1.0 + number % 7)
    assert model.keys <= 10
    assert model.fit(ANY_TOOL, ANY_TOOL).samples == 8


def test_parallel_tool_calls_are_one_key_whatever_their_order() -> None:
    assert tool_key(["b", "a", "b"]) == tool_key(["a", "b"]) == "a+b"
    assert tool_key([]) == ANY_TOOL


def _pause(table: SessionTable, rid: str, key: str, tool: str, now: float) -> Retention:
    table.arrive(rid, [key], "h", 500, now)
    return table.finish(rid, True, now, (tool,))


def _teach(table: SessionTable, tool: str, delay: float, count: int, start: float) -> float:
    """`count` sessions pause on `tool` and come back after `delay`; the time after."""
    now = start
    for number in range(count):
        _pause(table, f"{tool}{number}", f"{tool}-k{number}", tool, now)
        now += delay
        table.arrive(f"{tool}{number}+", [f"{tool}-k{number}", "more"], "h", 600, now)
        table.finish(f"{tool}{number}+", False, now)
    return now


def test_predicted_rank_keeps_the_session_expected_back_soonest() -> None:
    """A lookup paused earlier outranks a hand-off paused later under `predicted`; under
    `recent` the later pause ranks higher. Each TTL covers its own tool's returns."""
    scores = {}
    for rank in ("recent", "predicted"):
        params = TableParams(min_tokens=0, rank=rank, min_samples=4, max_ttl_s=300.0)
        table = SessionTable(params)
        table.ledger.came_back(("", "h"), 10**6, True, now=0.0)
        now = _teach(table, "lookup", 0.05, 6, 0.0)
        now = _teach(table, "handoff", 60.0, 6, now)
        early = _pause(table, "early", "early-k", "lookup", now + 1.0).retain["early-k"]
        late = _pause(table, "late", "late-k", "handoff", now + 1.2).retain["late-k"]
        scores[rank] = early[0] > late[0]
        if rank == "predicted":
            assert early[1] < 1.0 and late[1] > 30.0  # TTLs: a lookup's, a hand-off's
    assert scores == {"recent": False, "predicted": True}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("runPythonCode", "code"),
        ("web-search", "search"),
        ("ask_user_for_confirmation", "human"),
        ("fetchWeather", "lookup"),
        ("create_ticket", "write"),
        ("escalate_to_supervisor", "human"),
        ("list_open_issues", "search"),
        ("execute_sql", "code"),
        ("transfer_to_human_agents", "human"),
    ],
)
def test_a_tools_kind_is_read_from_its_name(name: str, kind: str) -> None:
    assert tool_kind(name) == kind


def test_tools_in_the_by_tool_trace_behave_like_their_kind() -> None:
    tokenizer = load_tokenizer("builtin")
    trace = build_session_trace(
        SessionParams(num_sessions=60, tool_model="by_tool"), tokenizer, seed=11
    )
    by_kind: dict[str, list[float]] = {}
    for session in trace.sessions:
        for step in session.steps:
            by_kind.setdefault(tool_kind(step.tool), []).append(step.duration_s)
    medians = {kind: statistics.median(values) for kind, values in by_kind.items()}
    seen = [kind for kind in TOOL_KINDS if kind in medians]
    assert len(seen) >= 4
    ordered = sorted(seen, key=lambda kind: TOOL_KINDS[kind].median_s)
    assert [medians[kind] for kind in ordered] == sorted(medians[kind] for kind in ordered)
    # the same seed without the model: the old draw, arrivals and sessions unchanged
    old = build_session_trace(SessionParams(num_sessions=60), tokenizer, seed=11)
    assert [s.arrival for s in old.sessions] == [s.arrival for s in trace.sessions]
    assert [s.calls for s in old.sessions] == [s.calls for s in trace.sessions]
