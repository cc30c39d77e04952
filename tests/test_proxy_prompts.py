"""From a client request to what QAS queues and what the backend gets (SPEC §1, §4):
hinted jobs serialize in the released order, the endpoint's `chat` default applies
unless the hint sets it, and unhinted prompts are one private piece."""

from __future__ import annotations

import pytest

from prism_proxy.api.hints import PrismHint
from prism_proxy.api.segments import SegmentedPrompt
from prism_proxy.prompts.jobs import PromptError, private_job
from prism_proxy.prompts.plan import hinted_job
from prism_proxy.prompts.serializer import Serializer
from prism_tokens.tokenizer import load_tokenizer
from prism_wire import Anchor, AnchorKind

HINT = {
    "system": "Answer from the documents.",
    "segments": [{"id": "a", "text": "Apples are red."}, {"id": "b", "text": "Sky is blue."}],
}


@pytest.fixture(scope="module")
def serializer() -> Serializer:
    return Serializer(load_tokenizer("builtin"))


def _expected(serializer: Serializer, order: list[str], chat: bool) -> list[int]:
    prompt = SegmentedPrompt.model_validate({**HINT, "suffix": "Which?"})
    return serializer.serialize(prompt, order, chat=chat).input_ids


@pytest.mark.parametrize(
    ("hint_chat", "default", "chat"),
    [(None, True, True), (None, False, False), (False, True, False), (True, False, True)],
)
def test_hinted_job_chat_default_and_release_order(
    serializer: Serializer, hint_chat: bool | None, default: bool, chat: bool
) -> None:
    hint = PrismHint.model_validate({**HINT, "chat": hint_chat})
    job = hinted_job(serializer, hint, system=None, suffix="Which?", chat=default)
    assert job.segments == ("a", "b") and job.reorder
    whole = SegmentedPrompt.model_validate({**HINT, "suffix": "Which?"})
    serialized = serializer.serialize(whole, chat=chat)
    assert job.head_tokens == serialized.head_tokens
    assert job.prefix_key == serialized.prefix_key
    assert job.segment_tokens == (serialized.segment_tokens["a"], serialized.segment_tokens["b"])
    for order in (["a", "b"], ["b", "a"]):
        dispatch = job.build(order)
        assert dispatch.prompt_fields == {"input_ids": _expected(serializer, order, chat)}
        segment_anchors = [a.segment_id for a in dispatch.anchors if a.kind == "segment"]
        assert segment_anchors == order
        assert dispatch.anchors[-1].offset == len(dispatch.prompt_fields["input_ids"])
    rendered = serializer.tokenizer.decode(job.build(["a", "b"]).prompt_fields["input_ids"])
    assert ("<|im_start|>" in rendered) is chat


def test_hint_fields_win_over_the_request_and_missing_suffix_is_named(
    serializer: Serializer,
) -> None:
    hint = PrismHint.model_validate({**HINT, "suffix": "Which?"})
    job = hinted_job(serializer, hint, system="ignored", suffix="ignored", chat=False)
    assert job.build(["a", "b"]).prompt_fields["input_ids"] == _expected(
        serializer, ["a", "b"], False
    )
    with pytest.raises(PromptError) as info:
        hinted_job(serializer, PrismHint.model_validate(HINT), system=None, suffix=None, chat=True)
    assert info.value.param == "prism.suffix"


def test_private_job_is_one_private_piece() -> None:
    job = private_job({"input_ids": [5, 6, 7]}, 3)
    assert (job.segments, job.reorder, job.segment_tokens) == ((), False, None)
    dispatch = job.build(())
    assert dispatch.anchors == [Anchor(AnchorKind.PRIVATE, None, 3)]
    assert private_job({"text": "hi"}, None).build(()).anchors == []
