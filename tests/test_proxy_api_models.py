"""Which requests the token path serves and which go through unchanged."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.api.completions import CompletionRequest
from prism_proxy.api.error_body import describe_validation_error
from prism_proxy.api.generate import GenerateRequest

USER = [{"role": "user", "content": "hi"}]
HINT = {"segments": [{"id": "d1", "text": "doc"}]}


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({}, None),
        ({"n": 1, "logprobs": False, "response_format": {"type": "text"}}, None),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, "fields chat_template_kwargs"),
        ({"chat_template_kwargs": {}, "prism": HINT}, None),  # hints: token path
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "role tool"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:,x"}}],
                    }
                ]
            },
            "non-text content",
        ),
        ({"return_meta_info": True}, "fields return_meta_info"),
        ({"store": True, "metadata": {"k": "v"}}, None),  # unknown to SGLang: dropped
    ],
)
def test_chat_passthrough_reasons(extra: dict, reason: str | None) -> None:
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **extra})
    assert body.passthrough_reason() == reason


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({}, None),
        ({"prompt": ["one"]}, None),
        ({"prompt": ["one", "two"]}, "batch prompt"),
        ({"prompt": [1, 2, 3]}, None),
        ({"echo": True}, "echo"),
        ({"best_of": 3}, "n"),
        ({"logprobs": 0}, "logprobs"),
    ],
)
def test_completion_passthrough_reasons(extra: dict, reason: str | None) -> None:
    body = CompletionRequest.model_validate({"model": "m", "prompt": "p", **extra})
    assert body.passthrough_reason() == reason


def test_generate_batches_pass_through() -> None:
    assert GenerateRequest.model_validate({"text": ["a", "b"]}).passthrough_reason() == "batch"
    assert GenerateRequest.model_validate({"input_ids": [[1], [2]]}).passthrough_reason()
    assert GenerateRequest.model_validate({"text": "a"}).passthrough_reason() is None


def test_sampling_params_mapping() -> None:
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": USER, "max_completion_tokens": 7, "max_tokens": 3,
         "temperature": 0.5, "seed": 11, "min_tokens": 2, "stop": ["x"]}
    )  # fmt: skip
    assert body.sampling_params(body.max_new_tokens) == {
        "max_new_tokens": 7,
        "temperature": 0.5,
        "stop": ["x"],
        "min_new_tokens": 2,
        "sampling_seed": 11,
    }


def test_validation_error_names_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({"model": "m", "messages": [{"content": "x"}]})
    param, message = describe_validation_error(info.value)
    assert param == "messages.0.role" and message.startswith("messages.0.role: ")


@pytest.mark.parametrize(
    ("model", "body", "param"),
    [
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": 5}]},
            "messages.0.content",
        ),
        (ChatCompletionRequest, {"messages": USER, "stop": 5}, "stop"),
        (CompletionRequest, {"prompt": 5}, "prompt"),
    ],
)
def test_union_fields_are_named_without_pydantic_type_tags(model, body, param) -> None:
    """Pydantic puts the union member (`str`, `list[str]`) into an error's location;
    the client must see the field it sent, not `stop.str`."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    assert describe_validation_error(info.value)[0] == param
