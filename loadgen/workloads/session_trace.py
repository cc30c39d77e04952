"""agent_sessions: agent programs as closed loops of model calls and tool calls.

A session is one run of an agent program. It arrives (a Poisson process of
`session_rate` sessions per second), is of one agent type (a domain: its system prompt,
policy and tool schemas are the type's shared prefix), works on one task (drawn Zipf
from the domain's tasks, so task records recur across sessions) and makes `calls` model
calls. Every call but the last ends in a tool call (`unlimited_kv_bound` counts it as
`tool_call_tokens` tokens; the replay and the twin as the engine writes it); the tool
then runs for a heavy-tailed time and returns an output that joins the history:

    system | policy | tools || records | user || (tool call | tool output) x k || ...
    global (per type)          per task     per session

Closed loop: call k+1 is sent when call k's answer is complete and its tool has run. So
the trace holds only what does not depend on the engine: arrivals, agent types, tasks,
tools, tool durations and tool outputs; the replay puts the model's own tool calls into
the history, as an agent does. Which tool a call calls is the step's: each call's last
message names it (`tool_cue`: a short user message after the task's for the first call,
so that the task's message stays the same in every session of the task; the end of the
previous tool's output for the rest), and the engine's model calls the tool its context
names (prism-sim's `chosen_tool`; the twin generates the same call), so the tool whose
duration the trace draws is the tool the call names.

Distributions (`SessionParams`), with `tool_model` = `independent` (the default):
* tool duration: lognormal with median `tool_median_s` (1 s) and σ `tool_sigma` (1.2): p90
  about 4.7 s, p99 about 16 s; `tool_scale` multiplies every duration;
* tool output: lognormal in tokens, median `output_median_tokens` (600), σ 0.8, clipped to
  [`output_min_tokens`, `output_max_tokens`] = [100, 4000], so histories grow to tens of
  thousands of tokens over a session;

With `tool_model` = `by_tool` a tool behaves like its kind (`tool_kind`, read from its
name): a lookup answers in tens of milliseconds, a search in seconds, a write in under
a second, running code in about ten seconds and a hand-off to a human in about a minute
(`TOOL_KINDS`). Each tool's own median is its kind's times a factor drawn once per tool
(lognormal, σ `TOOL_SPREAD`), so two lookups differ; each call draws around its tool's
median with its kind's σ, and its output size around its kind's median with
`output_sigma`. `tool_scale` still multiplies every duration. Arrivals, agent types,
tasks and call counts are drawn from their own streams, so they are the same in both
models; the `independent` model draws exactly as it always did.
* calls per session: uniform in [`min_calls`, `max_calls`] = [6, 16];
* tasks: Zipf with exponent `task_alpha` (1.1) over each domain's tasks.

`unlimited_kv_bound` gives the hit rate of a cache that never evicts, overall and on the
non-global regions (everything after a type's shared prefix, the paper's agent metric),
from the pieces' token counts.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from loadgen.workloads.agent_material import DomainMaterial
from loadgen.workloads.agent_trace import AgentTraceParams, load_domains
from loadgen.workloads.sampling import poisson_arrivals, stream
from loadgen.workloads.textgen import TokenCounter, random_text
from loadgen.workloads.trace_params import SessionParams

WORKLOAD = "agent_sessions"


@dataclass(frozen=True)
class ToolKind:
    """How a kind of tool behaves: its median duration (seconds), the σ of one call's
    duration around its tool's median, and its outputs' median size (tokens)."""

    median_s: float
    sigma: float
    output_tokens: int


TOOL_KINDS: dict[str, ToolKind] = {
    "lookup": ToolKind(0.04, 0.5, 300),  # read one record, compute a small value
    "write": ToolKind(0.5, 0.5, 200),  # change a record, send a message
    "search": ToolKind(2.0, 0.7, 1500),  # query an index or an API, list many items
    "code": ToolKind(10.0, 0.9, 800),  # run a program or a query
    "human": ToolKind(60.0, 0.8, 150),  # wait for a person
}
TOOL_SPREAD = 0.4  # σ of a tool's own median around its kind's
# The words of a tool's name that say its kind (the first such word decides).
_KIND_NAMES = {
    "human": "human ask approve confirm escalate",
    "code": "run execute exec python code sql shell",
    "search": "search list query browse scan crawl",
    "lookup": "get find lookup read fetch check show calculate describe status count compute",
}
_KIND_WORDS = {word: kind for kind, words in _KIND_NAMES.items() for word in words.split()}


def tool_kind(name: str) -> str:
    """A tool's kind from the words of its name (`transfer_to_human_agents`: human,
    `search_direct_flight`: search, `get_user_details`: lookup); a name that says none
    of them changes something (write). Words are split at `_`, `-`, `.` and camelCase."""
    spaced = "".join(f" {c.lower()}" if c.isupper() else c for c in name)
    words = spaced.replace("_", " ").replace("-", " ").replace(".", " ").split()
    kinds = [_KIND_WORDS[w] for w in words if w in _KIND_WORDS]
    if "human" in kinds:
        return "human"  # a hand-off to a person, whatever else its name says
    return kinds[0] if kinds else "write"


def tool_median_s(seed: int, tool: str) -> float:
    """A tool's own median duration (seconds; `by_tool`): its kind's times a factor drawn
    from the tool's own stream, so adding a tool changes no other tool's."""
    factor = float(stream(seed, f"tool-median:{tool}").lognormal(0.0, TOOL_SPREAD))
    return TOOL_KINDS[tool_kind(tool)].median_s * factor


@dataclass(frozen=True)
class ToolStep:
    """What one tool call does: its tool, how long it runs, what it returns."""

    tool: str
    duration_s: float
    output: str


@dataclass(frozen=True)
class Session:
    sid: str
    arrival: float
    domain: str
    task_id: str
    records: str
    user: str
    steps: tuple[ToolStep, ...]  # one per call but the last

    @property
    def calls(self) -> int:
        return len(self.steps) + 1


@dataclass(frozen=True)
class SessionTrace:
    params: SessionParams
    seed: int
    domains: dict[str, DomainMaterial]
    sessions: tuple[Session, ...]


def _zipf_weights(n: int, alpha: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** alpha
    return weights / weights.sum()


def tool_names(domain: DomainMaterial) -> list[str]:
    """The function names in a domain's tool schemas (`tools` is a JSON list)."""
    try:
        tools = json.loads(domain.tools)
    except ValueError:
        return [f"{domain.name}_tool"]
    names = [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]
    return [n for n in names if isinstance(n, str)] or [f"{domain.name}_tool"]


