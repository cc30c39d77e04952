"""SGLang results/chunks → OpenAI objects and SSE (data path)."""

from __future__ import annotations

import json

from prism_proxy.edge.openai_format import (
    SSE_DONE,
    ChatFormat,
    CompletionFormat,
    StreamAssembler,
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


def _chunk(text: str, ids: list[int], completion_tokens: int) -> dict:
    return {"text": text, "output_ids": ids, "meta_info": {"completion_tokens": completion_tokens}}


def test_cumulative_stream_becomes_deltas_and_one_result() -> None:
    assembled = StreamAssembler()
    chunks = [_chunk("He", [1], 1), _chunk("Hell", [1, 2], 2), _chunk("Hello", [1, 2, 3], 3)]
    assert [assembled.feed(c) for c in chunks] == ["He", "ll", "o"]
    assert assembled.result() == {
        "text": "Hello",
        "output_ids": [1, 2, 3],
        "meta_info": {"completion_tokens": 3},
    }


def test_incremental_stream_is_passed_on_and_accumulated() -> None:
    # SGLang's --incremental-streaming-output: each chunk holds only its new tokens, and
    # a delta may even start with the text so far ("a" then "ab").
    assembled = StreamAssembler()
    chunks = [_chunk("a", [7], 1), _chunk("ab", [7, 8], 3), _chunk("c", [9], 4)]
    assert [assembled.feed(c) for c in chunks] == ["a", "ab", "c"]
    assert assembled.text == "aabc" and assembled.output_ids == [7, 7, 8, 9]
    assert chunks[0]["output_ids"] == [7]  # the chunks themselves are left alone


def test_text_only_chunks_fall_back_to_prefix_matching() -> None:
    assembled = StreamAssembler()
    assert [assembled.feed({"text": t}) for t in ["He", "Hell", "Hello", "Hello"]] == [
        "He",
        "ll",
        "o",
        "",
    ]
    incremental = StreamAssembler()
    assert [incremental.feed({"text": t}) for t in ["ab", "cd"]] == ["ab", "cd"]
    assert incremental.text == "abcd"


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
