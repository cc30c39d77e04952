"""Forced tool calls, emulated as SGLang 0.5.23 answers them.

SGLang started with a tool-call parser answers a chat request whose `tool_choice` is
"required" or names a function by constraining decoding to a JSON array of calls,
`[{"name": ..., "parameters": {...}}]` (a JSON schema built from `tools`), then parsing
that array into `tool_calls` with `finish_reason` "tool_calls"
(`OpenAIServingChat._process_tool_calls`; `JsonArrayParser` when streamed).

The simulated engine generates filler text, which would never parse. For such a request
it scripts what the constrained model generates instead: one call of the named tool,
whose arguments fill the required properties of the tool's parameters with placeholder
values (`placeholder`), then the stop token. Under "required" the model picks the tool,
and a model reads its context for that: the simulated one calls the offered tool that
the last message names last (`chosen_tool`: a tool's name written as a word, as in a
tool's output "next: call get_order"), else the first one. The request is otherwise
served like any other (the same prefill, one decode step per token), so timing and
caching stay modeled. `tool_choice` "auto" or "none" keeps filler text: a model that
chose not to call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from prism_sim.api_models import ToolChoiceIn, ToolIn

# A value of each JSON Schema type, as a constrained model might write it first.
_PLACEHOLDERS: dict[str, Any] = {
    "string": "",
    "integer": 0,
    "number": 0,
    "boolean": False,
    "array": [],
    "null": None,
}
_MAX_SCHEMA_DEPTH = 8  # nested objects and `$ref`s followed; deeper values are null


@dataclass(frozen=True, slots=True)
class ForcedCall:
    """The one tool call a request forces, and the text the engine generates for it."""

    name: str
    arguments: str  # as SGLang reports them: json.dumps of the generated parameters
    text: str  # the constrained model's output: a JSON array holding the call
    name_end: int  # characters of `text` through the name (streamed once generated)


def message_text(content: Any) -> str:
    """A message's text: its string content, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"] for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )  # fmt: skip
    return ""


def chosen_tool(names: list[str], context: str) -> int:
    """The index in `names` of the tool `context` names last (a name written as a whole
    word: not inside a longer identifier), 0 when it names none."""
    best, best_end = 0, -1
    for index, name in enumerate(names):
        if not name:
            continue
        for match in re.finditer(rf"(?<![\w-]){re.escape(name)}(?![\w-])", context):
            if match.end() > best_end:
                best, best_end = index, match.end()
    return best


def forced_call(
    tools: list[ToolIn] | None, tool_choice: str | ToolChoiceIn | None, context: str = ""
) -> ForcedCall | None:
    """The call that `tool_choice` forces, or None when it forces none ("auto", "none",
    absent); under "required", the tool `context` (the last message's text) names last.
    ValueError, with SGLang's message, for a forced choice without the tool."""
    if tool_choice == "required":
        if not tools:
            raise ValueError("Tools cannot be empty if tool choice is set to required.")
        function = tools[chosen_tool([t.function.name for t in tools], context)].function
    elif isinstance(tool_choice, ToolChoiceIn):
        if not tools:
            raise ValueError("Tools cannot be empty if tool choice is set to a specific tool.")
        name = tool_choice.function.name
        function = next((t.function for t in tools if t.function.name == name), None)
        if function is None:
            raise ValueError(f"Tool '{name}' not found in tools list.")
    else:
        return None
    parameters = placeholder(function.parameters or {"type": "object"})
    if not isinstance(parameters, dict):
        parameters = {}
    name_json = json.dumps(function.name, ensure_ascii=False)
    text = json.dumps([{"name": function.name, "parameters": parameters}], ensure_ascii=False)
    return ForcedCall(
        name=function.name,
        arguments=json.dumps(parameters, ensure_ascii=False),
        text=text,
        name_end=len('[{"name": ') + len(name_json),
    )


def placeholder(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """A value of the JSON Schema `schema`: its `const`, first `enum` value, `default`,
    first alternative (`anyOf`/`oneOf`/`allOf`), else a value of its type; an object
    holds its required properties only. Local `$ref`s ("#", "#/$defs/X") resolve in `root`."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > _MAX_SCHEMA_DEPTH:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        target: Any = root
        for part in ref[2:].split("/") if ref != "#" else ():
            target = target.get(part) if isinstance(target, dict) else None
        return placeholder(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return placeholder(options[0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
        return {name: placeholder(properties.get(name), root, depth + 1) for name in names}
    return _PLACEHOLDERS.get(kind, "") if isinstance(kind, str) else ""


def call_id() -> str:
    """A tool call's id as SGLang makes it for every parser but Kimi's."""
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_json(
    call: ForcedCall, ident: str | None, *, name: bool = True, arguments: bool = True
) -> dict[str, Any]:
    """SGLang's `ToolCall` as JSON: whole (an answer), or one streamed delta (the id and
    name with empty arguments first, then the arguments with null id and name)."""
    function = {
        "name": call.name if name else None,
        "arguments": call.arguments if arguments else "",
    }
    return {"id": ident, "index": 0, "type": "function", "function": function}
