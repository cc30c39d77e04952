"""How one trace request is sent to each kind of target, and how its stream is read.

* ``prism``  — OpenAI chat (``/v1/chat/completions``) with the segments in the body's
  ``prism`` object (what the ``openai`` client sends via ``extra_body``); the messages
  carry the same text concatenated, so the prompt means the same to any server.
* ``openai`` — plain OpenAI chat: system message, then the segments and the suffix
  concatenated into the user message.
* ``sglang`` — SGLang's native ``/generate`` with the whole prompt as ``text``.

All three stream. ``StreamEvent`` is what a parsed ``data:`` line tells the replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadgen.trace_format import TraceRequest

API_NAMES = ("prism", "openai", "sglang")


@dataclass(frozen=True)
class StreamEvent:
    """One parsed stream chunk: whether it carried output text, and any token counts."""

    has_content: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None


def build_request(api: str, request: TraceRequest, model: str) -> tuple[str, dict[str, Any]]:
    """The path and JSON body for ``request`` on a target speaking ``api``."""
    if api == "sglang":
        return "/generate", {
            "rid": request.rid,
            "text": request.plain_prompt(),
            "sampling_params": {"max_new_tokens": request.max_tokens, "temperature": 0.0},
            "stream": True,
        }
    messages = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    messages.append({"role": "user", "content": request.joined_user_text()})
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "prism":
        body["prism"] = {
            "system": request.system,
            "segments": [{"id": s.id, "text": s.text} for s in request.segments],
            "suffix": request.suffix,
            "reorder": request.reorder,
        }
    elif api != "openai":
        raise ValueError(f"unknown api {api!r}; expected one of {', '.join(API_NAMES)}")
    return "/v1/chat/completions", body


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def parse_event(api: str, chunk: dict[str, Any]) -> StreamEvent:
    """Read one decoded ``data:`` object of a stream."""
    if "error" in chunk:
        error = chunk["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return StreamEvent(error=str(message))
    if api == "sglang":
        meta = chunk.get("meta_info") or {}
        return StreamEvent(
            has_content=bool(chunk.get("text")),
            prompt_tokens=_int_or_none(meta.get("prompt_tokens")),
            completion_tokens=_int_or_none(meta.get("completion_tokens")),
            cached_tokens=_int_or_none(meta.get("cached_tokens")),
        )
    has_content = any(
        bool((choice.get("delta") or {}).get("content")) or bool(choice.get("text"))
        for choice in chunk.get("choices") or []
    )
    usage = chunk.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    cached = _int_or_none(details.get("cached_tokens"))
    meta = chunk.get("meta_info") or {}
    if cached is None:
        cached = _int_or_none(meta.get("cached_tokens"))
    return StreamEvent(
        has_content=has_content,
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
        cached_tokens=cached,
    )
