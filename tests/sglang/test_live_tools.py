"""Tool-calling chats through the proxy get exactly SGLang's own answers, on a
real, unmodified SGLang 0.5.23 on this CPU (the tiny model: Qwen2.5's tool format, the
`qwen25` parser).

The proxy sends such a chat to SGLang's own endpoint, which renders it and parses the
calls; the proxy renders it too, to queue it by its turns and to give DART their
anchors. So: the same greedy requests, straight to SGLang and through the proxy,
streamed and not, give the same answers (choices, tool calls, finish reasons, usage;
ids and timestamps aside); the proxy's token ids equal the ones SGLang reports for the
same request; and SGLang's DART placed every anchor, none refused for not fitting.

The random-weight model never finishes a call here (its JSON never closes within the
tokens given), so SGLang's parser reports calls as they stream (name, then argument
pieces) and non-streamed answers end by length: the comparison covers what SGLang
produces, whatever it is.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from live_support import LiveServer
from proxy_support import eventually

from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.prompts.conversation import find_turns
from prism_tokens.chat import content_format, template_messages, template_tools
from prism_tokens.tokenizer import load_tokenizer
from sglang_cpu.model import ensure_tiny_model

pytestmark = pytest.mark.sglang

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
            "required": ["city"],
        },
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"flag": {"type": "boolean"}}},
    },
}
SYSTEM = {"role": "system", "content": "You are a travel agent. Call tools when useful."}


def _call(n: int, name: str, arguments: dict) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": f"call_{n}", "type": "function", "function": function}


PARIS = _call(1, "get_weather", {"city": "Paris"})
PARTS = [{"type": "text", "text": "Paris"}, {"type": "text", "text": "and Rome?"}]


CHATS = {
    "first": [SYSTEM, {"role": "user", "content": "Weather in Paris?"}],
    "no-system": [{"role": "user", "content": "Weather in Oslo, please."}],
    "after-call": [
        SYSTEM,
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [PARIS]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ],
    "two-calls": [
        SYSTEM,
        {"role": "user", "content": PARTS},
        {"role": "assistant", "content": "Checking both.",
         "tool_calls": [PARIS, _call(2, "lookup", {"flag": True})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "found"},
        {"role": "user", "content": "And Oslo?"},
    ],
}  # fmt: skip
CHOICES = {
    "auto": "auto",
    "required": "required",
    "named": {"type": "function", "function": {"name": "get_weather"}},
    "none": "none",
}
CASES = [(chat, choice) for chat in CHATS for choice in CHOICES]  # 16 requests, twice each


def _body(chat: str, choice: str, stream: bool, usage: bool = True) -> dict[str, Any]:
    body = {
        "model": "m",
        "messages": CHATS[chat],
        "tools": [WEATHER, LOOKUP],
        "tool_choice": CHOICES[choice],
        "temperature": 0,
        "max_tokens": 32,
        "stream": stream,
    }
    if stream and usage:
        body["stream_options"] = {"include_usage": True}
    return body


def _answer(response: httpx.Response) -> dict[str, Any]:
    """The answer without what differs between two runs of one request: ids, times,
    the tool calls' random ids, cached-token counts."""
    assert response.status_code == 200, response.text
    body = response.json()
    choices = body["choices"]
    for choice in choices:
        for call in choice["message"].get("tool_calls") or ():
            call.pop("id")
    usage = {k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    return {"model": body["model"], "choices": choices, "usage": usage}


def _streamed(lines: list[str]) -> dict[str, Any]:
    """A stream folded into one answer: content, tool calls merged by index (names and
    argument pieces as the parser reported them, in order), finish reasons, usage, the
    roles named. (How the text is cut into chunks depends on the engine's timing.)"""
    assert lines and lines[-1] == "data: [DONE]"
    content, calls, finish, usage, roles = "", {}, [], None, set()
    for line in lines[:-1]:
        chunk = json.loads(line.removeprefix("data: "))
        if chunk.get("usage"):
            usage = {k: chunk["usage"][k] for k in ("prompt_tokens", "completion_tokens")}
        for choice in chunk["choices"]:
            delta = choice["delta"]
            roles.add(delta.get("role") or "")
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                merged = calls.setdefault(call["index"], {"names": [], "arguments": ""})
                if call["function"].get("name"):
                    merged["names"].append(call["function"]["name"])
                merged["arguments"] += call["function"].get("arguments") or ""
            if choice.get("finish_reason"):
                finish.append(choice["finish_reason"])
    return {"content": content, "calls": calls, "finish": finish, "usage": usage, "roles": roles}


def _same_arguments_so_far(relayed: dict[str, Any], direct: dict[str, Any]) -> None:
    """Streamed calls that end by length: SGLang's parser reports argument pieces as the
    partial JSON it has seen allows, so how much of an unfinished call was reported
    depends on how the tokens were cut into chunks (the engine's timing), run to run on
    SGLang alone too. The pieces must agree as far as both went; then both are set to
    the shorter, for the comparison of everything else."""
    assert relayed["calls"].keys() == direct["calls"].keys()
    for index, theirs in direct["calls"].items():
        ours = relayed["calls"][index]
        short, long = sorted((ours["arguments"], theirs["arguments"]), key=len)
        assert long.startswith(short), (ours, theirs)
        ours["arguments"] = theirs["arguments"] = short


async def _ask(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    if not body["stream"]:
        return _answer(await http.post(url + "/v1/chat/completions", json=body))
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    return _streamed(lines)


@pytest.fixture
async def proxy(live: dict[str, LiveServer], live_proxy_factory):
    live["ample"].fresh()
    return await live_proxy_factory(live["ample"])


async def test_tool_calling_chats_get_sglangs_own_answers(proxy, live) -> None:
    server = live["ample"]
    answers = 0
    streamed_calls = 0
    prompt_tokens: dict[tuple[str, str], int] = {}  # SGLang's count, from the whole answers
    async with httpx.AsyncClient(timeout=120.0) as http:
        # streamed without usage, a chat per choice: the proxy asks SGLang for the
        # usage (its client's tokens, the pacing's cache) and relays the rest
        without_usage = [(chat, choice, False) for chat, choice in zip(CHATS, CHOICES, strict=True)]
        for stream in (False, True):
            for chat, choice, usage in [(*case, True) for case in CASES] + without_usage:
                if not (stream or usage):
                    continue
                body = _body(chat, choice, stream, usage)
                direct = await _ask(http, server.url, body)
                relayed = await _ask(http, proxy.url, body)
                if stream:
                    _same_arguments_so_far(relayed, direct)
                assert relayed == direct, (chat, choice, stream, usage)
                if stream:
                    assert (relayed["usage"] is not None) == usage
                else:
                    prompt_tokens[chat, choice] = direct["usage"]["prompt_tokens"]
                answers += 1
                if stream:
                    streamed_calls += bool(direct["calls"])
    assert answers >= 20
    # the parser did report calls (a forced choice makes the model start one)
    assert streamed_calls >= len(CHATS)
    # each went by its turns, the one chat with neither a system turn nor rendered tools
    # too: the agent session features (on by default) end a piece at its last message
    registry = proxy.app[GATEWAY].metrics.registry
    labels = {"endpoint": "chat", "outcome": "turns", "layout": "messages"}
    assert registry.get_sample_value("prism:extraction_total", labels) == answers
    labels = {"endpoint": "chat", "outcome": "forwarded", "layout": ""}
    assert registry.get_sample_value("prism:extraction_total", labels) is None
    admission = proxy.app[GATEWAY].admission
    await eventually(lambda: admission.inflight == 0)  # counted at each answer's end
    # every answer's prompt tokens counted, those streamed without usage too
    counted = sum(
        sample.value
        for family in registry.collect()
        if family.name == "prism:prompt_tokens"
        for sample in family.samples
        if sample.name.endswith("_total")
    )
    assert counted == 2 * sum(prompt_tokens.values()) + sum(
        prompt_tokens[chat, choice] for chat, choice, _ in without_usage
    )


async def test_the_proxy_renders_the_ids_sglang_renders_and_dart_places_the_anchors(
    proxy, live
) -> None:
    server = live["ample"]
    tokenizer = load_tokenizer(str(ensure_tiny_model()))
    fmt = content_format(tokenizer.chat_template)
    async with httpx.AsyncClient(timeout=120.0) as http:
        for chat, choice in CASES:
            body = {**_body(chat, choice, False), "return_input_ids_in_sglext": True}
            response = await http.post(server.url + "/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            theirs = response.json()["sglext"]["input_ids"]
            given = template_messages(CHATS[chat], fmt)
            ours = find_turns(tokenizer, given, template_tools(body["tools"], CHOICES[choice]))
            assert ours.ids == theirs, (chat, choice)
            assert bool(ours.cuts) == (chat != "no-system" or choice != "none")
        server.fresh()
        before = server.stats()["anchors_resident"]
        for chat, choice in CASES:
            response = await http.post(
                proxy.url + "/v1/chat/completions", json=_body(chat, choice, False)
            )
            assert response.status_code == 200
    stats = server.stats()
    assert stats["anchors_resident"] > before and stats["segments_resident"] > 0
    assert "another tokenization" not in server.server.log_text()