def tool_cue(tool: str) -> str:
    """The words in a call's last message that name the tool the model calls next:
    prism-sim's forced call takes the tool the last message names last
    (`prism_sim.tool_calls.chosen_tool`), as a model reads its context."""
    return f"Next: call {tool}."


def build_session_trace(
    params: SessionParams, tokenizer: TokenCounter, seed: int = 0
) -> SessionTrace:
    """The sessions of one seed: every random draw from its own stream, so changing one
    distribution's parameters leaves the others' draws as they were."""
    material = AgentTraceParams(source=params.source, tau2_dir=params.tau2_dir)
    domains = {d.name: d for d in load_domains(material, tokenizer, seed)}
    names = sorted(domains)
    arrivals = poisson_arrivals(stream(seed, "session-arrivals"), params.num_sessions,
                                params.session_rate)  # fmt: skip
    pick, durations = stream(seed, "session-pick"), stream(seed, "tool-durations")
    sizes, content = stream(seed, "tool-outputs"), stream(seed, "tool-content")
    mu_out = math.log(params.output_median_tokens)
    task_weights = {n: _zipf_weights(len(d.tasks), params.task_alpha) for n, d in domains.items()}
    medians: dict[str, float] = {}  # by_tool: each tool's own median duration
    sessions = []
    for number, arrival in enumerate(arrivals):
        domain = domains[names[int(pick.integers(len(names)))]]
        task = domain.tasks[int(pick.choice(len(domain.tasks), p=task_weights[domain.name]))]
        calls = int(pick.integers(params.min_calls, params.max_calls + 1))
        tools = tool_names(domain)
        steps = []
        for _ in range(calls - 1):
            if params.tool_model == "by_tool":
                tool = tools[int(content.integers(len(tools)))]
                kind = TOOL_KINDS[tool_kind(tool)]
                median_s = medians.setdefault(tool, tool_median_s(seed, tool))
                raw_s = float(durations.lognormal(math.log(median_s), kind.sigma))
                raw_tokens = sizes.lognormal(math.log(kind.output_tokens), params.output_sigma)
            else:
                raw_s = float(
                    durations.lognormal(math.log(params.tool_median_s), params.tool_sigma)
                )
                raw_tokens = sizes.lognormal(mu_out, params.output_sigma)
                tool = tools[int(content.integers(len(tools)))]
            duration = params.tool_scale * raw_s
            tokens = int(np.clip(round(raw_tokens),
                                 params.output_min_tokens, params.output_max_tokens))  # fmt: skip
            steps.append(ToolStep(tool, duration, random_text(tokenizer, content, tokens)))
        # each tool's output ends by naming the next step's tool (`tool_cue`)
        steps = [replace(step, output=f"{step.output}\n\n{tool_cue(after.tool)}")
                 for step, after in itertools.pairwise(steps)] + steps[-1:]  # fmt: skip
        user = task.steps[0].user if task.steps else f"Help me with task {task.task_id}."
        sessions.append(
            Session(
                sid=f"s{number:05d}",
                arrival=arrival,
                domain=domain.name,
                task_id=task.task_id,
                records=task.records,
                user=user,
                steps=tuple(steps),
            )
        )
    return SessionTrace(params, seed, domains, tuple(sessions))


