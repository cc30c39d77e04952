"""agent_sessions in the twin: closed-loop agent programs through the proxy's admission
and the simulated engine, in modeled time (`prism-loadgen sessions --twin`).

Each session is played as `session_replay` plays it against a live endpoint: a call is
sent when the previous answer has reached the client (one hop after the engine finished
it) and its tool has run. The chat is what an agent sends: `tools`, the assistant's tool
call, a `tool` message with the tool's output.

A call that must call a tool is what `session_replay` makes of it and what prism-sim
serves (`EngineCall`): it asks for `TOOL_CALL_CAP` tokens, which the engine reserves at
admission as for any request; the engine generates the forced call's JSON array
(`prism_sim.tool_calls.forced_call`: the tool the call's last message names, the
step's (`session_trace.tool_cue`), its required parameters as placeholders) and its
stop token; the client's TTFT is when the stream shows the call's name
(`JsonArrayParser`: once the name has been generated), and it appends the call as the
engine returned it (`tool_call_message`).

On a proxy line the request is what the proxy's plan makes of it (`prompts.plan`): the
chat rendered with its tools and cut at its message ends (`find_turns`, with the last
message a segment when the session features are on), queued in QAS with its program's start when it
continues a paused session (`admission.sessions`). When the proxy learns that an answer
ended in a tool call (a hop after the engine finished it), it asks DART to retain the
session's path (applied inline, as the twin applies P̂_t); with `retain_from` "call", from
when the stream shows the tool call (a hop after the answer's `EngineCall.name_tokens`th
token, its name's last). When a continuation arrives, it releases it. Without a policy it
is native SGLang: the chat rendered and sent at once.

With `SessionFeatures.known_returns` the table ranks and times paused sessions by their
true return delays (`KnownReturns`): how much a perfect predictor would be worth.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from backend_plugin.dart.core import RetainedLoss
from loadgen.clients.session_replay import (
    TOOL_CALL_CAP,
    CallRecord,
    SessionRecord,
    live_history_tokens,
    live_unique_tokens,
    messages_of,
    summarize,
)
from loadgen.twin.twin import Twin, TwinSetup, _Tracked
from loadgen.workloads.session_trace import Session, SessionTrace
from loadgen.workloads.trace_format import Trace, TraceHeader, TraceRequest
from prism_proxy.admission.reprefill import Continuation, Pause, reprefill_tokens
from prism_proxy.admission.returns import Fit, ReturnModel
from prism_proxy.admission.sessions import SessionParams, SessionTable
from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.prompts.plan import Forward, plan_chat
from prism_sim.api_models import ToolIn
from prism_sim.request import SimRequest
from prism_sim.tool_calls import ForcedCall, forced_call, message_text
from prism_tokens.chat import content_format, template_messages, template_tools
from prism_tokens.tokenizer import Tokenizer
from prism_wire import Retention


@dataclass(frozen=True)
class EngineCall:
    """The tool call prism-sim generates for a chat whose `tool_choice` is "required"
    (`prism_sim.tool_calls.forced_call`, as its chat endpoint scripts it): the call, the
    tokens it generates (the JSON array, then the stop token), and the token at which
    the stream shows the call (its name generated: SGLang's `JsonArrayParser` emits the
    id and name then, the first delta the client and the proxy see)."""

    call: ForcedCall
    script: list[int]
    name_tokens: int

    @classmethod
    def of(cls, call: ForcedCall, tokenizer: Tokenizer) -> EngineCall:
        ids = tokenizer.encode(call.text)
        stop = tokenizer.eos_token_id
        script = ids + ([] if stop is None else [stop])
        named = next(
            (n for n in range(1, len(ids) + 1)
             if len(tokenizer.decode(ids[:n], skip_special_tokens=True)) >= call.name_end),
            len(script),
        )  # fmt: skip
        return cls(call, script, named)


@dataclass(frozen=True)
class SessionFeatures:
    """The proxy's session features: detect continuations (`detect`), ask DART to keep
    paused sessions (`retain`: needs `eviction="dart"`), with the table's parameters.
    QAS's precedence for continuations is `QasParams.continuation_share`."""

    detect: bool = False
    retain: bool = False
    params: SessionParams = field(default_factory=SessionParams)
    known_returns: bool = False  # the table's return model knows (`KnownReturns`)


