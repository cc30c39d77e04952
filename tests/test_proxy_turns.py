"""Message structure through the proxy: an agent loop with tools, sent by the
real `openai` client with no PRISM field, to prism-sim running DART.

Each call is queued with its turns (the tools' system turn as the head, each earlier
message a segment), goes to the engine's own chat endpoint (which renders it and parses
the tool calls), reuses the call before from the prefix cache, and its anchors, riding
in `custom_params`, are placed by the engine's DART."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import openai
import proxy_support
import pytest
from proxy_support import DartSim, running_proxy
from sim_support import common_prefix

from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.prompts.conversation import find_turns
from prism_tokens.chat import content_format, template_messages, template_tools
from prism_tokens.tokenizer import load_tokenizer

TOKEN = secrets.token_hex(8)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
SYSTEM = "You are a travel agent. Use the tools to answer."


@pytest.fixture(scope="module")
def dart_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DartSim]:
    with proxy_support.dart_sim(tmp_path_factory.mktemp("sim"), TOKEN) as sim:
        yield sim


async def test_an_agent_loop_is_scheduled_by_its_turns_and_anchored(dart_sim) -> None:
    sim, control_url = dart_sim
    tokenizer = load_tokenizer()
    fmt = content_format(tokenizer.chat_template)
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Plan a weekend: the weather in Paris, then in Rome?"},
    ]
    prompts: list[list[int]] = []
    async with (
        running_proxy(sim.url, control_url=control_url, control_token=TOKEN) as proxy,
        openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused") as client,
    ):
        for turn in range(3):
            answer = await client.chat.completions.create(
                model="m", messages=messages, tools=TOOLS, tool_choice="required", max_tokens=64
            )
            # the proxy rendered what the engine rendered: the prompt the engine reports
            given = template_messages(messages, fmt)
            ids = find_turns(tokenizer, given, template_tools(TOOLS, "required")).ids
            assert answer.usage.prompt_tokens == len(ids)
            if prompts:
                # the call before, and its answer, came back from the prefix cache
                cached = answer.usage.prompt_tokens_details.cached_tokens
                assert cached >= common_prefix(prompts[-1], ids) > len(prompts[-1]) - 4
            prompts.append(ids)
            (tool_call,) = answer.choices[0].message.tool_calls
            assert answer.choices[0].finish_reason == "tool_calls"
            messages.append(answer.choices[0].message.model_dump(exclude_none=True))
            messages.append(
                {"role": "tool", "tool_call_id": tool_call.id, "content": f"sunny, {20 + turn} C"}
            )
        registry = proxy.app[GATEWAY].metrics.registry
        labels = {"endpoint": "chat", "outcome": "turns", "layout": "messages"}
        assert registry.get_sample_value("prism:extraction_total", labels) == 3
    with httpx.Client(base_url=control_url, timeout=10) as control:
        stats = control.get("/prism/stats", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    # the engine placed every call's anchors: the shared head and the turns so far
    assert stats["segments_resident"] >= 4 and stats["anchors_resident"] >= 5
    assert "another tokenization" not in sim.log_text()
