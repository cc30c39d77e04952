"""Multi-turn agent chats as a text agent sends them: the whole history every turn.

The material is the agent_prefix workload's synthetic domain (`loadgen.workloads.agent_material`,
seeded): a system message with the domain's policy and tool schemas (~3.9k tokens, the
same for every conversation), then per step a user message and the assistant's tool
call. The tool's output comes back in the next user message, before the user's next
words: system, user and assistant roles only, which the proxy tokenizes itself (a
`tool` role goes through passthrough, docs/proxy.md). A conversation's first user
message opens with its session number and the customer's records (~400 tokens).
`agent_turns` interleaves `conversations` conversations round-robin, as concurrent
agents would arrive, and opens the next task when one ends. Deterministic in `seed`.
"""

from __future__ import annotations

from typing import Any

from loadgen.workloads.agent_material import SyntheticShape, TaskMaterial, synthetic_domain
from loadgen.workloads.sampling import stream
from loadgen.workloads.textgen import TokenCounter

Messages = list[dict[str, Any]]


def _turns_of(system: str, task: TaskMaterial, session: int) -> list[Messages]:
    """Every call of one task: the history so far, then the step's user message. The
    first user message opens with the session number and the customer's records; each
    later one with the previous tool call's output."""
    history: Messages = [{"role": "system", "content": system}]
    calls = []
    for number, step in enumerate(task.steps):
        if number == 0:
            user = f"[session {session}] Records:\n{task.records}\n\n{step.user}"
        else:
            user = f"Tool output: {task.steps[number - 1].tool_output}\n\n{step.user}"
        history.append({"role": "user", "content": user})
        calls.append(list(history))
        history.append({"role": "assistant", "content": step.assistant})
    return calls


def agent_turns(
    tokenizer: TokenCounter, count: int, *, conversations: int = 8, seed: int = 0
) -> list[Messages]:
    """`count` chat requests (message lists) of `conversations` interleaved agents."""
    shape = SyntheticShape(tasks_per_domain=16)
    domain = synthetic_domain(tokenizer, stream(seed, "agent-chats"), "airline", shape)
    system = domain.policy + "\n\nAvailable tools:\n" + domain.tools
    tasks = iter(domain.tasks * (1 + count // len(domain.tasks)))
    sessions = iter(range(count + conversations))
    open_calls = [_turns_of(system, next(tasks), next(sessions)) for _ in range(conversations)]
    requests: list[Messages] = []
    slot = 0
    while len(requests) < count:
        if not open_calls[slot]:
            open_calls[slot] = _turns_of(system, next(tasks), next(sessions))
        requests.append(open_calls[slot].pop(0))
        slot = (slot + 1) % conversations
    return requests
