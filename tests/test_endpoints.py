"""The endpoints of docs/endpoints.md through the real proxy in front of the simulated
engine (one for the module).

`/v1/responses`: the OpenAI Agents SDK with its default model class
(`OpenAIResponsesModel`), the `openai` client's own Responses calls, the fields the
proxy refuses, and the translation's pure parts. Tool calls come from the simulated
engine as SGLang answers a forced `tool_choice` (`prism_sim.tool_calls`).

`/v1/embeddings`, `/v1/tokenize`, `/v1/detokenize`: the `openai` client's embeddings
call, httpx for the others; the engine's own answer comes back, and bad input is
refused with a 400 naming the field before it reaches the engine.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    RunContextWrapper,
    RunHooks,
    Runner,
    Tool,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage
from proxy_support import SIM_ARGS, ProxyFactory, proxy_factory_fixture

from loadgen.stack.processes import ServerProcess, run_server
from prism_proxy.api.responses.answer import ResponseIds
from prism_proxy.api.responses.events import ResponseEvents
from prism_proxy.api.responses.request import ResponsesRequest
from prism_proxy.api.responses.to_chat import to_chat
from prism_proxy.edge.responses_api import ChatToResponses

# A chat answer that calls no tool ends with the stop token, as a model's answer does:
# a streamed Response then completes (`response.completed`), where an answer cut by
# `max_output_tokens` is `response.incomplete`, which the Agents SDK takes for a failure.
ANSWER = "The Pont Neuf opened in 1607."


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = [*SIM_ARGS, "--answer-text", ANSWER]
    with run_server("prism_sim", args, log_dir=tmp_path_factory.mktemp("sim")) as server:
        yield server


proxy_factory = pytest.fixture(proxy_factory_fixture)

STEPS = 4
MAX_ITEMS = 16  # the proxy's `max_messages` where input items are counted
LOOKUPS: list[str] = []
TEXT = {"type": "input_text", "text": "q"}


@function_tool
def look_up(bridge: str) -> str:
    """A fact about a bridge."""
    LOOKUPS.append(bridge)
    return f"fact {len(LOOKUPS)}: it opened in {1600 + len(LOOKUPS)}"


class LetItAnswer(RunHooks[Any]):
    """Forces a tool call until `STEPS` tools ran, then lets the model answer in text
    (`tool_choice` "auto": the simulated engine then writes its filler text)."""

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: str
    ) -> None:
        if len(LOOKUPS) >= STEPS:
            agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="auto")


def bridge_agent(client: AsyncOpenAI) -> Agent[Any]:
    return Agent(
        name="Bridges",
        instructions="You answer questions about bridges. Look facts up with the tool.",
        tools=[look_up],
        model=OpenAIResponsesModel(model="m", openai_client=client),
        model_settings=ModelSettings(tool_choice="required", max_tokens=48),
        reset_tool_choice=False,
    )


def check_run(responses: list[Any]) -> None:
    """Four model calls that each end in a `look_up` call, then one that answers."""
    assert len(responses) == STEPS + 1 and len(LOOKUPS) == STEPS, responses
    for response in responses[:STEPS]:
        (call,) = response.output
        assert isinstance(call, ResponseFunctionToolCall) and call.name == "look_up", call
        assert call.call_id and call.arguments.startswith("{"), call
    (message,) = responses[-1].output
    assert isinstance(message, ResponseOutputMessage) and message.content[0].text == ANSWER
    for earlier, later in itertools.pairwise(responses):
        # each call's prompt extends the one before, which the engine cached
        assert later.usage.input_tokens > earlier.usage.input_tokens > 0
        assert later.usage.input_tokens_details.cached_tokens >= earlier.usage.input_tokens


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_agents_sdk_default_model_four_tool_steps(
    proxy_factory: ProxyFactory, streamed: bool
) -> None:
    set_tracing_disabled(True)
    LOOKUPS.clear()
    proxy = await proxy_factory()
    async with AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:
        agent = bridge_agent(client)
        question = "When did the Pont Neuf open?"
        if streamed:
            run = Runner.run_streamed(agent, question, hooks=LetItAnswer(), max_turns=8)
            kinds = [event.type async for event in run.stream_events()]
            assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
            result: Any = run
        else:
            result = await Runner.run(agent, question, hooks=LetItAnswer(), max_turns=8)
    check_run([response for response in result.raw_responses])
    assert result.final_output == ANSWER


async def test_openai_client_text_answer_streamed_and_not(proxy_factory: ProxyFactory) -> None:
    """A plain text answer (the token path, filler cut by `max_output_tokens`), whole
    and streamed through the `openai` client: the events in order, their deltas making
    the text of the closing `response.incomplete`."""
    proxy = await proxy_factory()
    async with AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:
        whole = await client.responses.create(
            model="m", input="Name a bridge.", instructions="Be short.", max_output_tokens=8,
            metadata={"case": "whole"},
            extra_body={"service_tier": "auto", "not_a_field": 1},  # dropped, as chat's
        )  # fmt: skip
        assert whole.status == "incomplete", whole
        assert whole.incomplete_details.reason == "max_output_tokens"
        assert whole.output_text and whole.usage.output_tokens == 8, whole
        assert whole.metadata == {"case": "whole"}
        stream = await client.responses.create(
            model="m", input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
            max_output_tokens=6, stream=True,
        )  # fmt: skip
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added",
    ], kinds  # fmt: skip
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.incomplete",
    ], kinds  # fmt: skip
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    final = events[-1].response
    assert deltas and "".join(deltas) == final.output_text, (deltas, final)
    assert final.usage is not None and final.usage.output_tokens == 6


async def test_named_tool_choice_with_a_schema_format(proxy_factory: ProxyFactory) -> None:
    """A named `tool_choice` (the Responses shape) forces that call; `text.format` with
    a JSON schema rides along to the engine's chat endpoint."""
    proxy = await proxy_factory()
    tools: Any = [
        {"type": "function", "name": "other", "parameters": {"type": "object"}},
        {
            "type": "function", "name": "look_up",
            "parameters": {"type": "object", "properties": {"bridge": {"type": "string"}},
                           "required": ["bridge"]},
        },
    ]  # fmt: skip
    schema = {"type": "object", "properties": {"year": {"type": "integer"}}}
    async with AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:
        response = await client.responses.create(
            model="m", input="When did the Pont Neuf open?", tools=tools,
            tool_choice={"type": "function", "name": "look_up"}, max_output_tokens=64,
            text={"format": {"type": "json_schema", "name": "year", "schema": schema}},
        )  # fmt: skip
    (call,) = response.output
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "look_up", response
    assert json.loads(call.arguments) == {"bridge": ""} and response.status == "completed"
    assert response.text.format.type == "json_schema"


