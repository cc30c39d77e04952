"""Whole answers from the engine's streams, within a byte bound.

The proxy streams every request from the engine, also for clients that did not ask to
stream: the first chunk is when a request stops pending prefill (SPEC §2), whatever its
path. A client that asked for one answer gets it assembled here, as the engine's own
non-streamed endpoint would have answered (SGLang 0.5.23's `ChatCompletionResponse`
and `CompletionResponse`, and `/generate`'s result or list of results):

    chat        choices[i].message: role, content, reasoning_content, tool_calls (the
                deltas of one call joined by its index; a call cut off by the token
                limit, its arguments not whole JSON, is dropped, as SGLang's
                non-streamed parser drops it), logprobs.content, finish_reason,
                matched_stop; usage from the closing usage chunk
    completion  choices[i]: text, logprobs (each list joined), finish_reason, matched_stop
    /generate   each prompt's text, output_ids and meta_info (`StreamAssembler`), the
                output logprob lists joined when the engine streams increments

What only a non-streamed answer carries (SGLang's `metadata.weight_version`) is left
out. The answer may not exceed `limit_bytes` (`max_answer_bytes`): counted as it grows
(text, arguments, logprob entries), so a client that asked for too much gets a clear
error, not a proxy that holds gigabytes. Logprob entries are kept as the JSON bytes they
will be written as, not as Python objects, so memory stays near the answer's size.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from prism_proxy.edge.openai_format import StreamAssembler, json_bytes


def _complete(arguments: str) -> bool:
    """Whether a tool call's arguments are whole JSON (a call the token limit cut off
    streams its start; SGLang's non-streamed answer leaves such a call out)."""
    try:
        orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return False
    return True


