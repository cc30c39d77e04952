"""The proxy gives a chat template what SGLang 0.5.23's OpenAI endpoint gives it
(`prism_proxy.prompts.conversation`): checked against SGLang's own request model and the
functions its `OpenAIServingChat._process_messages` / `_apply_jinja_template` apply, in
their order, for chats with tools, tool calls, tool results and content parts."""

from __future__ import annotations

import copy
import json

import pytest

from prism_tokens.builtin import CHATML_TEMPLATE
from prism_tokens.chat import content_format, template_messages, template_tools

pytestmark = pytest.mark.sglang

WEATHER = {
    "type": "function",
    "function": {
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "name": "get_weather",
        "description": "The weather of a city.",
    },
}
LOOKUP = {"type": "function", "function": {"name": "lookup", "strict": True}, "defer_loading": True}
PLAIN = {"type": "function", "function": {"name": "plain"}}


def call(n: int, name: str, arguments: dict) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": f"call_{n}", "type": "function", "function": function}


CHATS = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "Be brief.", "name": "ops"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None,
         "tool_calls": [call(1, "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
        {"role": "assistant", "content": "Also Rome?", "reasoning_content": "think",
         "tool_calls": [call(2, "get_weather", {"city": "Rome"}), call(3, "lookup", {})]},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain", "name": "get_weather"},
        {"role": "tool", "tool_call_id": "call_3", "content": ""},
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "And now?"},
    ],
]  # fmt: skip
CHOICES = [None, "auto", "none", "required", {"type": "function", "function": {"name": "lookup"}}]
TEMPLATES = [
    CHATML_TEMPLATE,
    "{% for m in messages %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endfor %}",
]


def sglang_inputs(body: dict, template: str) -> tuple[list[dict], list[dict] | None]:
    """What SGLang's endpoint hands its template for `body`: the steps of
    `_process_messages` and `_apply_jinja_template` for a plain jinja template."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import (
        normalize_assistant_tool_call_arguments,
        normalize_tool_content,
    )
    from sglang.srt.parser.jinja_template_utils import (
        detect_jinja_template_content_format,
        process_content_for_template_format,
    )

    request = ChatCompletionRequest.model_validate(copy.deepcopy(body))
    tools = None
    if request.tools and request.tool_choice != "none":
        if not isinstance(request.tool_choice, str):
            name = request.tool_choice.function.name
            tools = [t.model_dump() for t in request.tools if t.function.name == name] or None
        else:
            tools = [t.model_dump() for t in request.tools]
    fmt = detect_jinja_template_content_format(template)
    messages = [m.model_dump() for m in request.messages]
    for message in messages:
        normalize_assistant_tool_call_arguments(message, strict=True)
    given = []
    for message in copy.deepcopy(messages):
        if message.get("content") is None:
            message["content"] = ""
        processed = process_content_for_template_format(message, fmt, [], [], [], [])
        processed["content"] = normalize_tool_content(processed["role"], processed.get("content"))
        given.append(processed)
    return given, tools


@pytest.mark.parametrize("template", TEMPLATES, ids=["chatml", "parts"])
@pytest.mark.parametrize("choice", CHOICES, ids=str)
@pytest.mark.parametrize("chat", CHATS, ids=["one", "agent"])
def test_the_template_gets_what_sglang_gives_it(chat, choice, template) -> None:
    body = {"model": "m", "messages": chat, "tools": [WEATHER, LOOKUP, PLAIN]}
    if choice is not None:
        body["tool_choice"] = choice
    expected_messages, expected_tools = sglang_inputs(body, template)
    fmt = content_format(template)
    assert template_messages(chat, fmt) == expected_messages
    assert template_tools(body["tools"], choice) == expected_tools
    # key order too: templates render dicts in their order
    assert json.dumps(template_tools(body["tools"], choice)) == json.dumps(expected_tools)
    assert json.dumps(template_messages(chat, fmt)) == json.dumps(expected_messages)
