"""A request's plan (`prism_proxy.prompts.plan`): what the proxy does with a checked body,
the one function per endpoint that the edge, `explain`, the twin and the session twin
call. Pure: driven here without a server, with the builtin tokenizer."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.api.completions import CompletionRequest
from prism_proxy.api.generate import GenerateRequest
from prism_proxy.prompts.conversation import rendering_drift
from prism_proxy.prompts.evidence import BlockEvidence
from prism_proxy.prompts.extraction import ALL_LAYOUTS
from prism_proxy.prompts.jobs import PromptError, TokenJob
from prism_proxy.prompts.plan import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    GENERATE_PATH,
    Forward,
    PlanContext,
    as_written,
    hinted,
    plan_chat,
    plan_completion,
    plan_generate,
    text_chat,
)
from prism_proxy.prompts.serializer import Serializer
from prism_proxy.prompts.tool_results import ToolResults
from prism_tokens.chat import NotRenderable
from prism_tokens.tokenizer import Tokenizer, load_tokenizer

DOCS = ["The Osse flows north.", "Two bridges cross it.", "The mill is old."]
SYSTEM = {"role": "system", "content": "You are a travel agent."}
USER = {"role": "user", "content": "What is the weather in Paris?"}
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_tokenizer()


def context_of(tokenizer: Tokenizer, **fields) -> PlanContext:
    evidence = BlockEvidence(1 << 20).scoped("client")
    return replace(PlanContext(Serializer(tokenizer), ALL_LAYOUTS, True, evidence), **fields)


def chat(**fields) -> tuple[ChatCompletionRequest, dict]:
    raw = {"model": "m", **fields}
    return ChatCompletionRequest.model_validate(raw), raw


def ids_of(job: TokenJob) -> list[int]:
    return list(job.build(job.segments).prompt_fields["input_ids"])


# --- a text chat on the token path ------------------------------------------------------
def test_documents_in_the_system_message_are_found_and_served_exactly(tokenizer):
    """LangChain's retrieval-QA chat prompt: the documents inside <context> in the system
    message, the question in the user's. In the client's order the engine gets exactly
    the client's text; the documents are segments after a head that ends at <context>."""
    system = "Answer from the context:\n\n<context>\n" + "\n\n".join(DOCS) + "\n</context>"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Bridges?"}]
    found = text_chat(messages, context_of(tokenizer))
    assert (found.origin, found.layout) == ("found-ordered", "xml")  # no evidence yet
    assert found.prompt is not None and found.prompt.user == "Bridges?"
    assert len(found.segments) == 3
    assert tokenizer.decode(ids_of(found)) == tokenizer.render_chat(messages)
    head = tokenizer.decode(ids_of(found)[: found.head_tokens])
    assert head.endswith("<context>\n") and head.startswith("<|im_start|>system\n")


def test_a_chat_without_documents_goes_by_its_turns_and_off_is_one_piece(tokenizer):
    answer, follow_up = (
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Rome?"},
    )
    messages = [SYSTEM, USER, answer, follow_up]
    context = context_of(tokenizer)
    found = text_chat(messages, context)
    assert (found.origin, found.layout) == ("turns", "messages")
    assert len(found.segments) == 2
    off = text_chat(messages, replace(context, layouts=()))
    assert off.origin == "off" and off.segments == ()
    whole = tokenizer.encode(tokenizer.render_chat(messages))
    assert ids_of(found) == whole and ids_of(off) == whole
    with pytest.raises(NotRenderable):  # continuing the assistant's message
        text_chat([USER, {"role": "assistant", "content": "Par"}], context)


TEXT = "\n\n".join(DOCS)
PARTS = [{"type": "text", "text": TEXT}]
HELLO = {"role": "assistant", "content": "Hello."}


