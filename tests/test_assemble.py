"""Whole answers from streams (`prism_proxy.edge.assemble`): the chunk sequences SGLang
0.5.23's OpenAI endpoints and `/generate` stream, assembled into the non-streamed
answer, within the byte bound. (`tests/sglang/test_live_assembly.py` holds the same
against a real SGLang's own non-streamed answers.)"""

from __future__ import annotations

import orjson
import pytest

from prism_proxy.edge.assemble import AnswerTooLarge, GenerateAnswer, OpenAIAnswer


def chat_chunk(index: int, delta: dict, *, finish=None, logprobs=None, usage=None) -> dict:
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "m",
             "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                          "finish_reason": finish, "matched_stop": None}]}  # fmt: skip
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def entry(token: str) -> dict:
    top = {"token": token, "bytes": list(token.encode()), "logprob": -0.5}
    return {**top, "top_logprobs": [top]}


USAGE = {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
         "prompt_tokens_details": {"cached_tokens": 2}}  # fmt: skip


def test_a_chat_stream_with_two_choices_logprobs_and_a_tool_call() -> None:
    answer = OpenAIAnswer("chat", 1 << 20)
    call_head = {"id": "call_1", "index": 0, "type": "function",
                 "function": {"name": "get", "arguments": ""}}  # fmt: skip
    for chunk in [
        chat_chunk(0, {"role": "assistant", "content": ""}),
        chat_chunk(1, {"role": "assistant", "content": ""}),
        chat_chunk(0, {"content": "Hel"}, logprobs={"content": [entry("Hel")]}),
        chat_chunk(1, {"tool_calls": [call_head]}),
        chat_chunk(0, {"content": "lo"}, logprobs={"content": [entry("lo")]}),
        chat_chunk(1, {"tool_calls": [{"index": 0, "function": {"arguments": '{"q": '}}]}),
        chat_chunk(1, {"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]}),
        chat_chunk(0, {}, finish="stop"),
        chat_chunk(1, {}, finish="tool_calls"),
        {"id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "m",
         "choices": [], "usage": USAGE},
    ]:  # fmt: skip
        answer.feed(chunk)
    whole = orjson.loads(answer.result())
    assert whole["object"] == "chat.completion" and whole["id"] == "c1"
    assert whole["usage"] == USAGE
    first, second = whole["choices"]
    assert first["message"] == {"role": "assistant", "content": "Hello", "reasoning_content": None}
    assert first["logprobs"] == {"content": [entry("Hel"), entry("lo")]}
    assert first["finish_reason"] == "stop"
    assert second["message"]["content"] == ""
    assert second["message"]["tool_calls"] == [
        {"id": "call_1", "index": 0, "type": "function",
         "function": {"name": "get", "arguments": '{"q": "x"}'}}
    ]  # fmt: skip
    assert second["logprobs"] is None and second["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("pieces", "kept"),
    [(['{"q": ', '"x"}'], True), (['{"q": ', '"x'], False), (['[{"name"'], False), ([""], False)],
)
def test_a_tool_call_cut_off_by_the_token_limit_is_left_out(pieces: list[str], kept: bool) -> None:
    """SGLang's non-streamed chat parses the whole text and leaves out a call the token
    limit cut off; its stream has already sent that call's start. Whole JSON is kept."""
    answer = OpenAIAnswer("chat", 1 << 20)
    head = {"id": "call_1", "index": 0, "type": "function",
            "function": {"name": "get", "arguments": ""}}  # fmt: skip
    answer.feed(chat_chunk(0, {"role": "assistant", "content": "", "tool_calls": [head]}))
    for piece in pieces:
        answer.feed(chat_chunk(0, {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
    answer.feed(chat_chunk(0, {}, finish="length"))
    message = orjson.loads(answer.result())["choices"][0]["message"]
    assert ("tool_calls" in message) is kept
    assert message["content"] == ""


def test_a_completion_stream_joins_its_logprob_lists() -> None:
    answer = OpenAIAnswer("completion", 1 << 20)
    for text, offset in (("ab", 0), ("cd", 2)):
        answer.feed({"id": "x", "created": 1, "model": "m", "choices": [{
            "index": 0, "text": text, "finish_reason": None,
            "logprobs": {"tokens": [text], "token_logprobs": [-1.0], "text_offset": [offset],
                         "top_logprobs": [{text: -1.0}]}}]})  # fmt: skip
    answer.feed({"id": "x", "created": 1, "model": "m", "choices": [
        {"index": 0, "text": "", "finish_reason": "length", "matched_stop": None}]})  # fmt: skip
    whole = orjson.loads(answer.result())
    choice = whole["choices"][0]
    assert whole["object"] == "text_completion"
    assert choice["text"] == "abcd" and choice["finish_reason"] == "length"
    assert choice["logprobs"] == {
        "tokens": ["ab", "cd"], "token_logprobs": [-1.0, -1.0], "text_offset": [0, 2],
        "top_logprobs": [{"ab": -1.0}, {"cd": -1.0}],
    }  # fmt: skip


def generate_chunk(text: str, ids: list[int], done: int, logprobs: list, index=None) -> dict:
    meta = {"id": "r", "completion_tokens": done, "prompt_tokens": 3, "cached_tokens": 1,
            "output_token_logprobs": logprobs,
            "finish_reason": {"type": "length"} if done == 3 else None}  # fmt: skip
    chunk = {"text": text, "output_ids": ids, "meta_info": meta}
    return chunk if index is None else {**chunk, "index": index}


@pytest.mark.parametrize("incremental", [True, False])
def test_generate_streams_of_a_batch_become_its_list_of_results(incremental: bool) -> None:
    answer = GenerateAnswer(batch=True, limit_bytes=1 << 20)
    lp = [[-0.1, 5, "a"], [-0.2, 6, "b"], [-0.3, 7, "c"]]
    for index in (0, 1):
        answer.feed(generate_chunk("a", [5], 1, lp[:1], index))
    for index in (1, 0):
        if incremental:  # the rest only, its logprobs sliced to it
            answer.feed(generate_chunk("bc", [6, 7], 3, lp[1:], index))
        else:  # everything so far
            answer.feed(generate_chunk("abc", [5, 6, 7], 3, lp, index))
    results = answer.result()
    assert [r["text"] for r in results] == ["abc", "abc"]
    assert all(r["output_ids"] == [5, 6, 7] for r in results)
    assert all(r["meta_info"]["output_token_logprobs"] == lp for r in results)
    assert "index" not in results[0]  # SGLang's non-streamed list carries none


def test_an_answer_over_the_bound_stops_as_it_grows() -> None:
    answer = OpenAIAnswer("chat", 1000)
    answer.feed(chat_chunk(0, {"role": "assistant", "content": "x" * 600}))
    with pytest.raises(AnswerTooLarge, match="stream: true"):
        answer.feed(chat_chunk(0, {"content": "y" * 600}))
    generated = GenerateAnswer(batch=False, limit_bytes=1000)
    with pytest.raises(AnswerTooLarge):
        generated.feed(generate_chunk("z" * 2000, [1], 1, []))


def test_logprob_entries_are_kept_as_bytes_not_objects() -> None:
    """Memory stays near the answer's size: entries are held as their JSON."""
    answer = OpenAIAnswer("chat", 1 << 24)
    for i in range(2000):
        answer.feed(chat_chunk(0, {"content": "t"}, logprobs={"content": [entry(f"t{i}")]}))
    held = answer.choices[0].logprobs
    assert isinstance(held, bytearray)
    assert len(held) < answer.size_bytes + 2000
    assert len(orjson.loads(answer.result())["choices"][0]["logprobs"]["content"]) == 2000
