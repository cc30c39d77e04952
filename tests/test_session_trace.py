"""agent_sessions (`loadgen.workloads.session_trace`): the sessions, their tool steps and the
unlimited-KV bound, on the builtin tokenizer and the synthetic agent material."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import openai
import pytest
from proxy_support import running_proxy, sim_server

from loadgen.clients.session_replay import (
    CallRecord,
    SessionRecord,
    SessionReplayConfig,
    live_history_tokens,
    live_unique_tokens,
    replay_sessions,
)
from loadgen.workloads.session_trace import (
    Session,
    SessionParams,
    SessionTrace,
    belady_bound,
    build_session_trace,
    summary,
    unlimited_kv_bound,
)
from prism_tokens.tokenizer import load_tokenizer

PARAMS = SessionParams(num_sessions=16, session_rate=2.0, source="synthetic")
# Short tool outputs where only the draws matter (random text costs time).
SHORT = {"output_median_tokens": 8, "output_min_tokens": 4, "output_max_tokens": 16}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin")


def test_same_seed_same_sessions_and_another_seed_others(tokenizer) -> None:
    short = replace(PARAMS, **SHORT)
    a = build_session_trace(short, tokenizer, seed=3)
    b = build_session_trace(short, tokenizer, seed=3)
    c = build_session_trace(short, tokenizer, seed=4)
    assert a.sessions == b.sessions
    assert a.sessions != c.sessions


def test_sessions_have_their_shape(tokenizer) -> None:
    trace = build_session_trace(PARAMS, tokenizer, seed=0)
    arrivals = [s.arrival for s in trace.sessions]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    for session in trace.sessions:
        assert PARAMS.min_calls <= session.calls <= PARAMS.max_calls
        assert session.domain in trace.domains
        for step in session.steps:
            tokens = len(tokenizer.encode(step.output))
            assert step.duration_s > 0
            # random_text hits its token count to within a few tokens of the clip
            assert PARAMS.output_min_tokens - 8 <= tokens <= PARAMS.output_max_tokens + 8
    tasks = [(s.domain, s.task_id) for s in trace.sessions]
    assert len(set(tasks)) < len(tasks)  # Zipf: some tasks recur across sessions


def test_tool_durations_follow_the_stated_lognormal(tokenizer) -> None:
    params = replace(PARAMS, num_sessions=300, min_calls=10, max_calls=10, **SHORT)
    trace = build_session_trace(params, tokenizer, seed=1)
    durations = np.array([s.duration_s for x in trace.sessions for s in x.steps])
    logs = np.log(durations)
    assert abs(np.median(durations) - params.tool_median_s) < 0.15
    assert abs(logs.std() - params.tool_sigma) < 0.1
    assert summary(trace)["tool_duration_p99_s"] > 8 * params.tool_median_s  # heavy tail


def test_tool_scale_scales_durations_and_changes_nothing_else(tokenizer) -> None:
    short = replace(PARAMS, **SHORT)
    base = build_session_trace(short, tokenizer, seed=2)
    slow = build_session_trace(replace(short, tool_scale=4.0), tokenizer, seed=2)
    for a, b in zip(base.sessions, slow.sessions, strict=True):
        assert (a.arrival, a.domain, a.task_id, a.user) == (b.arrival, b.domain, b.task_id, b.user)
        for x, y in zip(a.steps, b.steps, strict=True):
            assert (x.tool, x.output) == (y.tool, y.output)
            assert math.isclose(y.duration_s, 4.0 * x.duration_s)


def test_unlimited_kv_bound(tokenizer) -> None:
    trace = build_session_trace(PARAMS, tokenizer, seed=0)
    bound = unlimited_kv_bound(trace, tokenizer)
    assert 0.5 < bound.hit_rate < 1.0  # every later call reuses its whole history
    assert 0.0 < bound.non_global_hit_rate < bound.hit_rate
    assert bound.non_global_tokens < bound.prompt_tokens
    one = build_session_trace(replace(PARAMS, min_calls=1, max_calls=1), tokenizer, seed=0)
    single = unlimited_kv_bound(one, tokenizer)
    # Without loops only the shared prefixes and recurring tasks are reused: the
    # agent-specific regions hit far less.
    assert single.non_global_hit_rate < bound.non_global_hit_rate - 0.2


sim = pytest.fixture(scope="module")(sim_server)


async def test_an_agent_loop_reuses_its_whole_previous_prompt_and_not_its_tool_call(
    sim,
) -> None:
    """The reuse the bound counts, measured through the proxy and prism-sim with the real
    `openai` client: each call of a loop forces a tool call, then sends it back with the
    tool's output; the next call's cached tokens are exactly the previous prompt. The
    tool call itself is not reused: the template renders it anew."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_order",
                "description": "look up an order",
                "parameters": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}},
                    "required": ["id"],
                },
            },
        }
    ]
    messages: list[dict] = [
        {"role": "system", "content": "You are an agent of the shop. " * 40},
        {"role": "user", "content": "Where is my order 42?"},
    ]
    async with running_proxy(sim.url) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused")
        prompts, cached = [], []
        for _ in range(3):
            answer = await client.chat.completions.create(
                model="m",
                messages=messages,
                tools=tools,
                tool_choice={"type": "function", "function": {"name": "get_order"}},
                max_tokens=32,
            )
            call = answer.choices[0].message.tool_calls[0]
            prompts.append(answer.usage.prompt_tokens)
            cached.append(answer.usage.prompt_tokens_details.cached_tokens)
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "shipped. " * 30},
            ]
        await client.close()
    assert cached[1:] == prompts[:-1]