@pytest.mark.parametrize(
    ("messages", "searched"),
    [
        ([{"role": "user", "content": TEXT}], True),
        ([{"role": "developer", "content": "Be brief."}, {"role": "user", "content": TEXT}], True),
        # text parts: the template reads one string (SGLang's `string` content format)
        ([{"role": "user", "content": PARTS}], True),
        # another turn before: the messages are the structure, not the text
        ([HELLO, {"role": "user", "content": TEXT}], False),
        ([USER, HELLO, {"role": "user", "content": TEXT}], False),
    ],
)
def test_one_single_turn_rule_for_the_edge_and_explain(tokenizer, messages, searched):
    """Only a chat of one user message after at most one system or developer message
    is searched for documents; `explain` reports what the plan does, whatever the
    rule says (it calls the same function)."""
    from prism_proxy.explain import find_request

    body, raw = chat(messages=messages)
    plan = plan_chat(body, raw, context_of(tokenizer))
    assert isinstance(plan, TokenJob) and (plan.prompt is not None) == searched
    assert plan.origin.startswith("found") == searched
    assert find_request(raw)["outcome"] == plan.origin


def test_a_continuation_is_one_private_piece_and_hints_come_first(tokenizer):
    context = context_of(tokenizer)
    body, raw = chat(messages=[USER, {"role": "assistant", "content": "Par"}])
    plan = plan_chat(body, raw, context)
    assert isinstance(plan, TokenJob) and plan.origin == "none" and plan.segments == ()
    hint = {"segments": [{"id": "a", "text": "Alpha."}, {"id": "b", "text": "Beta."}]}
    body, raw = chat(messages=[SYSTEM, USER], prism=hint)
    checked = hinted(body)
    assert checked is not None and checked.system == SYSTEM["content"]
    assert checked.suffix == USER["content"]  # what the hint omits, from the messages
    plan = plan_chat(body, raw, replace(context, hint=checked))
    assert isinstance(plan, TokenJob) and plan.origin == "hinted"
    assert plan.segments == ("a", "b") and plan.prompt == checked


def test_a_sampled_chat_is_told_to_the_rendering_check(tokenizer):
    body, raw = chat(messages=[SYSTEM, USER])
    told: list[tuple[list, list[int]]] = []
    plan = plan_chat(body, raw, context_of(tokenizer, rendering=lambda m, i: told.append((m, i))))
    assert isinstance(plan, TokenJob) and told == [(raw["messages"], ids_of(plan))]
    assert rendering_drift(tokenizer, *told[0]) == (False, 0)  # the builtin template cuts cleanly
    telling = context_of(tokenizer, rendering=lambda m, i: told.append((m, i)))
    plan_chat(*agent_chat(), telling)  # the engine renders it: nothing to compare
    assert len(told) == 1


# --- what only the engine serves --------------------------------------------------------
def numbered(documents: list[str]) -> str:
    return "\n\n".join(f"[{i + 1}] {d}" for i, d in enumerate(documents))