async def test_a_streamed_answer_is_held_within_max_answer_bytes(
    proxy_factory: ProxyFactory,
) -> None:
    """A streamed Response keeps its answer for `response.completed`: an answer that
    may outgrow `max_answer_bytes` is refused, streamed or not, before it is queued."""
    proxy = await proxy_factory(max_answer_bytes=4096)
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
        for stream, param in ((True, "max_output_tokens"), (False, "stream")):
            body = {"input": "hi", "max_output_tokens": 100_000, "stream": stream}
            answer = await client.post("/v1/responses", json=body)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["param"] == param, answer.text
        small = {"input": "hi", "max_output_tokens": 4, "stream": True}
        answer = await client.post("/v1/responses", json=small)
    assert answer.status_code == 200 and "response.completed" not in answer.text
    assert answer.text.rstrip().endswith("}") and "response.incomplete" in answer.text


def test_function_calls_and_outputs_become_chat_turns() -> None:
    body = ResponsesRequest.model_validate(
        {
            "instructions": "sys",
            "input": [
                {"role": "user", "content": [TEXT, {"type": "input_text", "text": "r"}]},
                {"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": "let me look", "annotations": []}]},
                {"type": "reasoning", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {"type": "function_call_output", "call_id": "c2",
                 "output": [{"type": "input_text", "text": "two"}]},
            ],
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        }
    )  # fmt: skip
    chat = to_chat(body)
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool"], chat
    assert [c["id"] for c in chat["messages"][2]["tool_calls"]] == ["c1", "c2"]
    assert chat["messages"][1]["content"] == [
        {"type": "text", "text": "q"}, {"type": "text", "text": "r"}
    ]  # fmt: skip
    assert chat["messages"][2]["content"] == "let me look"
    assert chat["messages"][4] == {"role": "tool", "tool_call_id": "c2", "content": "two"}
    assert chat["tools"][0]["function"]["name"] == "f"
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["response_format"]["json_schema"]["name"] == "x"