class KnownReturns(ReturnModel):
    """A bound, not a predictor: the return model of a table that knows when each
    paused session will be back (the twin knows how long each tool runs). Told the
    pausing session's true delay before the table asks, it answers that delay (and
    `margin_s` of slack) for the median and for every quantile (the time-to-live), so
    the table keeps paused sessions in the order they will be back, each for as long as
    it will be away, within the table's own bounds."""

    def __init__(self, margin_s: float = 0.05) -> None:
        super().__init__()
        self.margin_s = margin_s
        self.delay_s = 0.0  # the delay of the session the table is told of next

    def fit(self, head: str, tool: str) -> Fit:
        return Fit(math.log(self.delay_s + self.margin_s), 1e-9, 1, "tool")


def tool_call_message(session: Session, number: int, engine_call: EngineCall) -> dict[str, Any]:
    """The assistant's tool call of call `number` as the client appends it: the call
    the engine returned (its name and arguments; the id is the twin's)."""
    call = {"id": f"call_{session.sid}_{number}", "type": "function",
            "function": {"name": engine_call.call.name,
                         "arguments": engine_call.call.arguments}}  # fmt: skip
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def shared_tokens(trace: SessionTrace, tokenizer: Tokenizer) -> dict[str, int]:
    """Each agent type's shared prefix in tokens: its system turn with the tools, as
    the template renders it (the paper's global region; the rest is non-global)."""
    shared = {}
    fmt = content_format(tokenizer.chat_template)
    for name, domain in trace.domains.items():
        given = template_messages([{"role": "system", "content": domain.policy}], fmt)
        tools = template_tools(json.loads(domain.tools), "auto")
        text = tokenizer.render_chat(given, add_generation_prompt=False, tools=tools)
        shared[name] = len(tokenizer.encode_chat(text))
    return shared


@dataclass
class _Call:
    session: Session
    number: int
    messages: list[dict[str, Any]]
    record: CallRecord
    tracked: _Tracked | None = None
    pause: Pause | None = None  # the paused session it continues, as the table knew it
    named_s: float | None = None  # when the engine generated the tool call's name
    engine_call: EngineCall | None = None  # the tool call it makes (None: the last call)