def agent_chat(n: int = 1) -> tuple[ChatCompletionRequest, dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    messages = [
        SYSTEM,
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": numbered(DOCS)},
    ]
    return chat(messages=messages, tools=[LOOKUP], n=n)


def test_a_chat_with_tools_goes_to_the_engine_scheduled_by_its_turns(tokenizer):
    body, raw = agent_chat()
    context = context_of(tokenizer)
    plan = plan_chat(body, raw, context)
    assert isinstance(plan, Forward) and plan.path == CHAT_PATH and plan.set_rid
    assert plan.body["tools"] == [LOOKUP] and "prism" not in plan.body
    assert (plan.origin, plan.layout) == ("turns", "messages")
    assert plan.job is not None and plan.job.head_tokens > 0
    # several answers: the engine's own rids; without the engine's tokenizer, or with
    # extraction off, nothing to schedule it by
    several = plan_chat(*agent_chat(n=2), context)
    assert isinstance(several, Forward) and not several.set_rid
    for other in (replace(context, engine_tokenizer=False), replace(context, layouts=())):
        unscheduled = plan_chat(body, raw, other)
        assert isinstance(unscheduled, Forward) and unscheduled.path == CHAT_PATH
        assert unscheduled.job is None and unscheduled.origin == "forwarded"


def test_a_tool_results_documents_keep_their_first_order_within_a_session(tokenizer):
    """The second call of a session re-sends its tool result with the documents in
    another order: served in the first call's order with the session's tool results,
    as written without them (a policy that does not reorder)."""
    body, raw = agent_chat()
    context = context_of(tokenizer, tool_results=ToolResults(1 << 20))
    first = plan_chat(body, raw, context)
    assert isinstance(first, Forward)
    shuffled = [DOCS[2], DOCS[0], DOCS[1]]
    result = {**raw["messages"][3], "content": numbered(shuffled)}
    raw2 = {**raw, "messages": [*raw["messages"][:3], result]}
    body2 = ChatCompletionRequest.model_validate(raw2)
    second = plan_chat(body2, raw2, context)
    assert isinstance(second, Forward) and second.body["messages"][3] == first.body["messages"][3]
    assert second.body["messages"][3] != raw2["messages"][3]
    kept = plan_chat(body2, raw2, replace(context, tool_results=None))
    assert isinstance(kept, Forward) and kept.body["messages"][3] == raw2["messages"][3]


# --- /v1/completions and /generate ------------------------------------------------------
def test_one_prompt_plans(tokenizer):
    context = context_of(tokenizer)
    text = "Context:\n\n" + numbered(DOCS) + "\n\nQ?"
    body = CompletionRequest.model_validate({"model": "m", "prompt": text})
    found = plan_completion(body, {}, context)
    assert isinstance(found, TokenJob) and found.origin.startswith("found")
    assert found.prompt is not None
    ids = GenerateRequest.model_validate({"input_ids": [1, 2, 3]})
    private = plan_generate(ids, {}, context)
    assert isinstance(private, TokenJob) and private.origin == "none"
    assert private.build(()).prompt_fields == {"input_ids": [1, 2, 3]}
    as_text = GenerateRequest.model_validate({"text": text})
    off = plan_generate(as_text, {}, replace(context, layouts=()))
    assert isinstance(off, TokenJob) and off.origin == "off"
    assert off.build(()).prompt_fields == {"text": text}
    batch_raw = {"model": "m", "prompt": ["a", "b"]}
    batch = plan_completion(CompletionRequest.model_validate(batch_raw), batch_raw, context)
    assert isinstance(batch, Forward) and batch.path == COMPLETIONS_PATH
    assert batch.job is None and batch.origin == "forwarded" and batch.body["prompt"] == ["a", "b"]
    with pytest.raises(PromptError) as refused:  # a hint with nothing to take the suffix from
        hint = {"segments": [{"id": "a", "text": "x"}]}
        hinted(CompletionRequest.model_validate({"model": "m", "prompt": [1, 2], "prism": hint}))
    assert refused.value.param == "prism.suffix"


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"model": "m", "messages": [USER]}, CHAT_PATH),
        ({"model": "m", "prompt": "Hi"}, COMPLETIONS_PATH),
        ({"text": "Hi"}, GENERATE_PATH),
    ],
)
def test_as_written_goes_to_the_endpoint_it_came_to(raw, path):
    model = {CHAT_PATH: ChatCompletionRequest, COMPLETIONS_PATH: CompletionRequest}
    body = model.get(path, GenerateRequest).model_validate(raw)
    plan = as_written(body, raw)
    assert (plan.path, plan.job, plan.set_rid, plan.origin) == (path, None, True, "forwarded")


def test_without_the_engines_tokenizer_the_token_path_goes_as_written(tokenizer):
    """The proxy's tokenizer is not the engine's (`tokenizer_mismatch=forward`): what
    the token path would serve goes to the engine's own endpoint as the client wrote
    it; what only the engine serves still goes there, unscheduled."""
    closed = context_of(tokenizer, engine_tokenizer=False)
    body, raw = chat(messages=[SYSTEM, USER])
    assert plan_chat(body, raw, closed) == as_written(body, raw)
    prompt = {"model": "m", "prompt": "Hi"}
    completion = CompletionRequest.model_validate(prompt)
    assert plan_completion(completion, prompt, closed) == as_written(completion, prompt)
    generate = GenerateRequest.model_validate({"text": "Hi"})
    assert plan_generate(generate, {"text": "Hi"}, closed) == as_written(generate, {"text": "Hi"})
