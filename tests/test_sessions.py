"""Agent sessions: the proxy's session table (sans-IO), QAS's precedence for
continuations, the twin's closed loop, and the whole path through the real proxy, the
`openai` client and prism-sim's DART with its control RPC."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import openai
import pytest
from proxy_support import dart_stack, running_proxy, sim_server, wait_until

from loadgen.clients.session_replay import TOOL_CALL_CAP
from loadgen.twin.session_twin import (
    EngineCall,
    SessionFeatures,
    SessionTwin,
    shared_tokens,
    simulate_sessions,
)
from loadgen.twin.twin import TwinSetup
from loadgen.workloads.session_trace import (
    SessionParams,
    belady_bound,
    build_session_trace,
    tool_cue,
)
from prism_proxy.admission.sessions import QUEUED_SCORE, SessionTable
from prism_proxy.admission.sessions import SessionParams as TableParams
from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.prompts.conversation import find_turns, turns_job
from prism_proxy.qas.params import QasParams
from prism_proxy.qas.policies import make_policy
from prism_proxy.qas.types import QueuedRequest
from prism_sim.api_models import ToolChoiceFunction, ToolChoiceIn, ToolIn
from prism_sim.tool_calls import forced_call
from prism_tokens.chat import template_messages, template_tools
from prism_tokens.tokenizer import load_tokenizer
from prism_wire import Retention

TOKEN = "session-test-token"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin")


# ---- the table ------------------------------------------------------------------------
def earned(table: SessionTable, head: str, tokens: int = 100_000, client: str = "") -> None:
    """Credit `(client, head)` with `tokens` of sessions that came back in time at t=0
    (the rule itself is tested below, through the events)."""
    table.ledger.came_back((client, head), tokens, True, now=0.0)


def test_a_continuation_is_found_by_the_key_of_the_call_before() -> None:
    table = SessionTable(TableParams(min_tokens=0, default_ttl_s=7.0))
    earned(table, "head")
    first = table.arrive("r1", ["a", "b"], "head", 500, now=1.0)
    assert not first.continues and first.program_start == 1.0 and not first.retention
    assert table.finish("r1", tool_call=True, now=2.0) == Retention({"b": (2.0, 7.0, 500)})
    again = table.arrive("r2", ["a", "b", "c", "d"], "head", 900, now=3.5)
    # the program's start carries over; its path is held above every paused one while
    # it waits, and released when its first token comes back
    assert again.continues and again.program_start == 1.0
    assert again.retention == Retention({"b": (QUEUED_SCORE, 60.0, 500)})
    assert table.started("r2", now=3.6) == Retention(release=("b",))
    assert not table.started("r2", now=3.7)
    # an answer without a tool call ends the session: its own pieces (after the first
    # call's, which sessions of one task share) go first
    assert table.finish("r2", tool_call=False, now=4.0) == Retention(discard=("c", "d"))
    other = table.arrive("r3", ["a", "x"], "head", 500, now=5.0)
    assert not other.continues  # sharing the head is not continuing


def test_sessions_paused_on_one_prefix_are_told_apart() -> None:
    """Two sessions of one task start with the same prompt: both pause under one key;
    each return takes one of them, and the key stays retained until both are back."""
    table = SessionTable(TableParams(min_tokens=0, default_ttl_s=10.0))
    earned(table, "h")
    for rid, now in (("x0", 0.0), ("y0", 0.5)):
        table.arrive(rid, ["k"], "h", 500, now)
        table.finish(rid, True, now + 1)
    assert table.paused == 2
    back = table.arrive("x1", ["k", "kx"], "h", 700, 3.0)
    assert back.continues and back.program_start == 0.0  # the older one first
    assert table.started("x1", 3.1) == Retention(
        {"k": (1.5, 1.5 + 10.0 - 3.1, 500)}
    )  # y0 still out
    back = table.arrive("y1", ["k", "ky"], "h", 700, 4.0)
    assert back.continues and back.program_start == 0.5
    assert table.started("y1", 4.1) == Retention(release=("k",))


def test_ttl_is_the_quantile_of_observed_returns_late_ones_included() -> None:
    params = TableParams(min_tokens=0, ttl_quantile=0.5, min_samples=4, max_ttl_s=100.0,
                         default_ttl_s=3.0)  # fmt: skip
    table = SessionTable(params)
    now = 0.0
    for n, delay in enumerate([1.0, 2.0, 50.0, 80.0, 90.0]):
        table.arrive(f"a{n}", [f"k{n}"], "h", 500, now)
        table.finish(f"a{n}", True, now)
        assert table.ttl("h") == (3.0 if n < 4 else 50.0)
        now += delay
        table.arrive(f"b{n}", [f"k{n}", f"k{n}+"], "h", 600, now)  # returns after `delay`
        table.finish(f"b{n}", False, now)
    # 5 delays, median 50 s: the returns after the 3 s default TTL were observed too
    assert table.ttl("h") == 50.0
    assert table.ttl("another head") == 3.0


def test_retention_from_the_call_holds_the_path_until_the_end_says() -> None:
    """With `retain_from` "call", the path is retained when the stream shows the tool
    call, with its pause's score, until the end's word replaces it (the longest TTL
    until then: the rest of the answer may outlast the pause's own): retained,
    discarded (no tool call after all), or undone (the request failed)."""
    params = TableParams(min_tokens=0, default_ttl_s=7.0, retain_from="call")
    table = SessionTable(params)
    earned(table, "h")
    table.arrive("r1", ["a", "b"], "h", 500, now=1.0)
    assert table.calling("r1", now=1.5) == Retention({"b": (1.5, 60.0, 500)})
    assert not table.calling("r1", now=1.6)  # once
    assert table.finish("r1", tool_call=True, now=2.0) == Retention({"b": (2.0, 7.0, 500)})
    table.arrive("r2", ["a", "b", "c"], "h", 600, now=3.0)
    table.started("r2", now=3.1)
    assert table.calling("r2", now=3.2) == Retention({"c": (3.2, 60.0, 600)})
    # a call seen, then an answer that did not end in one: its own pieces go first
    assert table.finish("r2", tool_call=False, now=3.5) == Retention(discard=("c",))
    table.arrive("r3", ["x"], "h", 500, now=4.0)
    table.calling("r3", now=4.1)
    assert table.forget("r3", now=4.2) == Retention(release=("x",))
    # at the end (the default) a call changes nothing; nor for an account that could
    # not retain now, or a prompt too short to keep
    table = SessionTable(replace(params, retain_from="end"))
    earned(table, "h")
    table.arrive("e", ["k"], "h", 500, now=0.0)
    assert not table.calling("e", now=0.1)
    table = SessionTable(replace(params, min_tokens=300))
    table.arrive("poor", ["p"], "h", 500, now=0.0)  # nothing came back for it yet
    assert not table.calling("poor", now=0.1)
    earned(table, "h")
    table.arrive("short", ["s"], "h", 200, now=0.0)
    assert not table.calling("short", now=0.1)


def test_short_prompts_are_not_kept_and_everything_is_bounded() -> None:
    table = SessionTable(TableParams(min_tokens=300, max_sessions=3))
    earned(table, "h")
    table.arrive("s", ["k"], "h", 200, 0.0)
    # cheaper to prefill than to hold: ranked as its private piece would be
    assert table.finish("s", True, 1.0) == Retention(discard=("k",))
    released: list[str] = []
    for n in range(6):
        table.arrive(f"r{n}", [f"k{n}"], "h", 400, float(n))
        retention = table.finish(f"r{n}", True, float(n))
        assert list(retention.retain) == [f"k{n}"]
        released += retention.release
    assert table.paused == 3 and released == ["k0", "k1", "k2"]
    table.expire(1e9)
    assert table.paused == 0


# ---- QAS ----------------------------------------------------------------------------------
def _queued(rid: str, arrival: float, program_start: float | None = None) -> QueuedRequest:
    return QueuedRequest(rid, arrival, segments=(f"seg-{rid}",), reorder=False,
                         program_start=program_start)  # fmt: skip


@pytest.mark.parametrize(
    ("share", "leading", "cold"),
    [(0.5, ["cont-old"], "new2"), (1.0, ["cont-old", "cont-young"], "new1")],
)
def test_continuations_lead_the_hot_lane_oldest_program_first(share, leading, cold) -> None:
    queue = [
        _queued("new1", 1.0),
        _queued("new2", 2.0),
        _queued("cont-young", 3.0, program_start=0.5),
        _queued("cont-old", 4.0, program_start=0.1),
        _queued("new3", 5.0),
    ]
    # a wave of 3: two hot slots, one cold
    params = replace(QasParams(), q_cold=1, continuation_share=share)
    wave = make_policy("prism", params).plan_round(queue, [], wave_size=3, now=5.0).wave
    assert [e.rid for e in wave[: len(leading)]] == leading  # ⌈share x 2⌉ of them
    assert (wave[-1].rid, wave[-1].lane.value) == (cold, "cold")  # the oldest left
    # unmarked requests (sessions off) are never moved ahead
    plain = [replace(q, program_start=None) for q in queue]
    unmarked = make_policy("prism", params).plan_round(plain, [], wave_size=3, now=5.0).wave
    off = make_policy("prism", replace(params, continuation_share=0.0))
    assert unmarked == off.plan_round(plain, [], wave_size=3, now=5.0).wave
    # program-level FCFS (continuum-style) orders every slot by program start
    order = make_policy("continuum-style", params).plan_round(queue, [], 5, now=5.0).wave
    assert [e.rid for e in order] == ["cont-old", "cont-young", "new1", "new2", "new3"]


def _primed(backlog_ms: float, age_cap_ms: float = 8000.0):
    """A prism policy whose cache view holds the path head `h` → segment `A` (released
    by a first round), with residency from that view."""
    params = replace(QasParams(), q_cold=1, w_c=1e4, backlog_ms=backlog_ms, age_cap_ms=age_cap_ms)
    policy = make_policy("prism", params)
    first = QueuedRequest("r0", 0.0, segments=("A",), reorder=False, prefix_key="h",
                          head_tokens=100, segment_tokens=(500,))  # fmt: skip
    assert [e.rid for e in policy.plan_round([first], [], wave_size=1, now=0.0).wave] == ["r0"]
    return policy


def test_under_a_backlog_the_longest_cached_prefix_goes_first_within_an_age_cap() -> None:
    def queued(rid: str, arrival: float, segments: tuple[str, ...], tokens: tuple[int, ...]):
        return QueuedRequest(rid, arrival, segments=segments, reorder=False, prefix_key="h",
                             head_tokens=100, segment_tokens=tokens)  # fmt: skip

    queue = [
        queued("oldest", 1.0, ("X",), (1000,)),
        queued("old", 2.0, ("Y",), (800,)),
        queued("small", 3.0, ("Z",), (50,)),
        queued("cached", 4.0, ("A", "B"), (500, 10)),  # the head and A (600 tokens) cached
    ]
    # at t=6 the oldest waited 5 s: past the 1 s backlog and the 4.5 s cap, so it leads
    # (cold); then the longest cached prefix, then equal ones (the head) oldest first
    params = {"backlog_ms": 1000.0, "age_cap_ms": 4500.0}
    wave = _primed(**params).plan_round(queue, [], wave_size=3, now=6.0).wave
    assert [(e.rid, e.lane.value) for e in wave] == [
        ("oldest", "cold"),
        ("cached", "hot"),
        ("old", "hot"),
    ]
    # below the backlog, and with the rule off, the round is the usual one
    usual = _primed(backlog_ms=0.0).plan_round(queue, [], wave_size=3, now=1.5).wave
    assert _primed(**params).plan_round(queue, [], wave_size=3, now=1.5).wave == usual
    off = _primed(backlog_ms=0.0).plan_round(queue, [], wave_size=3, now=6.0).wave
    assert [e.rid for e in off] != ["oldest", "cached", "old"]


# ---- the cut that names a session ------------------------------------------------------------
def test_the_next_call_repeats_the_key_of_the_call_before(tokenizer) -> None:
    """With `last_message`, each call's last message ends in a segment; the next call of
    the loop (its messages plus an assistant tool call and a tool result) has a piece
    ending at the same place with the same id, however many messages came before."""
    tools = template_tools([{"type": "function", "function": {"name": "f", "parameters": {}}}],
                           "auto")  # fmt: skip
    messages: list[dict] = [
        {"role": "system", "content": "You are an agent. " * 20},
        {"role": "user", "content": "Do the thing."},
    ]
    keys: list[str] = []
    for n in range(12):  # past MAX_CUTS messages, where cuts thin out
        given = template_messages(messages, "string")
        job = turns_job(find_turns(tokenizer, given, tools, last_message=True))
        if keys:
            assert keys[-1] in job.segments, n
        keys.append(job.segments[-1])
        call = {"id": f"c{n}", "type": "function",
                "function": {"name": "f", "arguments": json.dumps({"n": n})}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": f"result {n} " * 30},
        ]
    plain = turns_job(find_turns(tokenizer, template_messages(messages, "string"), tools))
    assert plain.segments[-1] not in keys  # without it the last message stays private


# ---- the twin ------------------------------------------------------------------------------
SMALL = SessionParams(num_sessions=24, session_rate=2.0, min_calls=4, max_calls=6,
                      output_median_tokens=400, tool_median_s=2.0, source="synthetic")  # fmt: skip


def test_the_twin_is_deterministic_and_closed_loop(tokenizer) -> None:
    trace = build_session_trace(SMALL, tokenizer, seed=3)
    setup = TwinSetup(policy="prism", eviction="dart", kv_capacity_tokens=60_000)
    features = SessionFeatures(detect=True, retain=True)
    one = simulate_sessions(trace, setup, tokenizer, features)
    two = simulate_sessions(trace, setup, tokenizer, features)
    assert one["summary"] == two["summary"]
    summary = one["summary"]
    assert summary["completed_sessions"] == 24 and summary["failed_calls"] == 0
    assert summary["calls"] == sum(s.calls for s in trace.sessions)
    assert 0 < summary["non_global_hit_rate"] < summary["hit_rate"] < 1
    steps = {s.sid: s.steps for s in trace.sessions}
    for record in one["sessions"]:
        for before, after, step in zip(record["calls"], record["calls"][1:],
                                       steps[record["sid"]], strict=False):  # fmt: skip
            assert after["sent"] == pytest.approx(before["end"] + step.duration_s)
    table = one["session_table"]
    assert table["new_programs"] == 24 and table["continued"] == summary["calls"] - 24


def test_retention_keeps_paused_histories_that_lru_evicts(tokenizer) -> None:
    """Under KV pressure, the same QAS with and without retention (DART's R_t): the
    paused sessions' histories survive more often with it."""
    trace = build_session_trace(replace(SMALL, num_sessions=30), tokenizer, seed=4)
    pool = 40_000
    setup = TwinSetup(policy="prism", eviction="dart", kv_capacity_tokens=pool)
    detect_only = simulate_sessions(trace, setup, tokenizer, SessionFeatures(detect=True))
    twin = SessionTwin(trace, setup, tokenizer, SessionFeatures(detect=True, retain=True))
    twin.run()
    kept = [r for r in twin.records.values()]
    with_retention = {
        "hit": sum(c.cached_tokens or 0 for r in kept for c in r.calls)
        / sum(c.prompt_tokens or 0 for r in kept for c in r.calls)
    }
    dart = twin.engine_state()["dart"]
    assert dart["evicted_tokens"]["retained"] < dart["evicted_tokens"]["segment"]
    assert with_retention["hit"] > detect_only["summary"]["hit_rate"]
    calls = [
        (c.sid, c.sent + (c.ttft_s or 0.0), c.end, c.prompt_tokens)
        for r in kept
        for c in r.calls
        if c.prompt_tokens
    ]
    bound = belady_bound(trace, calls, shared_tokens(trace, tokenizer), pool)
    # a model of the run, not a replay of the engine: close to what retention reaches
    assert abs(bound.hit_rate - with_retention["hit"]) < 0.1


def test_the_twin_asks_for_a_tool_call_what_the_real_client_asks(tokenizer) -> None:
    """A call that must call a tool asks `TOOL_CALL_CAP` tokens (the engine reserves
    them), generates prism-sim's forced call of the step's tool (`EngineCall`: the tool
    the chat's last message names), and its TTFT is when the call's name is out, as
    `session_replay` measures it on the real stack."""
    trace = build_session_trace(SMALL, tokenizer, seed=3)
    setup = TwinSetup(policy=None, kv_capacity_tokens=60_000)
    out = simulate_sessions(trace, setup, tokenizer)
    engine = {r["rid"]: r for r in out["engine_records"]}
    by_sid = {s.sid: s for s in trace.sessions}
    tools = {d: [ToolIn.model_validate(t) for t in json.loads(m.tools)]
             for d, m in trace.domains.items()}  # fmt: skip
    called = set()
    for record in out["sessions"]:
        session = by_sid[record["sid"]]
        for call in record["calls"]:
            seen = engine[f"{call['sid']}-{call['call']:02d}"]
            if call["call"] < len(session.steps):
                tool = session.steps[call["call"]].tool
                named = forced_call(tools[session.domain], named_choice(tool))
                assert named is not None
                expected = EngineCall.of(named, tokenizer)
                assert call["called"] == tool
                assert seen["max_new_tokens"] == TOOL_CALL_CAP
                assert call["completion_tokens"] == seen["output_tokens"] == len(expected.script)
                assert expected.name_tokens > 1
                # the name comes some decode steps after the first token
                assert call["sent"] + call["ttft_s"] > seen["first_token_s"] + setup.hop_s
                called.add(tool)
            else:
                assert call["called"] is None
                assert seen["max_new_tokens"] == SMALL.final_answer_tokens
                assert call["sent"] + call["ttft_s"] == pytest.approx(
                    seen["first_token_s"] + setup.hop_s
                )
    assert len(called) > 1  # the steps call different tools


def test_the_twins_pacing_learns_an_engine_served_calls_cache_at_its_end(tokenizer) -> None:
    """The proxy learns an engine-served chat's uncached tokens from its usage at the
    answer's end (`Admitted.finish`), not at its first token; the twin's core does the
    same: its B rule's average is the calls' uncached tokens taken in the order they
    finished, and nothing at their first tokens."""
    trace = build_session_trace(replace(SMALL, num_sessions=6), tokenizer, seed=3)
    setup = TwinSetup(policy="prism", eviction="dart", kv_capacity_tokens=60_000)
    twin = SessionTwin(trace, setup, tokenizer, SessionFeatures(detect=True, retain=True))
    assert twin.core is not None
    told: list[tuple[str, int | None]] = []
    first_token, observe = twin.core.first_token, twin.core.observe_uncached
    twin.core.first_token = lambda rid, uncached=None, now=None: (  # type: ignore[method-assign]
        told.append((rid, uncached)),
        first_token(rid, uncached, now),
    )[1]
    twin.core.observe_uncached = lambda tokens: (  # type: ignore[method-assign]
        told.append(("end", tokens)),
        observe(tokens),
    )[1]
    twin.run()
    records = sorted(twin.engine_records, key=lambda r: r["finish_s"])
    assert all(uncached is None for rid, uncached in told if rid != "end")
    ends = [tokens for rid, tokens in told if rid == "end"]
    assert sorted(ends) == sorted(r["prompt_tokens"] - r["cached_tokens"] for r in records)
    average = 1024.0
    for tokens in ends:
        average += (max(1, tokens) - average) / 16
    assert twin.core.pacing.uncached_tokens == pytest.approx(average)


def named_choice(tool: str) -> ToolChoiceIn:
    return ToolChoiceIn(function=ToolChoiceFunction(name=tool))


# ---- the real path --------------------------------------------------------------------------
def test_a_paused_session_is_retained_through_the_real_proxy_and_rpc(tmp_path) -> None:
    """`prism-proxy serve --set sessions=true` in front of `prism-sim --eviction dart` with
    its control RPC, driven by the real `openai` client. A client's first pause is not
    retained (nothing of its came back yet): DART is told to rank it with private pieces.
    Its continuation is recognised, which earns the client retention: its next session's
    pause (no longer than what came back: ~320 of ~400 tokens) is retained, and that
    one's continuation releases it at its first token."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "find",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    system = {"role": "system", "content": "You are a careful agent. " * 40}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with dart_stack(tmp_path, TOKEN, ["--set", "sessions=true"]) as (proxy, _, control_url):
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)

        def dart(name: str) -> int:
            return httpx.get(control_url + "/prism/stats", headers=auth).json()[name]

        def call_and_continue(order: int, repeat: int, between) -> tuple:
            messages: list[dict] = [
                system, {"role": "user", "content": f"Find order {order}. " * repeat}
            ]  # fmt: skip
            answer = client.chat.completions.create(
                model="m", messages=messages, tools=tools, tool_choice="required",
                max_tokens=24,
            )  # fmt: skip
            assert answer.choices[0].finish_reason == "tool_calls"
            call = answer.choices[0].message.tool_calls[0]
            between()
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "shipped " * 40},
            ]
            stream = client.chat.completions.create(
                model="m", messages=messages, tools=tools, tool_choice="auto",
                max_tokens=8, stream=True, stream_options={"include_usage": True},
            )  # fmt: skip
            usage = [c.usage for c in stream if c.usage is not None][-1]
            return answer.usage, usage

        def unearned() -> None:
            wait_until(lambda: dart("discards") >= 1)  # the pause's word reached DART
            assert dart("retained") == 0 and dart("retain_entries") == 0
            metrics = httpx.get(proxy.url + "/metrics").text
            assert "prism:sessions_paused 1.0" in metrics
            assert "prism:sessions_retained 0.0" in metrics

        call_and_continue(7, 100, unearned)
        metrics = httpx.get(proxy.url + "/metrics").text
        assert 'prism:session_calls_total{kind="continued"} 1.0' in metrics

        def earned() -> None:
            wait_until(lambda: dart("retained") == 1)
            assert "prism:sessions_retained 1.0" in httpx.get(proxy.url + "/metrics").text

        first, after = call_and_continue(8, 80, earned)
        assert after.prompt_tokens_details.cached_tokens >= first.prompt_tokens
        metrics = httpx.get(proxy.url + "/metrics").text
        assert 'prism:session_calls_total{kind="continued"} 2.0' in metrics
        assert 'prism:session_calls_total{kind="new"} 2.0' in metrics
        # released at its first token; its own answer ended without a tool call
        wait_until(lambda: dart("retained") == 0)
        client.close()


def test_retention_from_the_call_is_asked_while_the_answer_streams(tmp_path) -> None:
    """`--set session_retain_from=call` through the real proxy, DART's control RPC and
    the `openai` client: once a client has earned retention, its session's path is
    retained as soon as the stream shows the tool call's name, while the engine is still
    generating the call's long argument (DART's own snapshot shows both: retained and
    the request active; at the answer's end the request would be gone from it first);
    when the client then leaves, the hold is released."""
    text = {"type": "string", "default": "alpha beta gamma delta " * 40}
    parameters = {"type": "object", "properties": {"text": text}, "required": ["text"]}
    tools = [{"type": "function", "function": {"name": "write", "parameters": parameters}}]
    system = {"role": "system", "content": "You are a careful agent. " * 40}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    serve = ["--set", "sessions=true", "--set", "session_retain_from=call"]
    with dart_stack(tmp_path, TOKEN, serve, sim_args=("--speed", "1")) as (proxy, _, control):
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)

        def stats() -> dict:
            return httpx.get(control + "/prism/stats", headers=auth).json()

        def dart(name: str) -> int:
            return stats()[name]

        # a first session pauses and comes back: the client has earned retention
        messages: list[dict] = [system, {"role": "user", "content": "Find order 7. " * 100}]
        answer = client.chat.completions.create(
            model="m", messages=messages, tools=tools, tool_choice="required", max_tokens=2000
        )
        call = answer.choices[0].message.tool_calls[0]
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "shipped " * 40},
        ]
        client.chat.completions.create(
            model="m", messages=messages, tools=tools, tool_choice="auto", max_tokens=8
        )
        wait_until(lambda: dart("retained") == 0)
        # a second session's call: retained while it streams
        messages = [system, {"role": "user", "content": "Find order 8. " * 80}]
        stream = client.chat.completions.create(
            model="m", messages=messages, tools=tools, tool_choice="required", max_tokens=2000,
            stream=True,
        )  # fmt: skip
        for chunk in stream:
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is not None and delta.tool_calls and delta.tool_calls[0].function.name:
                break
        seen: list[dict] = []
        wait_until(lambda: seen.append(stats()) or seen[-1]["retained"] == 1)
        assert seen[-1]["active_requests"] == 1  # held while the engine still generates
        stream.close()  # the client leaves: no pause follows, the hold goes
        wait_until(lambda: dart("retained") == 0)
        client.close()


sim = pytest.fixture(scope="module")(sim_server)


async def test_the_engine_serves_a_forced_call_as_the_twin_models_it(sim, tokenizer) -> None:
    """prism-sim's chat endpoint, through the `openai` client as `session_replay` asks
    (`tool_choice` "required", `TOOL_CALL_CAP` tokens, streamed), for a chat whose last
    message names a tool (`tool_cue`): the answer is the twin's `EngineCall` of that
    tool, its tokens and its call, and the first delta holds its name."""
    trace = build_session_trace(SMALL, tokenizer, seed=3)
    tools = json.loads(next(iter(trace.domains.values())).tools)
    tool = tools[-1]["function"]["name"]
    assert len(tools) > 1
    named = forced_call([ToolIn.model_validate(t) for t in tools], named_choice(tool))
    assert named is not None
    expected = EngineCall.of(named, tokenizer)
    client = openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Go. " * 50 + tool_cue(tool)}],
        tools=tools, tool_choice="required", max_tokens=TOOL_CALL_CAP, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    deltas, usage = [], None
    async for chunk in stream:
        usage = chunk.usage or usage
        for part in chunk.choices:
            if part.delta.content or part.delta.tool_calls:
                deltas.append(part.delta)
    await client.close()
    assert usage is not None and usage.completion_tokens == len(expected.script)
    assert deltas[0].tool_calls[0].function.name == expected.call.name == tool
    arguments = "".join(d.tool_calls[0].function.arguments or "" for d in deltas)
    assert arguments == expected.call.arguments


async def test_sessions_off_keeps_no_session_state(sim) -> None:
    """`--set sessions=false`: no session table, chats with tools cut as before (the last
    message private), nothing counted."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "An agent. " * 30},
            {"role": "user", "content": "Go."},
        ],
        "tools": tools,
        "tool_choice": "required",
        "max_tokens": 8,
    }
    for sessions in (False, True):
        async with running_proxy(sim.url, sessions=sessions) as proxy:
            assert (proxy.app[GATEWAY].sessions is not None) is sessions
            async with httpx.AsyncClient() as client:
                answer = await client.post(proxy.url + "/v1/chat/completions", json=body)
                assert answer.status_code == 200
                metrics = (await client.get(proxy.url + "/metrics")).text
            counted = 'prism:session_calls_total{kind="new"} 1.0' in metrics
            assert counted is sessions


