"""A Responses request as the proxy's own chat request (`to_chat`), and the Responses
field a chat field named in an error came from (`response_param`).
"""

from __future__ import annotations

from typing import Any

from prism_proxy.api.responses.request import (
    FunctionCallItem,
    FunctionOutputItem,
    MessageItem,
    NamedFunction,
    ResponsesRequest,
)


def _chat_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The chat messages of a Responses input: `instructions` first as the system
    message; consecutive function calls (and the assistant text before them) in one
    assistant message; each function output as a tool message."""
    messages: list[dict[str, Any]] = []
    if body.instructions is not None:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
        return messages
    for item in body.input:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.chat_content()})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if not last.get("content"):
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionOutputItem):
            message = {"role": "tool", "tool_call_id": item.call_id}
            messages.append({**message, "content": item.chat_content()})
        # reasoning items: dropped (`api.responses`)
    return messages


def to_chat(body: ResponsesRequest) -> dict[str, Any]:
    """The chat completion request a Responses request asks for (a raw body, checked
    as a chat by the caller). Streamed, the chat's last chunk carries its usage."""
    chat: dict[str, Any] = {"messages": _chat_messages(body), "stream": body.stream}
    if body.model:
        chat["model"] = body.model
    if body.stream:
        chat["stream_options"] = {"include_usage": True}
    if body.tools:
        chat["tools"] = [tool.to_chat() for tool in body.tools]
    choice = body.tool_choice
    if isinstance(choice, NamedFunction):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        chat["tool_choice"] = choice
    simple = {
        "parallel_tool_calls": body.parallel_tool_calls,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "user": body.user,
        "prompt_cache_key": body.prompt_cache_key,
    }
    chat.update((key, value) for key, value in simple.items() if value is not None)
    if body.text is not None and body.text.format is not None:
        response_format = body.text.format.to_chat()
        if response_format is not None:
            chat["response_format"] = response_format
    return chat


# Chat fields named in a 400 of the translated chat, and the Responses field they come from.
CHAT_PARAMS = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
}


def response_param(param: str | None) -> str | None:
    """The Responses field a chat field named in an error came from."""
    if param is None:
        return None
    head, dot, rest = param.partition(".")
    if head == "messages":  # its index counts chat messages, not input items
        return "input"
    return CHAT_PARAMS[head] + dot + rest if head in CHAT_PARAMS else param