# (body, the field its 400 or 413 names)
REFUSED_RESPONSES: list[tuple[dict[str, Any], str]] = [
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input.0.content.0.type",
    ),
    ({"input": "hi", "max_output_tokens": -1}, "max_output_tokens"),
    ({"input": [{"role": "user", "content": "q"}] * (MAX_ITEMS + 1)}, "input"),
    ({"input": [{"role": "user", "content": [TEXT] * (MAX_ITEMS + 1)}]}, "input"),
    ({"input": []}, "input"),
    ({"input": "hi", "stop_regex": "a+"}, "stop_regex"),
]


async def test_refused_fields_are_named(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(max_messages=MAX_ITEMS)  # one proxy for every case
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30.0) as client:
        for body, param in REFUSED_RESPONSES:
            answer = await client.post("/v1/responses", json=body)
            assert answer.status_code in (400, 413), (param, answer.text)
            error = answer.json()["error"]
            assert error["param"] == param and error["message"].startswith(param), error


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


def _events(data: bytes) -> list[dict[str, Any]]:
    """The JSON of each event a rewritten stream holds (its `data:` lines)."""
    return [json.loads(line[6:]) for line in data.split(b"\n") if line.startswith(b"data: ")]


def _rewriter() -> ChatToResponses:
    body = ResponsesRequest.model_validate({"input": "q", "stream": True})
    return ChatToResponses(ResponseEvents(body, ResponseIds("resp_x", 0)))


def test_stream_of_interleaved_tool_calls_split_anywhere() -> None:
    """Two tool calls whose argument pieces interleave, the stream cut into 7-byte
    writes: both calls whole in the completed Response, in their order."""
    call = {"type": "function", "function": {"name": "f", "arguments": ""}}
    stream = b"".join(
        [
            _chunk({"role": "assistant", "content": ""}),
            _chunk({"tool_calls": [{"index": 0, "id": "a", **call}]}),
            _chunk({"tool_calls": [{"index": 1, "id": "b", **call}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]}),
            _chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"y":2}'}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            _chunk({}, "tool_calls"),
            b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n',
            b"data: [DONE]\n\n",
        ]
    )
    rewriter = _rewriter()
    data = b"".join(rewriter.rewrite(stream[i : i + 7]) for i in range(0, len(stream), 7))
    events = _events(data + rewriter.close())
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]
    assert final["type"] == "response.completed", final
    output = final["response"]["output"]
    assert [(o["call_id"], o["arguments"]) for o in output] == [("a", '{"x":1}'), ("b", '{"y":2}')]
    assert final["response"]["usage"]["total_tokens"] == 8