async def test_the_proxy_learns_return_delays_per_tool_from_the_answers(sim) -> None:
    """With `session_rank=predicted`, the tools an answer called are read from the engine's
    answer, whole (non-streamed) and streamed: each continuation's return delay is then
    learned under its tool's name."""
    system = {"role": "system", "content": "A careful agent. " * 40}
    async with running_proxy(sim.url, sessions=True, session_rank="predicted") as proxy:
        returns = proxy.app[GATEWAY].sessions.table.returns
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        for number, (tool, stream) in enumerate(
            [("lookup_order", False), ("search_catalog", True)]
        ):
            tools = [{"type": "function", "function": {"name": tool, "parameters": {}}}]
            messages: list[dict] = [system, {"role": "user", "content": f"Task {number}. " * 200}]
            ask = {"model": "m", "messages": messages, "tools": tools, "max_tokens": 24,
                   "tool_choice": "required"}  # fmt: skip
            if stream:
                calls: dict[int, dict] = {}
                async for chunk in await client.chat.completions.create(**ask, stream=True):
                    for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                        known = calls.setdefault(delta.index, {"id": delta.id, "args": ""})
                        known["args"] += delta.function.arguments or ""
                call = {"id": calls[0]["id"], "type": "function",
                        "function": {"name": tool, "arguments": calls[0]["args"]}}  # fmt: skip
            else:
                answer = await client.chat.completions.create(**ask)
                call = answer.choices[0].message.tool_calls[0].model_dump()
                assert call["function"]["name"] == tool
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "found " * 40},
            ]
            assert returns.samples(tool) == 0
            await client.chat.completions.create(
                model="m", messages=messages, tools=tools, tool_choice="auto", max_tokens=4
            )
            assert returns.samples(tool) == 1
        await client.close()