@dataclass(frozen=True)
class Bound:
    hit_rate: float
    non_global_hit_rate: float
    prompt_tokens: int
    non_global_tokens: int


def unlimited_kv_bound(trace: SessionTrace, tokenizer: TokenCounter) -> Bound:
    """Hit rate with a KV pool that never evicts (exact prefixes, pieces counted apart).

    A session's first call reuses its type's prefix when the type was seen before, and
    its records and user message too when the task was; every later call reuses the
    whole previous prompt and prefills the tool call and the tool's output. The tool
    call's own generated tokens are not reused: the chat template renders the call
    anew, in other tokens than the model generated (through the proxy and prism-sim, a
    forced tool call's next turn reported `cached_tokens` equal to the previous prompt,
    506 then 781). The non-global rate leaves each type's shared prefix out of both
    counts."""

    def count(text: str) -> int:
        return len(tokenizer.encode(text))

    prefix = {
        name: count(d.policy) + count(d.tools) for name, d in trace.domains.items()
    }  # system prompt folded into the policy's count: one shared piece per type
    seen_types: set[str] = set()
    seen_tasks: set[tuple[str, str]] = set()
    total = cached = total_ng = cached_ng = 0
    call_tokens = trace.params.tool_call_tokens
    for session in sorted(trace.sessions, key=lambda s: s.arrival):
        shared = prefix[session.domain]
        task_part = count(session.records) + count(session.user)
        prompt = shared + task_part
        hit = (shared if session.domain in seen_types else 0) + (
            task_part if (session.domain, session.task_id) in seen_tasks else 0
        )
        total, cached = total + prompt, cached + hit
        total_ng += task_part
        cached_ng += task_part if (session.domain, session.task_id) in seen_tasks else 0
        seen_types.add(session.domain)
        seen_tasks.add((session.domain, session.task_id))
        if session.steps:  # the first call's own message naming its tool, never cached
            cue = count(tool_cue(session.steps[0].tool))
            prompt, total, total_ng = prompt + cue, total + cue, total_ng + cue
        for step in session.steps:
            reused = prompt  # the tool call is re-rendered by the template (see above)
            prompt = reused + call_tokens + count(step.output)
            total, cached = total + prompt, cached + reused
            total_ng, cached_ng = total_ng + prompt - shared, cached_ng + reused - shared
    return Bound(
        hit_rate=cached / total if total else 0.0,
        non_global_hit_rate=cached_ng / total_ng if total_ng else 0.0,
        prompt_tokens=total,
        non_global_tokens=total_ng,
    )


def summary(trace: SessionTrace) -> dict[str, Any]:
    """The trace's shape in numbers: sessions, calls, tool durations, span."""
    durations = [s.duration_s for x in trace.sessions for s in x.steps]
    return {
        "sessions": len(trace.sessions),
        "calls": sum(s.calls for s in trace.sessions),
        "tool_duration_median_s": float(np.median(durations)) if durations else 0.0,
        "tool_duration_p99_s": float(np.percentile(durations, 99)) if durations else 0.0,
        "span_s": trace.sessions[-1].arrival if trace.sessions else 0.0,
    }


def _pieces(session: Session) -> tuple[tuple[str, ...], ...]:
    """A session's prompt as `belady_bound`'s nested pieces: its agent type's shared
    prefix, its task's part, its own history."""
    return ("head", session.domain), ("task", session.domain, session.task_id), ("own", session.sid)


