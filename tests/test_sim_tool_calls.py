"""Forced tool calls in the simulated engine, answered as SGLang 0.5.23 answers them
(`prism_sim.tool_calls`, docs/simulated-engine.md), through real HTTP on loopback."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from prism_sim.api_models import FunctionIn, ToolChoiceFunction, ToolChoiceIn, ToolIn
from prism_sim.engine import SimConfig, SimEngine
from prism_sim.server import create_app, start_site
from prism_sim.tool_calls import chosen_tool, forced_call, message_text, placeholder
from prism_tokens.tokenizer import load_tokenizer

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Find a bridge.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
            "required": ["city", "year"],
            "additionalProperties": False,
        },
    },
}
NOTE = {"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}}
MESSAGES = [{"role": "user", "content": "Which bridges are in Paris?"}]
CALL_TEXT = '[{"name": "lookup", "parameters": {"city": "", "year": 0}}]'
ARGUMENTS = '{"city": "", "year": 0}'
CALL_ID = re.compile(r"call_[0-9a-f]{24}")


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"type": "string"}, ""),
        ({"type": "integer"}, 0),
        ({"type": "number"}, 0),
        ({"type": "boolean"}, False),
        ({"type": "array", "items": {"type": "string"}}, []),
        ({"type": ["null", "string"]}, ""),
        ({"type": "null"}, None),
        ({"enum": ["north", "south"]}, "north"),
        ({"const": 3}, 3),
        ({"type": "string", "default": "Paris"}, "Paris"),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, 0),
        ({}, ""),
        # an object holds its required properties only
        ({"type": "object", "properties": {"a": {"type": "string"}}}, {}),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string"}, "b": {"type": "object"}},
                "required": ["b", "a"],
            },
            {"b": {}, "a": ""},
        ),
        # local references, as pydantic writes nested models (openai-agents' schemas)
        (
            {
                "type": "object",
                "properties": {"where": {"$ref": "#/$defs/Place"}},
                "required": ["where"],
                "$defs": {
                    "Place": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    }
                },
            },
            {"where": {"city": ""}},
        ),
        ({"$ref": "#/$defs/Missing"}, None),
    ],
)
def test_placeholder_values(schema: dict[str, Any], value: object) -> None:
    assert placeholder(schema) == value


@pytest.mark.parametrize("ref", ["#", "#/$defs/Node"])
def test_a_self_referencing_schema_ends(ref: str) -> None:
    node = {"type": "object", "properties": {"next": {"$ref": ref}}, "required": ["next"]}
    value = placeholder({**node, "$defs": {"Node": node}})
    depth = 0
    while isinstance(value, dict):
        value, depth = value["next"], depth + 1
    assert value is None and 2 <= depth <= 9


def tools_in(*tools: dict[str, Any]) -> list[ToolIn]:
    return [ToolIn.model_validate(t) for t in tools]


def named(name: str) -> ToolChoiceIn:
    return ToolChoiceIn(function=ToolChoiceFunction(name=name))


def test_which_call_a_request_forces() -> None:
    tools = tools_in(LOOKUP, NOTE)
    required = forced_call(tools, "required")
    assert required is not None
    assert (required.name, required.arguments, required.text) == ("lookup", ARGUMENTS, CALL_TEXT)
    assert required.text[: required.name_end] == '[{"name": "lookup"'
    note = forced_call(tools, named("note"))
    assert note is not None and (note.name, note.arguments) == ("note", "{}")
    for choice in ("auto", "none", None):
        assert forced_call(tools, choice) is None
    no_parameters = [ToolIn(function=FunctionIn(name="ping"))]
    ping = forced_call(no_parameters, "required")
    assert ping is not None and ping.text == '[{"name": "ping", "parameters": {}}]'


@pytest.mark.parametrize(
    ("context", "chosen"),
    [
        ("", 0),  # names no tool: the first
        ("Next: call note.", 1),
        ("note first, then lookup", 0),  # the name written last
        ("lookup, then note", 1),
        ("a notebook, footnote and note_2 are not note's name", 1),  # whole words only
        ("notebook", 0),
        ("get-note and note-x are other names", 0),
        ("lookup\nnote", 1),
    ],
)
def test_a_required_call_takes_the_tool_the_last_message_names(context: str, chosen: int) -> None:
    names = ["lookup", "note"]
    assert chosen_tool(names, context) == chosen
    call = forced_call(tools_in(LOOKUP, NOTE), "required", context)
    assert call is not None and call.name == names[chosen]
    # a named tool_choice is the client's, whatever the message says
    note = forced_call(tools_in(LOOKUP, NOTE), named("lookup"), context)
    assert note is not None and note.name == "lookup"


def test_a_message_text_is_its_string_or_its_text_parts() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    assert [message_text(c) for c in ("x", parts, None, 3)] == ["x", "a\nb", "", ""]


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        (None, "required", "Tools cannot be empty if tool choice is set to required."),
        ([], named("x"), "Tools cannot be empty if tool choice is set to a specific tool."),
        ([LOOKUP], named("x"), "Tool 'x' not found in tools list."),
    ],
)
def test_a_forced_choice_without_its_tool_is_refused(
    tools: list[dict[str, Any]] | None, choice: str | ToolChoiceIn, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        forced_call(None if tools is None else tools_in(*tools), choice)


@pytest.fixture
async def sim() -> AsyncIterator[tuple[str, SimEngine]]:
    config = SimConfig(speed=200.0)
    engine = SimEngine(config, tokenizer=load_tokenizer(None))
    runner = await start_site(create_app(config, engine), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}", engine
    await runner.cleanup()


async def test_a_required_call_answers_like_sglang(sim: tuple[str, SimEngine]) -> None:
    url, engine = sim
    script = [*engine.tokenizer.encode(CALL_TEXT), engine.tokenizer.eos_token_id]
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
        done = await client.chat.completions.create(
            model="m", messages=MESSAGES, tools=[LOOKUP], tool_choice="required"
        )  # type: ignore[arg-type]
        choice = done.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == ""
        (call,) = choice.message.tool_calls or []
        assert CALL_ID.fullmatch(call.id)
        assert (call.function.name, call.function.arguments) == ("lookup", ARGUMENTS)
        # one decode step per token of the call, then the stop token (SGLang counts it)
        assert done.usage is not None and done.usage.completion_tokens == len(script)

        # the next turn sends the call and its result back: the first prompt is cached
        history = [
            *MESSAGES,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "Pont Neuf"},
        ]
        answer = await client.chat.completions.create(
            model="m", messages=history, tools=[LOOKUP], max_tokens=3
        )  # type: ignore[arg-type]
    assert answer.choices[0].finish_reason == "length"
    assert answer.choices[0].message.tool_calls is None
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    assert answer.usage.prompt_tokens_details.cached_tokens >= done.usage.prompt_tokens


async def sse(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[Any]:
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        events = []
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def test_a_named_call_streams_like_sglang(sim: tuple[str, SimEngine]) -> None:
    """SGLang's stream of a forced call (`JsonArrayParser`): the role, the call's id and
    name with empty arguments, the arguments with null id and name, then a chunk with
    only the finish reason, the usage, [DONE]."""
    url, _ = sim
    body = {
        "model": "m",
        "messages": MESSAGES,
        "tools": [NOTE, LOOKUP],
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as session:
        events = await sse(session, url, body)
    role, name, arguments, finish, usage, done = events
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    calls = [
        name["choices"][0]["delta"]["tool_calls"],
        arguments["choices"][0]["delta"]["tool_calls"],
    ]
    ident = calls[0][0]["id"]
    assert CALL_ID.fullmatch(ident)
    first = {"id": ident, "index": 0, "type": "function"}
    then = {"id": None, "index": 0, "type": "function"}
    assert calls == [
        [{**first, "function": {"name": "lookup", "arguments": ""}}],
        [{**then, "function": {"name": None, "arguments": ARGUMENTS}}],
    ]
    for chunk in (name, arguments):
        delta = chunk["choices"][0]["delta"]
        assert (delta["role"], delta["content"], delta["reasoning_content"]) == (None, None, None)
        assert chunk["choices"][0]["finish_reason"] is None
    assert finish["choices"] == [
        {"index": 0, "delta": {"reasoning_content": None}, "logprobs": None,
         "finish_reason": "tool_calls", "matched_stop": None}
    ]  # fmt: skip
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    assert done == "[DONE]"
    ids = {e["id"] for e in events[:-1]}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")


async def test_the_openai_client_assembles_the_streamed_call(sim: tuple[str, SimEngine]) -> None:
    url, _ = sim
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, tools=[LOOKUP], tool_choice="required", stream=True
        )  # type: ignore[arg-type]
        name, arguments, reasons = "", "", []
        async for chunk in stream:
            for choice in chunk.choices:
                reasons.append(choice.finish_reason)
                for call in choice.delta.tool_calls or []:
                    if call.function is not None:
                        name += call.function.name or ""
                        arguments += call.function.arguments or ""
    assert (name, json.loads(arguments)) == ("lookup", {"city": "", "year": 0})
    assert [r for r in reasons if r] == ["tool_calls"]


async def test_a_required_call_over_http_calls_the_tool_the_chat_names_last(
    sim: tuple[str, SimEngine],
) -> None:
    url, _ = sim
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
        names = []
        for text in ("Where is it? Use note.", "Where is it?", [{"type": "text", "text": "note"}]):
            done = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": text}],
                tools=[LOOKUP, NOTE],
                tool_choice="required",
            )  # type: ignore[arg-type]
            (call,) = done.choices[0].message.tool_calls or []
            names.append(call.function.name)
    assert names == ["note", "lookup", "note"]


async def test_a_call_cut_short_by_max_tokens_is_text(sim: tuple[str, SimEngine]) -> None:
    """SGLang's parse of a truncated array fails: the text is the content, the finish
    reason stays "length"."""
    url, engine = sim
    body = {"model": "m", "messages": MESSAGES, "tools": [LOOKUP], "tool_choice": "required"}
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json={**body, "max_tokens": 3}) as r:
            answer = await r.json()
        events = await sse(session, url, {**body, "max_tokens": 3, "stream": True})
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "length" and choice["message"]["tool_calls"] is None
    assert choice["message"]["content"] == engine.decode(engine.tokenizer.encode(CALL_TEXT)[:3])
    assert events[-2]["choices"][0]["finish_reason"] == "length"


async def test_auto_keeps_filler_and_bad_choices_get_400(sim: tuple[str, SimEngine]) -> None:
    url, engine = sim
    async with aiohttp.ClientSession() as session:
        body = {"model": "m", "messages": MESSAGES, "tools": [LOOKUP], "max_tokens": 4}
        async with session.post(url + "/v1/chat/completions", json=body) as r:
            answer = await r.json()
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["choices"][0]["message"]["content"] == engine.decode(
            engine.scheduler.filler_ids[:4]
        )
        for choice in ("required", {"type": "function", "function": {"name": "x"}}, "always"):
            bad = {"model": "m", "messages": MESSAGES, "tool_choice": choice}
            async with session.post(url + "/v1/chat/completions", json=bad) as r:
                assert r.status == 400, choice
                assert (await r.json())["error"]["code"] == 400