async def test_sessions_replay_closed_loop_through_the_proxy(sim, tokenizer) -> None:
    """A few sessions of the synthetic material, closed loop, through the proxy: every
    call answered, each tool call sent back, the next call only after the tool's
    duration, and each later call reusing its whole history."""
    params = replace(PARAMS, num_sessions=3, min_calls=3, max_calls=3, session_rate=20.0,
                     final_answer_tokens=8, **SHORT)  # fmt: skip
    trace = build_session_trace(params, tokenizer, seed=5)
    async with running_proxy(sim.url) as proxy:
        config = SessionReplayConfig(target=proxy.url, time_scale=10.0)
        results = await replay_sessions(trace, config)
    summary_ = results["summary"]
    assert summary_["completed_sessions"] == 3 and summary_["failed_calls"] == 0
    assert summary_["calls"] == 9 and summary_["mean_jct_ms"] > 0
    by_sid = {s.sid: s for s in trace.sessions}
    for record in results["sessions"]:
        calls = record["calls"]
        steps = by_sid[record["sid"]].steps
        for before, after, step in zip(calls, calls[1:], steps, strict=False):
            assert after["sent"] >= before["end"] + step.duration_s - 0.1  # modeled s
            assert after["cached_tokens"] >= before["prompt_tokens"]
        # the engine's model called each step's tool, which the chat named
        assert [c["called"] for c in calls] == [s.tool for s in steps] + [None]
    assert summary_["hit_rate"] > 0.3


# ---- Belady's bound and the pool's measure ---------------------------------------------
def _session(sid: str, task: str) -> Session:
    return Session(sid, 0.0, "d", task, "", "", ())


def test_belady_keeps_a_shared_piece_that_a_later_session_uses() -> None:
    """A task's piece is worth its next use by any session of the task, even one that
    has not begun and with no session of it cached. One agent type "d" (a 100-token
    prefix), single-call sessions of 300 tokens (a 200-token task piece each), a pool of
    500:

        A  task a  [0, 1]    never used again after it
        B  task z  [0.5, 1.5]
        E  task e  [3, 3.5]  700 > 500 tokens: one of a, z (200 each) must go
        D  task z  [4, 5]    reuses z

    Belady drops a and D hits all 300 tokens. The rule that valued a shared piece by
    the sessions cached under it saw neither a nor z used again (A's and B's own pieces
    are empty), dropped z on the name order and D hit only the prefix, then dropped e.
    Hits: A 0, B 100, E 100, D 300 = 500 of 1,200 prompt tokens (the old rule: 300)."""
    sessions = (_session("A", "a"), _session("B", "z"), _session("E", "e"), _session("D", "z"))
    trace = SessionTrace(SessionParams(), 0, {}, sessions)
    calls = [("A", 0.0, 1.0, 300), ("B", 0.5, 1.5, 300), ("E", 3.0, 3.5, 300), ("D", 4.0, 5.0, 300)]
    bound = belady_bound(trace, calls, {"d": 100}, capacity_tokens=500)
    assert bound.prompt_tokens == 1200
    assert bound.hit_rate == pytest.approx(500 / 1200)
    assert bound.non_global_hit_rate == pytest.approx(200 / 800)  # D's task piece


def test_live_kv_counts_each_shared_piece_once(tokenizer) -> None:
    """Two sessions of one task, live together over [0, 10]: 100 shared tokens of type
    d, a 200-token task piece, then own histories of 300 and 0 tokens. Per session the
    histories hold 2 x 300 + 600 = 1,200 tokens; unique: 100 + 200 + 300 = 600."""
    one = SessionRecord(
        "A",
        0.0,
        10.0,
        [
            CallRecord("A", 0, 0.0, 0.1, 1.0, 300, 0, None, 100),
            CallRecord("A", 1, 2.0, 0.1, 10.0, 600, 300, None, 100),
        ],
    )
    two = SessionRecord("B", 0.0, 10.0, [CallRecord("B", 0, 0.0, 0.1, 10.0, 300, 0, None, 100)])
    pieces = {"A": ("d", "t"), "B": ("d", "t")}
    unique = live_unique_tokens([one, two], pieces)
    per_session = live_history_tokens([one, two])
    assert unique == {"mean": pytest.approx((2 * 300 + 8 * 600) / 10), "peak": 600}
    assert per_session == {"mean": pytest.approx((2 * 600 + 8 * 900) / 10), "peak": 900}
    # another task's session brings its own task piece; the type's prefix stays once
    other = SessionRecord("C", 0.0, 10.0, [CallRecord("C", 0, 0.0, 0.1, 10.0, 250, 0, None, 100)])
    both = live_unique_tokens([one, two, other], {**pieces, "C": ("d", "u")})
    assert both["peak"] == 600 + 150
