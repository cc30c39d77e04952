"""Closed-loop replay of agent_sessions (`loadgen.workloads.session_trace`) against an
OpenAI endpoint.

Every session runs as an agent program: it starts at its arrival, sends plain OpenAI chat
with `tools` (unhinted), and for every call but the last requires a tool call
(`tool_choice` "required": the engine picks the tool, the one the chat's last message
names, the step's (`session_trace.tool_cue`); naming one in `tool_choice` would make
SGLang render only that tool into the prompt, a different prefix at every call). It
appends that call as the model returned it and the tool's output as a `tool` message,
waits the tool's duration, and sends the next call. The last call (`tool_choice` "auto",
the tools still in its prompt) answers in text. Arrivals and tool durations are divided
by `time_scale` (an engine whose clock runs that much faster); every recorded time is
multiplied back, so records are in the trace's seconds.

Per call: TTFT (first streamed delta), prompt and cached tokens (the stream's usage). Per
session: the job completion time, from arrival to the end of its last answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import openai

from loadgen.workloads.session_trace import Session, SessionTrace, tool_cue

TOOL_CALL_CAP = 1024


@dataclass(frozen=True)
class SessionReplayConfig:
    target: str  # base URL serving /v1/chat/completions (the proxy or the engine)
    model: str = "m"
    time_scale: float = 1.0  # > 1 replays faster: arrivals and tool durations shrink
    timeout_s: float = 600.0
    # each agent type's shared prefix in tokens (`session_twin.shared_tokens`): gives
    # the summary its non-global hit rate
    shared_tokens: dict[str, int] | None = None
    # send each call's rid (`<sid>-<call:02d>`, as the twin names it) so the engine's
    # own records of a call can be matched to the client's (`--save-calls`)
    send_rid: bool = False


@dataclass
class CallRecord:
    sid: str
    call: int
    sent: float  # seconds since the replay's start
    ttft_s: float | None
    end: float
    prompt_tokens: int | None
    cached_tokens: int | None
    error: str | None = None
    shared_tokens: int | None = None  # the agent type's shared prefix (global region)
    completion_tokens: int | None = None  # the answer's tokens as served (usage)
    called: str | None = None  # the tool the answer called (the step's, as its chat names it)


@dataclass
class SessionRecord:
    sid: str
    arrival: float
    end: float | None = None
    calls: list[CallRecord] = field(default_factory=list)

    @property
    def jct_s(self) -> float | None:
        return None if self.end is None else self.end - self.arrival


def messages_of(trace: SessionTrace, session: Session) -> tuple[list[dict[str, Any]], list[Any]]:
    """The first call's messages and the `tools` of the session's agent type."""
    domain = trace.domains[session.domain]
    tools = json.loads(domain.tools)
    messages = [
        {"role": "system", "content": domain.policy},
        {"role": "user", "content": f"{session.records}\n\n{session.user}"},
    ]
    if session.steps:  # the first call's tool, named after the task (`tool_cue`)
        messages.append({"role": "user", "content": tool_cue(session.steps[0].tool)})
    return messages, tools


async def _call(
    client: openai.AsyncOpenAI,
    config: SessionReplayConfig,
    messages: list[dict[str, Any]],
    tools: list[Any],
    tool: str | None,
    max_tokens: int,
    started: float,
    record: CallRecord,
) -> dict[str, Any] | None:
    """One streamed call; returns the assistant message to append (None on failure)."""
    # "required", not the step's tool by name, and "auto" for the last call, not "none":
    # SGLang renders only a named tool into the prompt, and none for "none", so the prompt
    # would part from the previous call's at the tools.
    choice: Any = "required" if tool else "auto"
    calls: dict[int, dict[str, str]] = {}
    text: list[str] = []
    extra = {"rid": f"{record.sid}-{record.call:02d}"} if config.send_rid else None
    try:
        stream = await client.chat.completions.create(
            model=config.model,
            messages=messages,  # type: ignore[arg-type]
            tools=tools,
            tool_choice=choice,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
        async for chunk in stream:
            if chunk.usage is not None:
                record.prompt_tokens = chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                record.cached_tokens = details.cached_tokens if details else None
                record.completion_tokens = chunk.usage.completion_tokens
            for part in chunk.choices:
                delta = part.delta
                if record.ttft_s is None and (delta.content or delta.tool_calls):
                    now = (time.monotonic() - started) * config.time_scale
                    record.ttft_s = now - record.sent
                text.append(delta.content or "")
                for call in delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.id or slot["id"]
                    if call.function is not None:
                        slot["name"] += call.function.name or ""
                        slot["arguments"] += call.function.arguments or ""
    except openai.OpenAIError as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]
        return None
    finally:
        record.end = (time.monotonic() - started) * config.time_scale
    if tool is not None:
        if not calls:
            record.error = "no tool call in the answer"
            return None
        record.called = calls[min(calls)]["name"]
        tool_calls = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(calls.items())
        ]  # fmt: skip
        return {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return {"role": "assistant", "content": "".join(text)}


async def _run_session(
    client: openai.AsyncOpenAI,
    config: SessionReplayConfig,
    trace: SessionTrace,
    session: Session,
    started: float,
) -> SessionRecord:
    scale = config.time_scale
    record = SessionRecord(session.sid, session.arrival)
    await asyncio.sleep(max(0.0, started + session.arrival / scale - time.monotonic()))
    messages, tools = messages_of(trace, session)
    params = trace.params
    for number in range(session.calls):
        step = session.steps[number] if number < len(session.steps) else None
        call = CallRecord(
            session.sid, number, (time.monotonic() - started) * scale, None, 0.0, None, None
        )
        if config.shared_tokens is not None:
            call.shared_tokens = config.shared_tokens.get(session.domain)
        record.calls.append(call)
        # a tool call gets the room its arguments need (the engine stops at the call's
        # end: a cap at `tool_call_tokens` would cut its JSON, which the next call could
        # not send back); the twin asks the same, and the engine's call
        # (`session_twin.EngineCall`) stops it as prism-sim does
        tokens = TOOL_CALL_CAP if step else params.final_answer_tokens
        answer = await _call(client, config, messages, tools, step.tool if step else None,
                             tokens, started, call)  # fmt: skip
        if answer is None:
            return record  # a failed call ends its session (no end: not completed)
        if step is None:
            break
        call_id = answer["tool_calls"][0]["id"]
        messages = [
            *messages,
            answer,
            {"role": "tool", "tool_call_id": call_id, "content": step.output},
        ]
        await asyncio.sleep(step.duration_s / config.time_scale)
    record.end = record.calls[-1].end
    return record


async def replay_sessions(trace: SessionTrace, config: SessionReplayConfig) -> dict[str, Any]:
    """Run every session closed-loop; the records and their summary."""
    client = openai.AsyncOpenAI(
        base_url=config.target.rstrip("/") + "/v1", api_key="unused", timeout=config.timeout_s,
        max_retries=0,
    )  # fmt: skip
    started = time.monotonic()
    try:
        records = await asyncio.gather(
            *(_run_session(client, config, trace, s, started) for s in trace.sessions)
        )
    finally:
        await client.close()
    return {"sessions": [asdict(r) for r in records], "summary": summarize(records)}


def summarize(records: list[SessionRecord]) -> dict[str, Any]:
    """Per-call TTFT percentiles, mean JCT of completed sessions, hit rate overall and on
    the non-global regions (each prompt less its agent type's shared prefix, counted
    when every call knows it), throughput."""
    calls = [c for r in records for c in r.calls]
    ttfts = [c.ttft_s for c in calls if c.ttft_s is not None and c.error is None]
    done = [r for r in records if r.end is not None]
    prompt = sum(c.prompt_tokens or 0 for c in calls)
    cached = sum(c.cached_tokens or 0 for c in calls)
    span = max((c.end for c in calls), default=0.0)
    measured = [c for c in calls if c.prompt_tokens is not None]
    non_global = None
    if measured and all(c.shared_tokens is not None for c in measured):
        own = sum(max(0, (c.prompt_tokens or 0) - (c.shared_tokens or 0)) for c in measured)
        hit = sum(max(0, (c.cached_tokens or 0) - (c.shared_tokens or 0)) for c in measured)
        non_global = hit / own if own else None
    jcts = [r.jct_s for r in done if r.jct_s is not None]
    return {
        "sessions": len(records),
        "completed_sessions": len(done),
        "calls": len(calls),
        "failed_calls": sum(1 for c in calls if c.error is not None),
        "p50_ttft_ms": 1e3 * float(np.percentile(ttfts, 50)) if ttfts else None,
        "p99_ttft_ms": 1e3 * float(np.percentile(ttfts, 99)) if ttfts else None,
        "mean_jct_ms": 1e3 * float(np.mean(jcts)) if jcts else None,
        "p99_jct_ms": 1e3 * float(np.percentile(jcts, 99)) if jcts else None,
        "hit_rate": cached / prompt if prompt else None,
        "non_global_hit_rate": non_global,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "call_throughput": len(calls) / span if span else None,
    }


def live_history_tokens(records: list[SessionRecord]) -> dict[str, float]:
    """The KV the live sessions' histories would take: at each moment the sum over the
    sessions begun and not ended of their latest call's prompt, averaged over time
    (`mean`) and at its `peak`. A pool of `mean` / 2 tokens holds half of them."""
    events: list[tuple[float, int]] = []
    for record in records:
        calls = [c for c in record.calls if c.prompt_tokens is not None]
        end = record.end if record.end is not None else max((c.end for c in calls), default=0)
        held = 0
        for call in calls:
            events.append((call.sent, call.prompt_tokens - held))  # type: ignore[operator]
            held = call.prompt_tokens or 0
        if calls:
            events.append((end, -held))
    events.sort()
    if not events:
        return {"mean": 0.0, "peak": 0.0}
    total = area = peak = 0.0
    for (t, delta), (t_next, _) in zip(events, [*events[1:], events[-1]], strict=True):
        total += delta
        peak = max(peak, total)
        area += total * (t_next - t)
    span = events[-1][0] - events[0][0]
    return {"mean": area / span if span > 0 else 0.0, "peak": peak}


def live_unique_tokens(
    records: list[SessionRecord], pieces: Mapping[str, tuple[str, str]]
) -> dict[str, float]:
    """The unique KV the live sessions hold: at each moment, each agent type's shared
    prefix once while a session of the type is live, each task's part once while a
    session of the task is live, and every live session's own history beyond them;
    averaged over time (`mean`) and at its `peak`, over the same span as
    `live_history_tokens`, which counts every session's copy of the shared parts.

    `pieces`: each session's (agent type, task). A type's prefix is its calls'
    `shared_tokens` (0 when unknown: then it counts with the task's part); a task's part
    is the shortest first prompt beyond it among the task's sessions (what they share).
    """
    measured = {
        r.sid: ([c for c in r.calls if c.prompt_tokens is not None], r)
        for r in records
        if any(c.prompt_tokens is not None for c in r.calls)
    }
    shared: dict[str, int] = {}
    task_tokens: dict[tuple[str, str], int] = {}
    for sid, (calls, _) in measured.items():
        kind, task = pieces[sid]
        head = calls[0].shared_tokens or 0
        shared[kind] = head
        part = max(0, (calls[0].prompt_tokens or 0) - head)
        task_tokens[(kind, task)] = min(task_tokens.get((kind, task), part), part)
    # (time, order, sid, own history tokens after it: None at the session's end)
    events: list[tuple[float, int, str, int | None]] = []
    for number, (sid, (calls, record)) in enumerate(measured.items()):
        kind, task = pieces[sid]
        beyond = (calls[0].shared_tokens or 0) + task_tokens[(kind, task)]
        for call in calls:
            events.append((call.sent, number, sid, max(0, (call.prompt_tokens or 0) - beyond)))
        end = record.end if record.end is not None else max(c.end for c in calls)
        events.append((end, number, sid, None))
    events.sort(key=lambda e: (e[0], e[1], e[3] is None))
    if not events:
        return {"mean": 0.0, "peak": 0.0}
    own: dict[str, int] = {}
    holders: dict[Any, int] = {}  # an agent type or a task -> its live sessions

    def hold(piece: Any, tokens: int, delta: int) -> int:
        """A session joins (+1) or leaves (-1) `piece`: the tokens the pool gains."""
        before = holders.get(piece, 0)
        holders[piece] = before + delta
        return tokens if before == 0 else -tokens if before + delta == 0 else 0

    total = area = peak = 0.0
    for index, (t, _, sid, history) in enumerate(events):
        kind, task = pieces[sid]
        parts = ((kind, shared[kind]), ((kind, task), task_tokens[(kind, task)]))
        if history is None:  # the session ended: its history, and the shared parts it held
            total -= own.pop(sid)
            total += sum(hold(piece, tokens, -1) for piece, tokens in parts)
        else:
            if sid not in own:  # the session begins: the shared parts it brings
                own[sid] = 0
                total += sum(hold(piece, tokens, 1) for piece, tokens in parts)
            total += history - own[sid]
            own[sid] = history
        peak = max(peak, total)
        t_next = events[index + 1][0] if index + 1 < len(events) else t
        area += total * (t_next - t)
    span = events[-1][0] - events[0][0]
    return {"mean": area / span if span > 0 else 0.0, "peak": peak}
