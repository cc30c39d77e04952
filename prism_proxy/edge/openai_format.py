"""SGLang `/generate` results → OpenAI objects and SSE chunks (SPEC §4).

Pure functions: the handlers pass ids, model names and timestamps in (but
`answer_format`, which stamps a new answer's time of creation). `usage` carries
`prompt_tokens_details.cached_tokens` from `meta_info.cached_tokens`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

SSE_DONE = b"data: [DONE]\n\n"


def json_bytes(obj: Any) -> bytes:
    """Compact JSON; orjson, or the standard library for what orjson refuses (a lone
    surrogate in a string, an integer beyond 64 bits)."""
    try:
        return orjson.dumps(obj)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(obj, separators=(",", ":")).encode()


def sse(obj: Any) -> bytes:
    """One server-sent event carrying `obj` as JSON."""
    return b"data: " + json_bytes(obj) + b"\n\n"


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
    # whether the engine reported cached tokens (SGLang's OpenAI usage holds them only
    # with `--enable-cache-report`); when not, `cached_tokens` is 0 and says nothing
    cached_known: bool = True

    @classmethod
    def from_meta(cls, meta_info: dict[str, Any]) -> TokenUsage:
        return cls(
            int(meta_info.get("prompt_tokens") or 0),
            int(meta_info.get("completion_tokens") or 0),
            int(meta_info.get("cached_tokens") or 0),
        )

    @classmethod
    def from_metas(cls, metas: Iterable[dict[str, Any]]) -> TokenUsage | None:
        """The sum over several answers' `meta_info` (a batch, or `n`); None for none."""
        usages = [cls.from_meta(meta) for meta in metas]
        if not usages:
            return None
        return cls(
            sum(u.prompt_tokens for u in usages),
            sum(u.completion_tokens for u in usages),
            sum(u.cached_tokens for u in usages),
        )

    @classmethod
    def from_openai(cls, usage: dict[str, Any] | None) -> TokenUsage | None:
        if not isinstance(usage, dict):
            return None
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        return cls(
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            int(details.get("cached_tokens") or 0),
            details.get("cached_tokens") is not None,
        )

    def told(self, visible_tokens: int | None) -> TokenUsage:
        """What the client is told: cached tokens at most its visible prefix
        (`prompts.sharing`; None: no bound)."""
        if visible_tokens is None or self.cached_tokens <= visible_tokens:
            return self
        return TokenUsage(
            self.prompt_tokens, self.completion_tokens, visible_tokens, self.cached_known
        )

    def to_openai(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


# `meta_info` lists SGLang slices to each chunk's own tokens when it streams increments
# (`tokenizer_manager._INCREMENTAL_STREAMING_META_INFO_KEYS`): joined here.
INCREMENTAL_META_KEYS = (
    "output_token_logprobs",
    "output_top_logprobs",
    "output_token_ids_logprobs",
)
# What one logprob entry costs in the answer, for `StreamAssembler.size_bytes`.
LOGPROB_ENTRY_BYTES = 32
TOKEN_ID_BYTES = 7


class StreamAssembler:
    """Follows one `/generate` stream and keeps the whole answer so far.

    SGLang streams cumulative `text`/`output_ids` by default and deltas with
    `--incremental-streaming-output`. A chunk is cumulative exactly when its
    `output_ids` hold all `meta_info.completion_tokens` tokens (an incremental chunk
    after the first holds fewer); without those fields, text that extends the text so
    far is taken as cumulative. Incremental chunks also slice the output logprob lists
    of `meta_info`, which are joined. `feed` returns the new text; `result()` is what a
    non-streaming `/generate` would have answered; `size_bytes` estimates its size.
    """

    def __init__(self) -> None:
        self.text = ""
        self.output_ids: list[Any] = []
        self.meta_info: dict[str, Any] = {}
        self._owned = False  # output_ids is our own list (not a chunk's)
        self._logprob_entries = 0

    def _cumulative(self, ids: Any, text: str, meta_info: dict[str, Any]) -> bool:
        completion_tokens = meta_info.get("completion_tokens")
        if isinstance(ids, list) and isinstance(completion_tokens, int):
            return len(ids) == completion_tokens
        return text.startswith(self.text)

    def feed(self, chunk: dict[str, Any]) -> str:
        text = str(chunk.get("text") or "")
        ids = chunk.get("output_ids")
        meta_info = chunk.get("meta_info")
        meta_info = meta_info if isinstance(meta_info, dict) else self.meta_info
        if self._cumulative(ids, text, meta_info):
            self.meta_info = meta_info
            self._count_logprobs()
            delta = text[len(self.text) :] if text.startswith(self.text) else text
            self.text = text
            if isinstance(ids, list):
                self.output_ids, self._owned = ids, False
            return delta
        self._join_meta(meta_info)
        self.text += text
        if isinstance(ids, list):
            if not self._owned:
                self.output_ids, self._owned = list(self.output_ids), True
            self.output_ids.extend(ids)
        return text

    def _join_meta(self, meta_info: dict[str, Any]) -> None:
        joined = dict(meta_info)
        for key in INCREMENTAL_META_KEYS:
            before, now = self.meta_info.get(key), meta_info.get(key)
            if isinstance(before, list) and isinstance(now, list):
                joined[key] = before + now
        self.meta_info = joined
        self._count_logprobs()

    def _count_logprobs(self) -> None:
        entries = 0
        for key in (*INCREMENTAL_META_KEYS, "input_token_logprobs", "input_top_logprobs"):
            values = self.meta_info.get(key)
            if isinstance(values, list):
                entries += len(values)
                if values and isinstance(values[-1], list) and key.endswith("top_logprobs"):
                    entries += len(values) * len(values[-1])
        self._logprob_entries = entries

    @property
    def size_bytes(self) -> int:
        """About what the answer takes as JSON: its text, ids and logprob entries."""
        return (
            len(self.text)
            + TOKEN_ID_BYTES * len(self.output_ids)
            + LOGPROB_ENTRY_BYTES * self._logprob_entries
        )

    def result(self) -> dict[str, Any]:
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": self.meta_info}


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
        self.assembled = StreamAssembler()
        self._frame: tuple[bytes, bytes] | None = None
        # the longest prefix the client may be told is cached (None: no bound)
        self.visible_tokens: int | None = None

    def complete(self, result: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def whole(self) -> dict[str, Any]:
        """The response to a non-streaming client, from the chunks `assembled` saw."""
        return self.complete(self.assembled.result())

    def start(self) -> list[bytes]:
        return []

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        raise NotImplementedError

    def end(self, meta_info: dict[str, Any]) -> list[bytes]:
        return [SSE_DONE]


class _OpenAIFormat(ResponseFormat):
    """Chat and completions: the same objects and events, apart from their `object`
    names and how a choice carries its text (`_whole` for the answer, `_piece` for a
    stream chunk; `None` is the closing chunk's empty piece)."""

    whole_object = ""
    chunk_object = ""

    def _whole(self, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def _piece(self, text: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def _response(
        self, kind: str, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        response: dict[str, Any] = {
            "id": self.completion_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            response["usage"] = usage
        return response

    def _event(self, piece: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, **piece, "logprobs": None, "finish_reason": finish}
        return sse(self._response(self.chunk_object, [choice]))

    def _text_event(self, text: str) -> bytes:
        """`_event(_piece(text))` for a non-empty delta, from bytes built once per
        stream: only the text is encoded per chunk (the hot path of a stream)."""
        frame = self._frame
        if frame is None:
            marker = "\x00prism-delta\x00"
            whole = sse(
                self._response(
                    self.chunk_object,
                    [{"index": 0, **self._piece(marker), "logprobs": None, "finish_reason": None}],
                )
            )
            head, _, tail = whole.partition(json_bytes(marker))
            frame = self._frame = (head, tail)
        return frame[0] + json_bytes(text) + frame[1]

    def complete(self, result: dict[str, Any]) -> dict[str, Any]:
        meta_info = result.get("meta_info", {})
        choice = {
            "index": 0,
            **self._whole(str(result.get("text", ""))),
            "logprobs": None,
            "finish_reason": finish_reason(meta_info) or "stop",
        }
        usage = TokenUsage.from_meta(meta_info).told(self.visible_tokens).to_openai()
        return self._response(self.whole_object, [choice], usage)

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        delta = self.assembled.feed(chunk)
        return [self._text_event(delta)] if delta else []

    def end(self, meta_info: dict[str, Any]) -> list[bytes]:
        events = [self._event(self._piece(None), finish_reason(meta_info) or "stop")]
        if self.include_usage:
            usage = TokenUsage.from_meta(meta_info).told(self.visible_tokens).to_openai()
            events.append(sse(self._response(self.chunk_object, [], usage)))
        return [*events, SSE_DONE]


class ChatFormat(_OpenAIFormat):
    whole_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def _whole(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}}

    def _piece(self, text: str | None) -> dict[str, Any]:
        return {"delta": {} if text is None else {"content": text}}

    def start(self) -> list[bytes]:
        return [self._event({"delta": {"role": "assistant", "content": ""}})]


class CompletionFormat(_OpenAIFormat):
    whole_object = "text_completion"
    chunk_object = "text_completion"

    def _whole(self, text: str) -> dict[str, Any]:
        return {"text": text}

    def _piece(self, text: str | None) -> dict[str, Any]:
        return {"text": text or ""}


class GenerateFormat(ResponseFormat):
    """SGLang-native: results and chunks relayed as the backend sent them, except that
    `meta_info.id` names the client's request (its `rid`, or the proxy's), not the
    backend rid the proxy chose."""

    def _named(self, result: dict[str, Any]) -> dict[str, Any]:
        meta_info = result.get("meta_info")
        if isinstance(meta_info, dict):
            meta_info = {**meta_info, "id": self.completion_id}
            cached, visible = meta_info.get("cached_tokens"), self.visible_tokens
            if isinstance(cached, int) and visible is not None and cached > visible:
                meta_info["cached_tokens"] = visible
                meta_info.pop("cached_tokens_details", None)  # its parts add up to more
            result = {**result, "meta_info": meta_info}
        return result

    def complete(self, result: dict[str, Any]) -> dict[str, Any]:
        return self._named(result)

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        self.assembled.feed(chunk)  # what was generated, for `prompts.sharing`
        return [sse(self._named(chunk))]


def answer_format(cls: type[ResponseFormat], rid: str, prefix: str, model: str, usage: bool):
    """A new answer format of `cls` for one request (its id `prefix-rid`, created now)."""
    return cls(
        completion_id=f"{prefix}-{rid}" if prefix else rid, model=model, created=int(time.time()),
        include_usage=usage,
    )  # fmt: skip
