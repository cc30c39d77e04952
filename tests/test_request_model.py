"""Segmented request model (SPEC §1): validation names the field in one
line; limits are configurable; sampling parameters map onto SGLang's."""

from __future__ import annotations

from typing import Any

import pytest

from prism_proxy.api.segments import (
    RequestError,
    RequestLimits,
    SamplingParams,
    SegmentedPrompt,
    parse_prompt,
    parse_sampling,
)

SMALL = RequestLimits(max_segments=3, max_id_chars=8, max_piece_chars=20, max_total_chars=50)


def _seg(seg_id: Any, text: Any = "t") -> dict[str, Any]:
    return {"id": seg_id, "text": text}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"segments": [_seg("")]}, "segments[0].id: must not be empty"),
        ({"segments": [_seg("a"), _seg("  ")]}, "segments[1].id: must not be empty"),
        (
            {"segments": [_seg("a"), _seg("b"), _seg("a")]},
            "segments: duplicate segment id 'a' at segments[2] (first at segments[0])",
        ),
        # NUL starts DART's owners of system heads: no segment may take one
        ({"segments": [_seg("\x00sys:h")]}, "segments[0].id: must not start with a NUL"),
        ({"segments": [_seg(7)]}, "segments[0].id: Input should be a valid string"),
        ({"segments": [_seg("a", None)]}, "segments[0].text: Input should be a valid string"),
        ({"segments": [{"id": "a"}]}, "segments[0].text: Field required"),
        ({"segments": [_seg("a") | {"x": 1}]}, "segments[0].x: Extra inputs are not permitted"),
        ({"segments": "a"}, "segments: Input should be a valid list"),
        ({"system": 3}, "system: Input should be a valid string"),
        ({"reorder": "yes"}, "reorder: Input should be a valid boolean"),
        ({"suffix": ["q"]}, "suffix: Input should be a valid string"),
        ({"prompt": "x"}, "prompt: Extra inputs are not permitted"),
        ("not an object", "request: Input should be a valid dictionary or instance of"),
        # Limits (SMALL): 3 segments, ids of 8 characters, pieces of 20, 50 in total.
        (
            {"segments": [_seg(str(i)) for i in range(4)]},
            "segments: too many segments: 4 > limit 3",
        ),
        ({"segments": [_seg("x" * 9)]}, "segments[0].id: too long: 9 characters > limit 8"),
        (
            {"segments": [_seg("a", "x" * 21)]},
            "segments[0].text: too long: 21 characters > limit 20",
        ),
        ({"system": "s" * 21}, "system: too long: 21 characters > limit 20"),
        ({"suffix": "q" * 21}, "suffix: too long: 21 characters > limit 20"),
        (
            # 20 + 20 + 11 = 51 characters in total.
            {"system": "s" * 20, "segments": [_seg("a", "x" * 20)], "suffix": "q" * 11},
            "request: prompt too long: 51 characters in total > limit 50",
        ),
    ],
)
def test_validation_messages(body: Any, message: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_prompt(body, SMALL)
    text = str(info.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_several_errors_are_counted_on_one_line() -> None:
    with pytest.raises(RequestError) as info:
        parse_prompt({"system": 1, "suffix": 2, "reorder": "no"})
    assert str(info.value) == "system: Input should be a valid string (and 2 more errors)"


def test_valid_prompt_and_defaults() -> None:
    # Exactly at every SMALL limit: 3 segments, 8-character id, 20-character pieces,
    # 20 + 20 + 10 = 50 characters in total.
    body = {
        "system": "s" * 20,
        "segments": [_seg("abcdefgh", "x" * 20), _seg("b", ""), _seg("c", "")],
        "suffix": "q" * 10,
    }
    prompt = parse_prompt(body, SMALL)
    assert prompt.segment_ids == ["abcdefgh", "b", "c"]
    assert prompt.reorder is True
    bare = parse_prompt({})
    assert (bare.system, bare.segments, bare.suffix, bare.reorder) == (None, [], "", True)


def test_limits_come_from_the_validation_context() -> None:
    body = {"segments": [_seg(str(i)) for i in range(4)]}
    assert len(SegmentedPrompt.model_validate(body).segments) == 4  # default limits
    with pytest.raises(ValueError, match="too many segments"):
        SegmentedPrompt.model_validate(body, context={"limits": SMALL})
    with pytest.raises(ValueError, match="max_segments must be >= 1"):
        RequestLimits(max_segments=0)


def test_sampling_params_map_onto_sglang() -> None:
    params = parse_sampling(
        {"max_new_tokens": 32, "temperature": 0, "top_k": -1, "stop": ["\n"], "seed": 7}
    )
    assert params.to_sglang() == {
        "max_new_tokens": 32,
        "temperature": 0.0,
        "top_k": -1,
        "stop": ["\n"],
        "sampling_seed": 7,
    }
    assert parse_sampling(None).to_sglang() == {}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"temperature": -0.5}, "temperature: Input should be greater than or equal to 0"),
        ({"top_p": 0}, "top_p: Input should be greater than 0"),
        ({"top_k": 0}, "top_k: must be -1 (disabled) or >= 1"),
        ({"max_new_tokens": 1.5}, "max_new_tokens: Input should be a valid integer"),
        ({"max_new_tokens": True}, "max_new_tokens: Input should be a valid integer"),
        ({"stop": ["a", 1]}, "stop[1]: Input should be a valid string"),
        ({"n": 2}, "n: Input should be less than or equal to 1"),
        ({"max_tokens": 5}, "max_tokens: Extra inputs are not permitted"),
    ],
)
def test_sampling_validation_messages(body: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_sampling(body)
    assert str(info.value) == message


def test_sampling_params_from_openai_body() -> None:
    body = {
        "model": "m",
        "messages": [],
        "max_tokens": 16,
        "max_completion_tokens": 8,  # the newer name wins
        "min_tokens": 2,
        "temperature": 0.2,
        "seed": 3,
        "top_k": 5,
        "stream": True,
        "stop": None,
    }
    assert SamplingParams.from_openai(body).to_sglang() == {
        "max_new_tokens": 8,
        "min_new_tokens": 2,
        "temperature": 0.2,
        "sampling_seed": 3,
        "top_k": 5,
    }