class AnswerTooLarge(Exception):
    """The assembled answer would exceed the deployment's `max_answer_bytes`."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(
            f"the answer exceeds this deployment's max_answer_bytes ({limit_bytes}); "
            "ask for it as a stream (stream: true), or for fewer tokens, choices or logprobs"
        )


# A marker where the joined logprob entries go when the answer is written.
_SLOT = "\x00prism-logprobs-{}\x00"


class _Choice:
    __slots__ = (
        "calls",
        "content",
        "finish_reason",
        "lists",
        "logprobs",
        "matched_stop",
        "reasoning",
        "role",
        "text",
    )  # fmt: skip

    def __init__(self) -> None:
        self.role: str | None = None
        self.content: list[str] = []  # chat: message content pieces
        self.reasoning: list[str] | None = None
        self.text: list[str] = []  # completion: text pieces
        self.calls: dict[int, dict[str, Any]] = {}  # tool calls by index
        self.logprobs: bytearray | None = None  # chat: `content` entries, comma separated
        self.lists: dict[str, list[Any]] | None = None  # completion: the logprob lists
        self.finish_reason: Any = None
        self.matched_stop: Any = None


class OpenAIAnswer:
    """Chunks of an OpenAI chat or completions stream, fed in order, to the answer a
    non-streaming request would have had (module docstring)."""

    def __init__(self, kind: Literal["chat", "completion"], limit_bytes: int) -> None:
        self.kind = kind
        self.limit_bytes = limit_bytes
        self.size_bytes = 0
        self.head: dict[str, Any] = {}
        self.usage: Any = None
        self.choices: dict[int, _Choice] = {}

    def _grow(self, size: int) -> None:
        self.size_bytes += size
        if self.size_bytes > self.limit_bytes:
            raise AnswerTooLarge(self.limit_bytes)

    def feed(self, chunk: dict[str, Any]) -> None:
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model")}
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        for item in chunk.get("choices") or ():
            if not isinstance(item, dict):
                continue
            index = item.get("index", 0)
            choice = self.choices.get(index)
            if choice is None:
                choice = self.choices[index] = _Choice()
            if self.kind == "chat":
                self._chat(choice, item)
            else:
                self._completion(choice, item)
            if item.get("finish_reason") is not None:
                choice.finish_reason = item["finish_reason"]
                choice.matched_stop = item.get("matched_stop")

    def _chat(self, choice: _Choice, item: dict[str, Any]) -> None:
        delta = item.get("delta") or {}
        if delta.get("role"):
            choice.role = delta["role"]
        if isinstance(content := delta.get("content"), str) and content:
            self._grow(len(content))
            choice.content.append(content)
        if isinstance(reasoning := delta.get("reasoning_content"), str):
            self._grow(len(reasoning))
            choice.reasoning = [*(choice.reasoning or ()), reasoning]
        for call in delta.get("tool_calls") or ():
            self._tool_call(choice, call)
        logprobs = item.get("logprobs")
        if isinstance(logprobs, dict):
            for entry in logprobs.get("content") or ():
                data = orjson.dumps(entry)
                self._grow(len(data) + 1)
                if choice.logprobs is None:
                    choice.logprobs = bytearray(data)
                else:
                    choice.logprobs += b"," + data

    def _tool_call(self, choice: _Choice, call: dict[str, Any]) -> None:
        index = call.get("index")
        index = index if isinstance(index, int) else len(choice.calls)
        function = call.get("function") or {}
        known = choice.calls.get(index)
        if known is None:
            known = choice.calls[index] = {
                "id": call.get("id"), "index": index, "type": call.get("type") or "function",
                "name": function.get("name"), "arguments": [],
            }  # fmt: skip
        elif call.get("id") and not known["id"]:
            known["id"] = call["id"]
        if function.get("name") and not known["name"]:
            known["name"] = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._grow(len(arguments))
            known["arguments"].append(arguments)

    def _completion(self, choice: _Choice, item: dict[str, Any]) -> None:
        if isinstance(text := item.get("text"), str) and text:
            self._grow(len(text))
            choice.text.append(text)
        logprobs = item.get("logprobs")
        if isinstance(logprobs, dict):
            lists = choice.lists
            if lists is None:
                lists = choice.lists = {}
            for key, values in logprobs.items():
                if isinstance(values, list):
                    self._grow(len(json_bytes(values)))
                    lists.setdefault(key, []).extend(values)

    def result(self) -> bytes:
        """The assembled answer, as JSON bytes."""
        slots: dict[str, bytes] = {}
        choices = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            if self.kind == "chat":
                message: dict[str, Any] = {
                    "role": choice.role or "assistant",
                    "content": "".join(choice.content),
                    "reasoning_content": (
                        "".join(choice.reasoning) if choice.reasoning is not None else None
                    ),
                }
                calls = [
                    {
                        "id": call["id"], "index": call["index"], "type": call["type"],
                        "function": {"name": call["name"],
                                     "arguments": "".join(call["arguments"])},
                    }
                    for _, call in sorted(choice.calls.items())
                ]  # fmt: skip
                if choice.finish_reason == "length":
                    calls = [call for call in calls if _complete(call["function"]["arguments"])]
                if calls:
                    message["tool_calls"] = calls
                logprobs: Any = None
                if choice.logprobs is not None:
                    slot = _SLOT.format(index)
                    slots[slot] = b"[" + bytes(choice.logprobs) + b"]"
                    logprobs = {"content": slot}
                entry = {"index": index, "message": message, "logprobs": logprobs}
            else:
                entry = {"index": index, "text": "".join(choice.text), "logprobs": choice.lists}
            entry["finish_reason"] = choice.finish_reason
            entry["matched_stop"] = choice.matched_stop
            choices.append(entry)
        answer = {
            **self.head,
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "choices": choices,
            "usage": self.usage,
        }
        data = json_bytes(answer)
        for slot, entries in slots.items():
            data = data.replace(json_bytes(slot), entries, 1)
        return data


class GenerateAnswer:
    """A `/generate` stream (one prompt, or a batch whose chunks carry `index`) to the
    result, or list of results, the non-streamed call answers."""

    def __init__(self, batch: bool, limit_bytes: int) -> None:
        self.batch = batch
        self.limit_bytes = limit_bytes
        self.parts: dict[int, StreamAssembler] = {}

    def feed(self, chunk: dict[str, Any]) -> None:
        index = chunk.get("index", 0)
        part = self.parts.get(index)
        if part is None:
            part = self.parts[index] = StreamAssembler()
        part.feed(chunk)
        if sum(p.size_bytes for p in self.parts.values()) > self.limit_bytes:
            raise AnswerTooLarge(self.limit_bytes)

    def result(self) -> Any:
        results = [self.parts[i].result() for i in sorted(self.parts)]
        if self.batch:
            return results
        return results[0] if results else {}
