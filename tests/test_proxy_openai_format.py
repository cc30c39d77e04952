"""SGLang results/chunks → OpenAI objects and SSE (issue 4, data path)."""

from __future__ import annotations

import json

from prism_proxy.openai_format import (
    SSE_DONE,
    ChatFormat,
    CompletionFormat,
    DeltaText,
    TokenUsage,
    finish_reason,
)

META = {
    "prompt_tokens": 40,
    "completion_tokens": 3,
    "cached_tokens": 25,
    "finish_reason": {"type": "length", "length": 3},
}


def _events(pieces: list[bytes]) -> list[dict | str]:
    out: list[dict | str] = []
    for piece in pieces:
        assert piece.startswith(b"data: ") and piece.endswith(b"\n\n")
        data = piece[6:-2]
        out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


def test_cumulative_text_becomes_deltas() -> None:
    delta = DeltaText()
    assert [delta.feed(t) for t in ["He", "Hell", "Hello", "Hello"]] == ["He", "ll", "o", ""]


def test_incremental_text_is_passed_on() -> None:
    delta = DeltaText()
    assert [delta.feed(t) for t in ["ab", "cd"]] == ["ab", "cd"]
    assert delta.text == "abcd"


def test_finish_reason_mapping() -> None:
    assert finish_reason({}) is None
    assert finish_reason({"finish_reason": {"type": "length"}}) == "length"
    assert finish_reason({"finish_reason": {"type": "stop", "matched": 2}}) == "stop"


def test_usage_carries_cached_tokens() -> None:
    usage = TokenUsage.from_meta(META).to_openai()
    assert usage == {
        "prompt_tokens": 40,
        "completion_tokens": 3,
        "total_tokens": 43,
        "prompt_tokens_details": {"cached_tokens": 25},
    }
    assert TokenUsage.from_openai(usage) == TokenUsage(40, 3, 25)


def test_chat_stream_sequence_with_usage() -> None:
    fmt = ChatFormat(completion_id="chatcmpl-x", model="m", created=1, include_usage=True)
    pieces = fmt.start()
    for text in ["a", "ab", "abc"]:
        pieces += fmt.chunk({"text": text, "meta_info": {}})
    pieces += fmt.end(META)
    events = _events(pieces)
    assert events[-1] == "[DONE]" and pieces[-1] == SSE_DONE
    deltas = [e["choices"][0]["delta"] for e in events[:-2]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas) == "abc"
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["prompt_tokens"] == 40


def test_completion_objects() -> None:
    fmt = CompletionFormat(completion_id="cmpl-x", model="m", created=1, include_usage=False)
    whole = fmt.complete({"text": "xyz", "meta_info": META})
    assert whole["object"] == "text_completion"
    assert whole["choices"][0]["text"] == "xyz"
    assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] == 25
    events = _events(fmt.chunk({"text": "xy"}) + fmt.chunk({"text": "xyz"}) + fmt.end(META))
    assert [e["choices"][0]["text"] for e in events[:-1]] == ["xy", "z", ""]
    assert "usage" not in events[-2]


def test_chat_completion_object() -> None:
    fmt = ChatFormat(completion_id="chatcmpl-x", model="m", created=7, include_usage=False)
    assert fmt.complete({"text": "hi", "meta_info": META}) == {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": TokenUsage.from_meta(META).to_openai(),
    }
    assert fmt.complete({})["choices"][0]["finish_reason"] == "stop"  # no meta_info


def test_completion_stream_with_usage() -> None:
    fmt = CompletionFormat(completion_id="cmpl-x", model="m", created=1, include_usage=True)
    assert fmt.start() == []
    events = _events(fmt.chunk({"text": "ok"}) + fmt.end({**META, "finish_reason": None}))
    assert [e["object"] for e in events[:-1]] == ["text_completion"] * 3
    assert events[1]["choices"] == [
        {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}
    ]
    assert events[2]["choices"] == [] and events[2]["usage"]["completion_tokens"] == 3
