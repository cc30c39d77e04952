"""SGLang `/generate` results → OpenAI objects and SSE chunks (SPEC §4).

Pure functions: the handlers pass ids, model names and timestamps in. `usage` carries
`prompt_tokens_details.cached_tokens` from `meta_info.cached_tokens`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    """One server-sent event carrying `obj` as JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def finish_reason(meta_info: dict[str, Any]) -> str | None:
    """OpenAI finish reason from SGLang's `meta_info.finish_reason` (None: not finished)."""
    reason = meta_info.get("finish_reason")
    if reason is None:
        return None
    kind = reason.get("type") if isinstance(reason, dict) else str(reason)
    return "length" if kind == "length" else "stop"


@dataclass(frozen=True, slots=True)
class TokenUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @classmethod
    def from_meta(cls, meta_info: dict[str, Any]) -> TokenUsage:
        return cls(
            int(meta_info.get("prompt_tokens") or 0),
            int(meta_info.get("completion_tokens") or 0),
            int(meta_info.get("cached_tokens") or 0),
        )

    @classmethod
    def from_openai(cls, usage: dict[str, Any] | None) -> TokenUsage | None:
        if not isinstance(usage, dict):
            return None
        details = usage.get("prompt_tokens_details") or {}
        return cls(
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            int(details.get("cached_tokens") or 0),
        )

    def to_openai(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


class DeltaText:
    """Turns SGLang's cumulative stream text into deltas.

    A chunk whose text does not extend the text so far is taken as incremental
    (`--incremental-streaming-output`) and passed on whole.
    """

    def __init__(self) -> None:
        self.text = ""

    def feed(self, text: str) -> str:
        if text.startswith(self.text):
            delta = text[len(self.text) :]
            self.text = text
        else:
            delta = text
            self.text += text
        return delta


def chat_completion(
    *, completion_id: str, model: str, created: int, text: str, meta_info: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason(meta_info) or "stop",
            }
        ],
        "usage": TokenUsage.from_meta(meta_info).to_openai(),
    }


def text_completion(
    *, completion_id: str, model: str, created: int, text: str, meta_info: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason(meta_info) or "stop",
            }
        ],
        "usage": TokenUsage.from_meta(meta_info).to_openai(),
    }


def chat_chunk(
    *,
    completion_id: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    include_choice: bool = True,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": (
            [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
            if include_choice
            else []
        ),
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def completion_chunk(
    *,
    completion_id: str,
    model: str,
    created: int,
    text: str,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    include_choice: bool = True,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": (
            [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
            if include_choice
            else []
        ),
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def stream_error(message: str, status: int) -> dict[str, Any]:
    """The error event sent when a stream fails after its headers went out."""
    return {"error": {"message": message, "type": "backend_error", "param": None, "code": status}}


class ResponseFormat:
    """How one endpoint renders `/generate` results: whole, or as SSE pieces.

    `chunk` gets each backend chunk as it arrives and returns the bytes to relay now;
    `end` gets the last `meta_info` and returns the closing events.
    """

    def __init__(self, *, completion_id: str, model: str, created: int, include_usage: bool):
        self.completion_id = completion_id
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self.delta = DeltaText()

    def complete(self, result: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def start(self) -> list[bytes]:
        return []

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        raise NotImplementedError

    def end(self, meta_info: dict[str, Any]) -> list[bytes]:
        return [SSE_DONE]

    def _ids(self) -> dict[str, Any]:
        return {"completion_id": self.completion_id, "model": self.model, "created": self.created}


class ChatFormat(ResponseFormat):
    def complete(self, result: dict[str, Any]) -> dict[str, Any]:
        return chat_completion(
            **self._ids(), text=str(result.get("text", "")), meta_info=result.get("meta_info", {})
        )

    def start(self) -> list[bytes]:
        return [sse(chat_chunk(**self._ids(), delta={"role": "assistant", "content": ""}))]

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        delta = self.delta.feed(str(chunk.get("text", "")))
        return [sse(chat_chunk(**self._ids(), delta={"content": delta}))] if delta else []

    def end(self, meta_info: dict[str, Any]) -> list[bytes]:
        events = [
            sse(chat_chunk(**self._ids(), delta={}, finish=finish_reason(meta_info) or "stop"))
        ]
        if self.include_usage:
            usage = TokenUsage.from_meta(meta_info).to_openai()
            events.append(
                sse(chat_chunk(**self._ids(), delta={}, usage=usage, include_choice=False))
            )
        return [*events, SSE_DONE]


class CompletionFormat(ResponseFormat):
    def complete(self, result: dict[str, Any]) -> dict[str, Any]:
        return text_completion(
            **self._ids(), text=str(result.get("text", "")), meta_info=result.get("meta_info", {})
        )

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        delta = self.delta.feed(str(chunk.get("text", "")))
        return [sse(completion_chunk(**self._ids(), text=delta))] if delta else []

    def end(self, meta_info: dict[str, Any]) -> list[bytes]:
        finish = finish_reason(meta_info) or "stop"
        events = [sse(completion_chunk(**self._ids(), text="", finish=finish))]
        if self.include_usage:
            usage = TokenUsage.from_meta(meta_info).to_openai()
            events.append(
                sse(completion_chunk(**self._ids(), text="", usage=usage, include_choice=False))
            )
        return [*events, SSE_DONE]


class GenerateFormat(ResponseFormat):
    """SGLang-native: results and chunks relayed as the backend sent them, except that
    `meta_info.id` names the client's request (its `rid`, or the proxy's), not the
    backend rid the proxy chose."""

    def _named(self, result: dict[str, Any]) -> dict[str, Any]:
        meta_info = result.get("meta_info")
        if isinstance(meta_info, dict):
            result = {**result, "meta_info": {**meta_info, "id": self.completion_id}}
        return result

    def complete(self, result: dict[str, Any]) -> dict[str, Any]:
        return self._named(result)

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        return [sse(self._named(chunk))]
