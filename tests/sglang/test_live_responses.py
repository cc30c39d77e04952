"""`/v1/responses` through the proxy to a real, unmodified SGLang 0.5.23 on this CPU
(the tiny random model), with the real `openai` client: a Responses call whole and
streamed, a tool-using exchange (a forced call, its output sent back), and hostile
Responses bodies answered 4xx while the engine keeps serving (docs/endpoints.md).

The engine is `live_support`'s `hostile` server (SGLang's `--api-key` set, as deployed),
so that a body the proxy let through by mistake fails on a server of its own; the
proxy gets the engine's key (`proxy_for`)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from live_support import LiveServer
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage

pytestmark = pytest.mark.sglang

CITIES = ["Paris", "Rome", "Oslo"]
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": CITIES}},
        "required": ["city"],
    },
}
INSTRUCTIONS = "You are a travel agent. Call tools when useful."


def engine_serves(server: LiveServer) -> None:
    """The engine's process is up and it answers a one-token generation directly."""
    assert server.server.process.poll() is None, server.server.log_text()[-3000:]
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1}}
    answer = httpx.post(server.url + "/generate", json=body, headers=server.headers, timeout=120.0)
    assert answer.status_code == 200, answer.text


@pytest.fixture
async def client(live, live_proxy_factory) -> Any:
    proxy = await live_proxy_factory(live["hostile"])
    async with openai.AsyncOpenAI(
        base_url=proxy.url + "/v1", api_key="unused", max_retries=0, timeout=120.0
    ) as client:
        yield client


def check_usage(response: Any, max_output_tokens: int) -> None:
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= max_output_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


async def test_a_response_whole_and_streamed(client: openai.AsyncOpenAI) -> None:
    """Greedy, so the stream's text is the whole answer's: the events come in order,
    their deltas add up to the final output, and the last event carries the Response."""
    ask = {
        "model": "m",
        "instructions": INSTRUCTIONS,
        "input": "Name a city in Italy.",
        "max_output_tokens": 12,
        "temperature": 0,
    }
    whole = await client.responses.create(**ask)
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.status in ("completed", "incomplete")
    if whole.status == "incomplete":
        assert whole.incomplete_details.reason == "max_output_tokens"
    (message,) = whole.output
    assert isinstance(message, ResponseOutputMessage) and message.role == "assistant"
    assert whole.output_text and message.content[0].text == whole.output_text
    assert whole.instructions == INSTRUCTIONS
    check_usage(whole, 12)

    stream = await client.responses.create(**ask, stream=True)
    events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == whole.output_text
    assert final.status == whole.status
    check_usage(final, 12)


async def test_a_tool_using_exchange(client: openai.AsyncOpenAI) -> None:
    """A call forced by `tool_choice`, streamed: SGLang's parser names the tool, then
    reports argument pieces (the random model never closes the JSON: the answer ends by
    length), and the proxy turns them into a `function_call` item's events. Sent back
    with its output, as the Agents SDK does, the call and its result make the next
    turn's input, and that turn is answered."""
    stream = await client.responses.create(
        model="m",
        instructions=INSTRUCTIONS,
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=32,
        temperature=0,
        stream=True,
    )
    events = [event async for event in stream]
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [item.type for item in added] == ["function_call"], added
    assert added[0].name == "get_weather"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == deltas
    assert events[-1].type == "response.incomplete"  # cut by max_output_tokens
    first = events[-1].response
    assert first.incomplete_details.reason == "max_output_tokens"
    (call,) = first.output
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "get_weather"
    assert call.arguments == deltas and call.call_id
    assert first.tools[0].name == "get_weather"

    turn = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": json.dumps({"city": "Paris"})},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ]  # fmt: skip
    second = await client.responses.create(
        model="m",
        instructions=INSTRUCTIONS,
        input=turn,
        tools=[WEATHER],
        max_output_tokens=16,
        temperature=0,
    )
    assert second.status in ("completed", "incomplete")
    assert second.usage.input_tokens > first.usage.input_tokens  # the call and its result
    check_usage(second, 16)
    for item in second.output:
        assert isinstance(item, ResponseOutputMessage | ResponseFunctionToolCall), item


HOSTILE = {
    "a web search tool": (
        {"input": "hi", "tools": [{"type": "web_search"}]},
        400,
        "tools.0.type",
    ),
    "an image part": (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        400,
        None,
    ),
    "5,000 input items (max_messages 4,096)": (
        {"input": [{"role": "user", "content": "a"}] * 5_000},
        413,
        "input",
    ),
    "a 6 MB input": ({"input": "word " * 1_200_000}, 413, None),
}


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_a_hostile_body_is_a_4xx_and_the_engine_serves_on(
    live, client: openai.AsyncOpenAI, case: str
) -> None:
    body, status, param = HOSTILE[case]
    with pytest.raises(openai.APIStatusError) as caught:
        await client.responses.create(model="m", max_output_tokens=4, **body)
    assert caught.value.status_code == status, caught.value.body
    error = caught.value.body
    assert isinstance(error, dict) and isinstance(error.get("message"), str)
    if param is not None:
        assert error["param"] == param, error
    engine_serves(live["hostile"])
    after = await client.responses.create(model="m", input="Hello.", max_output_tokens=4)
    assert after.status in ("completed", "incomplete") and after.usage.output_tokens > 0