def test_a_failed_chat_stream_ends_in_an_error_event() -> None:
    rewriter = _rewriter()
    error = {"error": {"message": "backend stream broke", "type": "backend_error", "code": 502}}
    data = rewriter.rewrite(_chunk({"content": "Hel"}))
    data += rewriter.rewrite(b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n")
    events = _events(data + rewriter.close())
    assert events[-1]["type"] == "error" and events[-1]["code"] == "502", events[-1]
    assert not any(e["type"].startswith("response.completed") for e in events)


# --- /v1/embeddings, /v1/tokenize, /v1/detokenize ------------------------------------


async def test_embeddings_through_the_openai_client(
    proxy_factory: ProxyFactory, sim: ServerProcess
) -> None:
    proxy = await proxy_factory()
    async with AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:
        # the client asks for base64 and decodes it; float as SGLang sends it
        one = await client.embeddings.create(model="m", input="The Pont Neuf")
        again = await client.embeddings.create(
            model="m", input="The Pont Neuf", encoding_format="float"
        )
        batch = await client.embeddings.create(
            model="m", input=["The Pont Neuf", "The Millau Viaduct"], dimensions=8
        )
        ids = await client.embeddings.create(model="m", input=[[1, 2, 3], [4, 5]])
    vector = one.data[0].embedding
    assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-4)
    assert [round(x, 5) for x in vector] == [round(x, 5) for x in again.data[0].embedding]
    assert one.usage.prompt_tokens > 0
    assert [d.index for d in batch.data] == [0, 1]
    assert all(len(d.embedding) == 8 for d in batch.data)
    assert batch.data[0].embedding != batch.data[1].embedding
    assert len(ids.data) == 2 and ids.usage.prompt_tokens == 5
    # the engine names its model by its path (as SGLang does); the proxy by its name
    direct = httpx.post(sim.url + "/v1/embeddings", json={"input": "a"}, timeout=30.0).json()
    assert "/" in direct["model"] and one.model == direct["model"].rsplit("/", 1)[-1]


async def test_tokenize_and_detokenize_answer_as_the_engine(
    proxy_factory: ProxyFactory, sim: ServerProcess
) -> None:
    proxy = await proxy_factory()
    chat = {"messages": [{"role": "user", "content": "Which bridge is the oldest?"}]}
    async with httpx.AsyncClient(timeout=30.0) as client:
        for body in ({"prompt": "The Pont Neuf"}, {"prompt": ["a b", "c"]}, chat):
            through = await client.post(proxy.url + "/v1/tokenize", json=body)
            direct = await client.post(sim.url + "/v1/tokenize", json=body)
            assert through.status_code == 200 and through.json() == direct.json(), through.text
        tokens = (
            await client.post(
                proxy.url + "/v1/tokenize",
                json={"prompt": "The Pont Neuf", "add_special_tokens": False},
            )
        ).json()["tokens"]
        text = await client.post(proxy.url + "/v1/detokenize", json={"tokens": tokens})
    assert text.json() == {"text": "The Pont Neuf"}


# (path, body, the field its 400 names)
BAD_FORWARDED: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/embeddings", {"input": ""}, "input"),
    ("/v1/embeddings", {"input": ["a"] * 65}, "input"),
    ("/v1/embeddings", {"input": [[1, 2, 10**9]]}, "input.0.2"),
    ("/v1/embeddings", {"input": "a", "embed_overrides": [[[0.0]]]}, "embed_overrides"),
    ("/v1/embeddings", {"input": "a", "lora_path": "x"}, "lora_path"),
    ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ("/v1/embeddings", {"input": [{"text": "a", "image": "http://x"}]}, "input"),
    ("/v1/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "body"),
    ("/v1/tokenize", {"prompt": 5}, "prompt"),
    ("/v1/detokenize", {"tokens": [-1]}, "tokens.0"),
    ("/v1/detokenize", {"tokens": "abc"}, "tokens"),
]


async def test_bad_input_is_refused_naming_the_field(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory()  # one proxy for every case
    async with httpx.AsyncClient(timeout=30.0) as client:
        for path, body, param in BAD_FORWARDED:
            answer = await client.post(proxy.url + path, json=body)
            assert answer.status_code == 400, (path, param, answer.text)
            assert answer.json()["error"]["param"] == param, (path, answer.text)


async def test_inputs_count_against_max_prompt_chars(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(max_prompt_chars=100)
    async with httpx.AsyncClient(timeout=30.0) as client:
        for path, body in [
            ("/v1/embeddings", {"input": ["x" * 60, "y" * 60]}),
            ("/v1/tokenize", {"prompt": "x" * 101}),
            ("/v1/detokenize", {"tokens": [1] * 101}),
        ]:
            answer = await client.post(proxy.url + path, json=body)
            assert answer.status_code == 413, (path, answer.text)