def belady_bound(
    trace: SessionTrace,
    calls: list[tuple[str, float, float, int]],
    shared: dict[str, int],
    capacity_tokens: int,
) -> Bound:
    """Hit rate of Belady's eviction with a pool of `capacity_tokens`, on one run's calls
    `(sid, start, end, prompt_tokens)`: `start` when its prefill reads the cache (its
    first token, in the records), `end` when its answer is complete.

    Every prompt is three nested pieces: the agent type's shared prefix (`shared`), the
    task's part (the session's first prompt beyond it, shared by sessions of the same
    task) and the session's own history; a call reuses the previous call's whole prompt,
    as in `unlimited_kv_bound`. A call's prompt is resident from its start and locked
    until its end, as a running request's is. Whenever the pool is over capacity, tokens
    are evicted from the tail of the unlocked piece whose next use is furthest (a
    finished session's history: never). A piece's next use is the next start of a call
    whose prompt holds it: for a shared piece, of any session under it, cached or not,
    begun or not (a later session of the same task reuses the task's piece), so it goes
    only after every piece below it that is used later. It knows every return time and evicts
    exactly as many tokens as needed; it is a model of the run, not of the engine's tree
    (pieces as above, the running requests' outputs not held), so a measured line can
    come out a little above it."""
    sessions = {s.sid: s for s in trace.sessions}
    order = sorted(range(len(calls)), key=lambda i: (calls[i][1], i))
    first_prompt: dict[str, int] = {}
    uses: dict[tuple[str, ...], list[float]] = {}  # piece -> its calls' starts, in order
    for i in order:
        sid, start = calls[i][0], calls[i][1]
        first_prompt.setdefault(sid, calls[i][3])
        for piece in _pieces(sessions[sid]):
            uses.setdefault(piece, []).append(start)
    events = sorted([(calls[i][1], 1, i) for i in order] + [(calls[i][2], 0, i) for i in order])
    resident: dict[tuple[str, ...], int] = {}  # piece -> resident tokens
    size: dict[tuple[str, ...], int] = {}
    children: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    running: dict[str, int] = {}  # sid -> calls running (their pieces are locked)
    total = cached = total_ng = cached_ng = used = 0
    now = 0.0

    def next_of(piece: tuple[str, ...]) -> float:
        starts = uses[piece]
        at = bisect.bisect_right(starts, now)  # the calls starting now are running
        return starts[at] if at < len(starts) else math.inf

    def locked(piece: tuple[str, ...]) -> bool:
        if piece[0] == "own":
            return running.get(piece[1], 0) > 0
        return any(locked(c) for c in children.get(piece, ()) if resident.get(c, 0) > 0)

    for at, kind, i in events:
        sid, _, _, prompt = calls[i]
        if kind == 0:
            running[sid] -= 1
            continue
        now = at
        session = sessions[sid]
        head, task, own = _pieces(session)
        s_tokens = shared[session.domain]
        t_tokens = max(0, first_prompt[sid] - s_tokens)
        o_tokens = max(0, prompt - s_tokens - t_tokens)
        hit = 0
        for piece, want in ((head, s_tokens), (task, t_tokens), (own, o_tokens)):
            have = resident.get(piece, 0)
            hit += min(have, want)
            if have < want:
                break
        total, cached = total + prompt, cached + hit
        total_ng += prompt - s_tokens
        cached_ng += max(0, hit - s_tokens)
        for piece, want, up in (
            (head, s_tokens, None),
            (task, t_tokens, head),
            (own, o_tokens, task),
        ):
            used += want - resident.get(piece, 0)
            resident[piece], size[piece] = want, want
            if up is not None:
                children.setdefault(up, set()).add(piece)
        running[sid] = running.get(sid, 0) + 1
        while used > capacity_tokens:
            leaves = [
                p for p, n in resident.items()
                if n > 0 and not locked(p)
                and not any(resident.get(c, 0) > 0 for c in children.get(p, ()))
            ]  # fmt: skip
            if not leaves:
                break  # everything left is running: the engine would wait
            victim = max(leaves, key=lambda p: (next_of(p), p))
            cut = min(resident[victim], used - capacity_tokens)
            resident[victim] -= cut
            used -= cut
    return Bound(
        hit_rate=cached / total if total else 0.0,
        non_global_hit_rate=cached_ng / total_ng if total_ng else 0.0,
        prompt_tokens=total,
        non_global_tokens=total_ng,
    )
