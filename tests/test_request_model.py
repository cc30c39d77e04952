"""Segmented request model (SPEC §1) and native sampling parameters: validation names
the field in one line, at the proxy's bounds; sampling parameters are SGLang's."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from prism_proxy.api.generate import NativeSamplingParams
from prism_proxy.api.segments import (
    MAX_ID_CHARS,
    MAX_PIECE_CHARS,
    MAX_SEGMENTS,
    MAX_TOTAL_CHARS,
    SegmentedPrompt,
    format_validation_error,
)


def _seg(seg_id: Any, text: Any = "t") -> dict[str, Any]:
    return {"id": seg_id, "text": text}


def refusal(model: type, body: Any) -> str:
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    return format_validation_error(info.value)


PIECE = MAX_PIECE_CHARS


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
        # the bounds, one past each
        (
            {"segments": [_seg(str(i)) for i in range(MAX_SEGMENTS + 1)]},
            f"segments: too many segments: {MAX_SEGMENTS + 1} > limit {MAX_SEGMENTS}",
        ),
        (
            {"segments": [_seg("x" * (MAX_ID_CHARS + 1))]},
            f"segments[0].id: too long: {MAX_ID_CHARS + 1} characters > limit {MAX_ID_CHARS}",
        ),
        (
            {"segments": [_seg("a", "x" * (PIECE + 1))]},
            f"segments[0].text: too long: {PIECE + 1} characters > limit {PIECE}",
        ),
        ({"system": "s" * (PIECE + 1)}, f"system: too long: {PIECE + 1} characters"),
        ({"suffix": "q" * (PIECE + 1)}, f"suffix: too long: {PIECE + 1} characters"),
        (
            {"segments": [_seg(str(i), "x" * PIECE) for i in range(4)], "suffix": "q" * 1},
            f"request: prompt too long: {4 * PIECE + 1} characters in total > limit "
            f"{MAX_TOTAL_CHARS}",
        ),
    ],
)
def test_validation_messages(body: Any, message: str) -> None:
    text = refusal(SegmentedPrompt, body)
    assert text.startswith(message), text
    assert "\n" not in text


def test_several_errors_are_counted_on_one_line() -> None:
    text = refusal(SegmentedPrompt, {"system": 1, "suffix": 2, "reorder": "no"})
    assert text == "system: Input should be a valid string (and 2 more errors)"


def test_valid_prompt_and_defaults() -> None:
    # exactly at every bound: segments, id length, piece length, total length
    rest = MAX_TOTAL_CHARS - 3 * PIECE
    empty = [_seg(str(i), "") for i in range(MAX_SEGMENTS - 2)]
    segments = [_seg("x" * MAX_ID_CHARS, "x" * PIECE), _seg("b", "x" * rest), *empty]
    body = {"system": "s" * PIECE, "segments": segments, "suffix": "q" * PIECE}
    prompt = SegmentedPrompt.model_validate(body)
    assert len(prompt.segment_ids) == MAX_SEGMENTS and prompt.reorder is True
    bare = SegmentedPrompt.model_validate({})
    assert (bare.system, bare.segments, bare.suffix, bare.reorder) == (None, [], "", True)


def test_sampling_params_map_onto_sglang() -> None:
    body = {"max_new_tokens": 32, "temperature": 0, "top_k": -1, "stop": ["\n"], "sampling_seed": 7}
    assert NativeSamplingParams.model_validate(body).to_sglang() == {
        "max_new_tokens": 32,
        "temperature": 0,
        "top_k": -1,
        "stop": ["\n"],
        "sampling_seed": 7,
    }
    assert NativeSamplingParams().to_sglang() == {}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"temperature": -0.5}, "temperature: Input should be greater than or equal to 0"),
        ({"top_p": 0}, "top_p: Input should be greater than 0"),
        ({"top_k": 0}, "top_k: must be -1 (disabled) or >= 1"),
        ({"max_new_tokens": 1.5}, "max_new_tokens: Input should be a valid integer"),
        ({"max_new_tokens": True}, "max_new_tokens: Input should be a valid integer"),
        ({"stop": ["a", 1]}, "stop[1]: Input should be a valid string"),
        ({"max_tokens": 5}, "max_tokens: Extra inputs are not permitted"),
    ],
)
def test_sampling_validation_messages(body: dict[str, Any], message: str) -> None:
    assert refusal(NativeSamplingParams, body) == message
