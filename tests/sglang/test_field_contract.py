"""The proxy's field lists against SGLang 0.5.23's own request classes: every
field SGLang reads from a client body is served (declared and checked in the body
models of `prism_proxy.api`), owned by the proxy, or refused with a reason
(`prism_proxy.api.sglang_fields`); and every field the proxy forwards is one SGLang knows.
A new SGLang release that adds a field fails here until the field is classified."""

from __future__ import annotations

import dataclasses

import pytest
from sglang.srt.entrypoints.openai import protocol
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams

from prism_proxy.api import forwarded as api_forwarded
from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.api.completions import CompletionRequest
from prism_proxy.api.generate import GenerateRequest, NativeSamplingParams
from prism_proxy.api.messages import ChatMessage
from prism_proxy.api.sglang_fields import MESSAGE_FIELDS, PROXY_OWNED, REFUSED

pytestmark = pytest.mark.sglang

# SGLang reads it before validation (`normalize_reasoning_inputs`), not as a field.
READ_RAW = {"reasoning"}
# SamplingParams' internal fields, filled by SGLang itself (`normalize`), never a client's.
SAMPLING_INTERNAL = {
    "stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len",
    "is_normalized", "ebnf_full_assistant",
}  # fmt: skip

CASES = [
    (set(protocol.ChatCompletionRequest.model_fields), ChatCompletionRequest),
    (set(protocol.CompletionRequest.model_fields), CompletionRequest),
    ({f.name for f in dataclasses.fields(GenerateReqInput)}, GenerateRequest),
    (
        set(SamplingParams.__struct_fields__) - SAMPLING_INTERNAL,
        NativeSamplingParams,
    ),
    (set(protocol.EmbeddingRequest.model_fields), api_forwarded.EmbeddingRequest),
    (set(protocol.TokenizeRequest.model_fields), api_forwarded.TokenizeRequest),
    (set(protocol.DetokenizeRequest.model_fields), api_forwarded.DetokenizeRequest),
]


NAMES = ["chat", "completions", "generate", "sampling_params", "embeddings", "tokenize",
         "detokenize"]  # fmt: skip


@pytest.mark.parametrize(("sglang", "ours"), CASES, ids=NAMES)
def test_every_sglang_field_is_served_owned_or_refused(sglang: set[str], ours: type) -> None:
    served = set(ours.model_fields)
    unclassified = sglang - served - PROXY_OWNED - set(REFUSED)
    assert not unclassified, f"{ours.__name__}: SGLang fields not classified: {unclassified}"


@pytest.mark.parametrize(("sglang", "ours"), CASES, ids=NAMES)
def test_every_forwarded_field_is_one_sglang_knows(sglang: set[str], ours: type) -> None:
    forwarded = set(ours.model_fields) - PROXY_OWNED
    unknown = forwarded - sglang - READ_RAW
    assert not unknown, f"{ours.__name__}: forwarded but unknown to SGLang: {unknown}"
    assert not forwarded & set(REFUSED), "a field is both served and refused"


def test_forwarded_message_fields_are_sglangs() -> None:
    """Chat messages forward exactly the fields SGLang's message models read."""
    sglang = set(protocol.ChatCompletionMessageGenericParam.model_fields) | set(
        protocol.ChatCompletionMessageUserParam.model_fields
    )
    assert sglang == MESSAGE_FIELDS
    assert set(ChatMessage.model_fields) == MESSAGE_FIELDS
