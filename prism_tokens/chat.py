"""Chat messages and tools as a chat template gets them.

`template_messages` and `template_tools` give the template what SGLang 0.5.23's OpenAI
endpoint gives it (its message models dumped, tool-call arguments parsed, None fields
dropped, text parts flattened for templates that take string content; tools as its
`Tool` model dumps them, filtered by `tool_choice`), so the proxy renders what the
engine renders (tests/sglang/test_conversation_contract.py holds this against SGLang's
own code).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jinja2
import jinja2.nodes
import orjson

ContentFormat = Literal["string", "openai"]

# SGLang's ChatCompletionMessageGenericParam fields, in its order (a user message has
# only role and content).
_MESSAGE_FIELDS = (
    "role", "content", "tool_call_id", "name", "phase", "reasoning_content", "tool_calls",
    "tools", "prefix",
)  # fmt: skip
_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")
_TEXT_PARTS = ("text", "input_text")


class NotRenderable(ValueError):
    """The request holds something the proxy does not render as the engine would."""


# --- what the template is given ---------------------------------------------------------
def _reads_content_parts(node: jinja2.nodes.Node) -> bool:
    """`message['content']`, `message.content` (or `msg`/`m`), through filters, tests and
    slices: SGLang's test for a template that loops over content parts."""
    while isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test) or (
        isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice)
    ):
        if node.node is None:
            return False
        node = node.node
    if isinstance(node, jinja2.nodes.Getitem):
        key = node.arg.value if isinstance(node.arg, jinja2.nodes.Const) else None
    elif isinstance(node, jinja2.nodes.Getattr):
        key = node.attr
    else:
        return False
    target = node.node
    return (
        key == "content"
        and isinstance(target, jinja2.nodes.Name)
        and target.ctx == "load"
        and target.name in ("message", "msg", "m")
    )


@functools.lru_cache(maxsize=8)  # one template per served model: parsed once
def content_format(template: str | None) -> ContentFormat:
    """Whether a chat template takes message content as a string or as OpenAI parts, as
    SGLang decides it (`detect_jinja_template_content_format`)."""
    if not template:
        return "string"
    if any(word in template for word in ("image", "audio", "video", "vision")):
        return "openai"
    try:
        tree = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateError:
        return "string"
    loops = tree.find_all(jinja2.nodes.For)
    return "openai" if any(_reads_content_parts(loop.iter) for loop in loops) else "string"


def _arguments(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise NotRenderable("tool call arguments are not JSON") from None
    if not isinstance(parsed, dict):
        raise NotRenderable("tool call arguments are not a JSON object")
    return parsed


def _tool_call(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("function"), Mapping):
        raise NotRenderable("a tool call without a function")
    function = raw["function"]
    arguments = _arguments(function.get("arguments"))
    return {
        "id": raw.get("id"),
        "index": raw.get("index"),
        "type": raw.get("type", "function"),
        "function": {"name": function.get("name"), "arguments": arguments},
    }


def template_tool(raw: Any) -> dict[str, Any]:
    """One tool as SGLang's `Tool.model_dump()` gives it to the template: the function's
    fields in the client's order, then the ones it left out (None), no None `strict` or
    `defer_loading`; the tool's own `defer_loading` last."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("function"), Mapping):
        raise NotRenderable("a tool without a function")
    given = raw["function"]
    function = {name: given.get(name) for name in _FUNCTION_FIELDS}
    if function["defer_loading"] is None:
        function["defer_loading"] = raw.get("defer_loading")
    for name in ("strict", "defer_loading"):
        if function[name] is None:
            del function[name]
    order = [key for key in given if key in function]
    order += [key for key in function if key not in order]
    return {
        "type": raw.get("type", "function"),
        "function": {key: function[key] for key in order},
        "defer_loading": raw.get("defer_loading"),
    }


def template_tools(tools: Sequence[Any] | None, tool_choice: Any) -> list[dict[str, Any]] | None:
    """The `tools` the template renders: none for `tool_choice` "none" (the default
    without tools), only the named one for a named choice."""
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [
            t
            for t in tools
            if isinstance(t, Mapping) and (t.get("function") or {}).get("name") == name
        ]
        return [template_tool(t) for t in chosen] or None
    return [template_tool(t) for t in tools]


def _content(content: Any, fmt: ContentFormat, role: str) -> Any:
    """Text as the template gets it: a string-content template gets the text parts
    joined by spaces (other parts dropped, as SGLang drops them); a parts template gets
    text parts (the proxy does not render others)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [p for p in content if isinstance(p, Mapping)]
    texts = [str(p.get("text", "")) for p in parts if p.get("type") in _TEXT_PARTS]
    if fmt == "string" or role == "tool":
        return " ".join(texts)
    if len(texts) != len(content):
        raise NotRenderable("content parts other than text")
    return [{"type": "text", "text": text} for text in texts]


def template_messages(
    messages: Sequence[Mapping[str, Any]], fmt: ContentFormat, *, final_assistant: bool = False
) -> list[dict[str, Any]]:
    """The messages the template renders. Raises `NotRenderable` for what the proxy
    cannot render as SGLang does: non-text parts for a parts template, and, unless
    `final_assistant`, a last message of the assistant's (a continuation)."""
    out: list[dict[str, Any]] = []
    for raw in messages:
        role = str(raw.get("role", "")).lower()
        if role == "user":
            message: dict[str, Any] = {"role": "user", "content": raw.get("content")}
        else:
            message = {name: raw.get(name) for name in _MESSAGE_FIELDS}
            message["role"] = role
            if message["tool_calls"] is not None and role == "assistant":
                message["tool_calls"] = [_tool_call(c) for c in message["tool_calls"]]
            if message["tools"] is not None:
                message["tools"] = [template_tool(t) for t in message["tools"]]
        parts = isinstance(message["content"], list)
        message["content"] = _content(message["content"], fmt, role)
        message = {key: value for key, value in message.items() if value is not None}
        if parts and fmt == "openai":  # SGLang rebuilds such a message, content last
            message["content"] = message.pop("content")
        out.append(message)
    if not final_assistant and (not out or out[-1]["role"] == "assistant"):
        raise NotRenderable("the last message is the assistant's (a continuation)")
    return out
