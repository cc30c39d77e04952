"""A chat answer as a Response object (`to_response`), and the parts of one the
streamed events share (`response_object`, the output items, usage, status).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prism_proxy.api.responses.request import (
    NamedFunction,
    ResponsesRequest,
)


@dataclass(frozen=True, slots=True)
class ResponseIds:
    """The ids and time one response is told by (the handler makes them)."""

    response_id: str
    created_at: int

    def item(self, kind: str, index: int) -> str:
        return f"{kind}_{self.response_id.removeprefix('resp_')}_{index}"


def response_usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(details.get("cached_tokens") or 0)},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(
    body: ResponsesRequest,
    ids: ResponseIds,
    *,
    output: list[dict[str, Any]],
    status: str,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """A Response object: the request's settings echoed, its output and usage."""
    text_format = body.text.format if body.text is not None else None
    choice = body.tool_choice
    tool_choice = choice.model_dump() if isinstance(choice, NamedFunction) else choice or "auto"
    return {
        "id": ids.response_id,
        "object": "response",
        "created_at": ids.created_at,
        "status": status,
        "error": None,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": body.model,
        "output": output,
        "parallel_tool_calls": (
            body.parallel_tool_calls if body.parallel_tool_calls is not None else True
        ),
        "previous_response_id": None,
        "store": False,
        "temperature": body.temperature,
        "text": {
            "format": (
                text_format.model_dump(by_alias=True, exclude_none=True)
                if text_format is not None
                else {"type": "text"}
            )
        },
        "tool_choice": tool_choice,
        "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or ()],
        "top_p": body.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": body.user,
        "metadata": body.metadata or {},
    }


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content if status == "completed" else [],
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def response_status(finish_reason: Any) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def to_response(body: ResponsesRequest, ids: ResponseIds, chat: dict[str, Any]) -> dict:
    """The Response object of a (non-streamed) chat completion answer: its text as a
    message item, each tool call as a `function_call` item."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, str) and content:
        output.append(message_item(ids.item("msg", 0), content, "completed"))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        index = len(output)
        output.append(
            call_item(
                ids.item("fc", index),
                str(call.get("id") or ids.item("call", index)),
                str(function.get("name") or ""),
                str(function.get("arguments") or ""),
                "completed",
            )
        )
    status = response_status(choice.get("finish_reason"))
    return response_object(
        body, ids, output=output, status=status, usage=response_usage(chat.get("usage"))
    )