class SessionTwin(Twin):
    def __init__(
        self,
        trace: SessionTrace,
        setup: TwinSetup,
        tokenizer: Tokenizer,
        features: SessionFeatures | None = None,
    ) -> None:
        calls = sum(s.calls for s in trace.sessions)
        header = TraceHeader("agent_sessions", {}, trace.seed, calls, tokenizer.name)
        super().__init__(Trace(header, []), setup, tokenizer, max_queue=calls + 1)
        self.sessions_trace = trace
        self.tokenizer = tokenizer
        self.features = features or SessionFeatures()
        self.fmt = content_format(tokenizer.chat_template)
        self.shared = shared_tokens(trace, tokenizer)
        self.table = SessionTable(self.features.params) if self.features.detect else None
        self.known: KnownReturns | None = None
        if self.table is not None and self.features.known_returns:
            self.known = self.table.returns = KnownReturns()
        dart = getattr(self.engine.extension, "core", None)
        self.retainer = dart if self.features.retain and self.core is not None else None
        if self.context is not None:  # the session features cut a chat at its last message
            self.context = replace(self.context, sessions=self.features.detect)
        self.records: dict[str, SessionRecord] = {}
        self.calls: dict[str, _Call] = {}
        self.continuations: list[Continuation] = []  # every served call after a first
        self.engine_records: list[dict[str, Any]] = []  # each served call, as the engine saw it
        self.tools = {s.sid: messages_of(trace, s)[1] for s in trace.sessions}
        self.tools_in = {
            name: [ToolIn.model_validate(t) for t in json.loads(domain.tools)]
            for name, domain in trace.domains.items()
        }
        self.engine_calls: dict[tuple[str, str], EngineCall] = {}  # by (agent type, tool)
        for session in trace.sessions:
            self.records[session.sid] = SessionRecord(session.sid, session.arrival)
            messages, _ = messages_of(trace, session)
            self.schedule_arrival(session.arrival, (session, 0, messages))

    # --- the client ------------------------------------------------------------------
    def _arrive(self, item: Any) -> None:
        session, number, messages = item
        params = self.sessions_trace.params
        step = number < len(session.steps)
        rid = f"{session.sid}-{number:02d}"
        record = CallRecord(session.sid, number, self.now, None, 0.0, None, None)
        record.shared_tokens = self.shared[session.domain]
        self.records[session.sid].calls.append(record)
        call = _Call(session, number, messages, record)
        call.engine_call = self._engine_call(session.domain, messages) if step else None
        self.calls[rid] = call
        # as `session_replay` asks: room for the call's JSON (the engine stops at its
        # end), or the final answer's tokens (filler: prism-sim's chat answer)
        max_tokens = TOOL_CALL_CAP if step else params.final_answer_tokens
        script = call.engine_call.script if call.engine_call else None
        request = TraceRequest(rid, self.now, "", (), "", max_tokens, False, False)
        tracked = call.tracked = _Tracked(request, output_script=script)
        self.tracked[rid] = tracked
        if self.core is None:
            given = template_messages(messages, self.fmt)
            tools = template_tools(self.tools[session.sid], "required" if step else "auto")
            text = self.tokenizer.render_chat(given, add_generation_prompt=True, tools=tools)
            ids = self.tokenizer.encode_chat(text)
            sim = SimRequest(rid, ids, max_tokens, self.now, output_script=script)
            self._send(lambda: self._submit(tracked, sim))
            return
        # the chat as the proxy's edge plans it (`prompts.plan`): the engine's chat
        # endpoint serves it, scheduled by its turns
        choice = "required" if step else "auto"
        body = {"model": "twin", "messages": messages, "tools": self.tools[session.sid]}
        body["tool_choice"] = choice
        assert self.context is not None
        plan = plan_chat(ChatCompletionRequest.model_validate(body), body, self.context)
        if not isinstance(plan, Forward) or plan.job is None:
            raise ValueError(f"{rid}: the proxy would not schedule this call by its turns")
        tracked.job = job = plan.job
        tracked.engine_served = True
        program_start = None
        if self.table is not None:
            prompt = len(job.build(()).prompt_fields["input_ids"]) - job.head_tokens
            found = self.table.arrive(rid, job.segments, job.prefix_key, prompt, self.now)
            self._retain(found.retention)
            pause = found.pause
            if pause is not None and self.retainer is None:
                pause = replace(pause, retained=False)  # the table's word reached no DART
            call.pause = pause
            program_start = found.program_start if found.continues else None
        self.core.arrive(job.queued(rid, self.now, program_start=program_start), self.now)

    def _engine_call(self, domain: str, messages: list[dict[str, Any]]) -> EngineCall:
        """The call prism-sim's model makes for these messages under "required"."""
        context = message_text(messages[-1].get("content"))
        call = forced_call(self.tools_in[domain], "required", context)
        assert call is not None
        key = (domain, call.name)
        if key not in self.engine_calls:
            self.engine_calls[key] = EngineCall.of(call, self.tokenizer)
        return self.engine_calls[key]

    def _retain(self, retention: Retention) -> None:
        if self.retainer is not None and retention:
            self.retainer.inbox.submit_retain(retention)
            self.retainer.apply_pending()

    def _on_progress(self, sim: SimRequest) -> None:
        super()._on_progress(sim)
        table = self.table
        if table is not None and (len(sim.output_ids) == 1 or sim.finished):
            self._send(lambda: self._retain(table.started(sim.rid, self.now)))
        call = self.calls.get(sim.rid)
        engine_call = call.engine_call if call is not None else None
        if (
            engine_call is not None
            and call is not None
            and call.named_s is None
            and (len(sim.output_ids) >= engine_call.name_tokens or sim.finished)
        ):
            call.named_s = self.now  # the stream shows the call (with the end at the latest)
            if table is not None:
                tools = (engine_call.call.name,)
                self._send(lambda: self._calling(sim.rid, call, tools))
        if sim.finished:
            self._send(lambda: self._answered(sim))

    def _calling(self, rid: str, call: _Call, tools: tuple[str, ...]) -> None:
        """The stream shows `call`'s tool call: the table hears of it (`calling`)."""
        assert self.table is not None
        self._tell_known(call)
        self._retain(self.table.calling(rid, self.now, tools))

    def _tell_known(self, call: _Call) -> None:
        """With `KnownReturns`, tell it how long `call`'s tool will run (the session is
        back that long after its answer reaches the client)."""
        if self.known is not None and call.number < len(call.session.steps):
            self.known.delay_s = call.session.steps[call.number].duration_s

    def _submit(self, tracked: _Tracked, sim: SimRequest) -> None:
        super()._submit(tracked, sim)
        if tracked.error is not None:
            self._send(lambda: self._answered(sim))

    def _answered(self, sim: SimRequest) -> None:
        """The answer reached the proxy and the client (one hop after the engine)."""
        call = self.calls.pop(sim.rid)
        session, number, record = call.session, call.number, call.record
        tracked = call.tracked
        assert tracked is not None
        step = number < len(session.steps)
        record.end = self.now
        failed = tracked.error is not None or sim.first_token_s is None
        if failed:
            record.error = tracked.error or "not served"
            if self.table is not None:
                self._retain(self.table.forget(sim.rid, self.now))
            return
        # the client's first delta: the call's name, or the answer's first token
        shown = call.named_s if step and call.named_s is not None else sim.first_token_s
        record.ttft_s = shown + self.setup.hop_s - record.sent
        record.prompt_tokens = len(sim.input_ids)
        record.cached_tokens = sim.cached_tokens
        record.completion_tokens = len(sim.output_ids)
        record.called = call.engine_call.call.name if call.engine_call else None
        self.engine_records.append(sim.timeline())
        if number > 0:
            self._account(call, sim)
        if self.table is not None:
            tools = (call.engine_call.call.name,) if call.engine_call else ()
            self._tell_known(call)
            self._retain(self.table.finish(sim.rid, step, self.now, tools))
            self.table.expire(self.now)
        if not step:
            self.records[session.sid].end = self.now
            return
        assert call.engine_call is not None
        answer = tool_call_message(session, number, call.engine_call)
        output = {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"],
                  "content": session.steps[number].output}  # fmt: skip
        later = self.now + session.steps[number].duration_s
        self.schedule_arrival(later, (session, number + 1, [*call.messages, answer, output]))

    def _account(self, call: _Call, sim: SimRequest) -> None:
        """Record what the continuation `call` found of its history (`reprefill`)."""
        history = self.records[call.session.sid].calls[call.number - 1].prompt_tokens
        if history is None or sim.first_token_s is None:
            return
        pause, lost = call.pause, RetainedLoss()
        if pause is not None and self.retainer is not None:
            lost = self.retainer.retained_loss(pause.key)
        cached, sent = sim.cached_tokens or 0, call.record.sent
        self.continuations.append(
            Continuation(history, cached, pause, sent, sim.first_token_s, *lost)
        )


def simulate_sessions(
    trace: SessionTrace,
    setup: TwinSetup,
    tokenizer: Tokenizer,
    features: SessionFeatures | None = None,
) -> dict[str, Any]:
    """Play every session through the twin; the records and their summary."""
    twin = SessionTwin(trace, setup, tokenizer, features)
    twin.run()
    records = list(twin.records.values())
    pieces = {s.sid: (s.domain, s.task_id) for s in trace.sessions}
    return {
        "config": {
            "twin": {**asdict(setup), "qas": asdict(setup.qas)},
            "sessions": asdict(twin.features),
        },
        "summary": {
            **summarize(records),
            "live_history_tokens": live_history_tokens(records),
            "live_unique_tokens": live_unique_tokens(records, pieces),
            "reprefill_tokens": reprefill_tokens(twin.continuations),
        },
        "sessions": [asdict(r) for r in records],
        "engine_state": twin.engine_state(),
        "session_table": twin.table.stats() if twin.table is not None else None,
        "engine_records": twin.engine_records,
    }
