"""A request's plan: what the proxy does with one checked body, and the one place that
decides it. The edge, `prism-proxy explain`, the twin and the session twin call the
same functions, so what they report or model is what the proxy serves.

A plan is either the token path (the prompt serialized from the request's `TokenJob`
in the order QAS releases it, sent to the engine's `/generate`), or the engine's own
endpoint with the fields forwarded (what only the engine serves: tools, `n`,
logprobs, ...), scheduled by the turns the proxy finds in it when it can render them
as the engine does; or, when the proxy's tokenizer is not the engine's, the engine's
own endpoint with the body as written. One function per endpoint (`plan_chat`,
`plan_completion`, `plan_generate`). No I/O, no clock: what they depend on is a
`PlanContext`, and what they change is its own (the caller's block evidence and the
session's tool results learn from the request; a sampled chat is told to the
rendering check the caller gives). They may run in a worker thread (a large prompt's
tokenization), so a hint is checked apart, first, on the event loop (`hinted`:
lengths and ids, cheap) and handed in with the context.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.api.completions import CompletionRequest
from prism_proxy.api.generate import GenerateRequest
from prism_proxy.api.hints import PrismHint
from prism_proxy.api.messages import ChatMessage
from prism_proxy.api.segments import SegmentedPrompt, format_validation_error
from prism_proxy.prompts.conversation import find_turns, turns_job
from prism_proxy.prompts.evidence import ScopedEvidence
from prism_proxy.prompts.extraction import find_documents
from prism_proxy.prompts.jobs import PromptError, TokenJob, private_job, segmented_job
from prism_proxy.prompts.serializer import Serializer
from prism_proxy.prompts.tool_results import ToolResults, arrange_tool_messages
from prism_tokens.chat import NotRenderable, content_format, template_messages, template_tools
from prism_tokens.tokenizer import ChatTemplateError

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
GENERATE_PATH = "/generate"

TokenPathBody = ChatCompletionRequest | CompletionRequest | GenerateRequest


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What a plan depends on besides the body: the proxy's serializer (and its
    tokenizer), the layouts documents are looked for in (empty: extraction off for this
    request) and whether found documents may move, the caller's evidence of blank-line
    blocks, the session's tool results (None: their documents keep the client's order,
    as under a policy that does not reorder), whether the session features cut a chat
    at its last message, whether the proxy's tokenizer is the engine's (the token path
    is open, and a chat the engine renders is scheduled by its turns, only then), the
    body's hint as checked (`hinted`; None: checked by the plan), and what to tell a
    chat's messages and its token path ids when this chat is sampled for the
    rendering check (`conversation.rendering_drift`)."""

    serializer: Serializer
    layouts: tuple[str, ...]
    reorder: bool
    evidence: ScopedEvidence
    tool_results: ToolResults | None = None
    sessions: bool = False
    engine_tokenizer: bool = True
    hint: SegmentedPrompt | None = None
    rendering: Callable[[Sequence[Mapping[str, Any]], Sequence[int]], None] | None = None


@dataclass(frozen=True, slots=True)
class Forward:
    """A request the engine's own endpoint `path` serves: `body` is what is forwarded
    (its checked, served fields), with a rid of the proxy's when `set_rid`; `job`: the
    turns QAS schedules it by (None: nothing but its place)."""

    path: str
    body: dict[str, Any]
    set_rid: bool = True
    job: TokenJob | None = None

    @property
    def origin(self) -> str:
        """Its outcome in `prism:extraction_total`: its job's (`turns`), else
        `forwarded`."""
        return "forwarded" if self.job is None else self.job.origin

    @property
    def layout(self) -> str:
        return "" if self.job is None else self.job.layout


# A request's plan: the token path with its job, or the engine's own endpoint.
Plan = TokenJob | Forward


def message_text(message: ChatMessage) -> str:
    """A message's text (content parts of type `text` joined)."""
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text or "" for part in content)


def hinted_prompt(hint: PrismHint, *, system: str | None, suffix: str | None) -> SegmentedPrompt:
    """The `SegmentedPrompt` of a hint; `system`/`suffix` fill what the hint omits."""
    suffix = hint.suffix if hint.suffix is not None else suffix
    if suffix is None:
        raise PromptError("prism.suffix", "missing, and the request has no prompt to use")
    data = {
        "system": hint.system if hint.system is not None else system,
        "segments": [{"id": s.id, "text": s.text} for s in hint.segments],
        "suffix": suffix,
        "reorder": hint.reorder,
    }
    try:
        return SegmentedPrompt.model_validate(data)
    except ValidationError as exc:
        path, _, message = format_validation_error(exc).partition(": ")
        raise PromptError(f"prism.{path}", message) from None


def hinted_job(
    serializer: Serializer,
    hint: PrismHint,
    *,
    system: str | None,
    suffix: str | None,
    chat: bool,
) -> TokenJob:
    """The token job of a hinted request; `chat` is the endpoint's default, used when
    the hint does not set `chat` itself."""
    prompt = hinted_prompt(hint, system=system, suffix=suffix)
    return segmented_job(serializer, prompt, chat=chat if hint.chat is None else hint.chat)


def chat_defaults(messages: Sequence[ChatMessage]) -> tuple[str | None, str | None]:
    """(system, suffix): the first system/developer message and the last user message."""
    system = next((message_text(m) for m in messages if m.role in ("system", "developer")), None)
    suffix = next((message_text(m) for m in reversed(messages) if m.role == "user"), None)
    return system, suffix


def hinted(body: TokenPathBody) -> SegmentedPrompt | None:
    """The prompt of a token-path body's `prism` hint, checked (lengths and ids:
    O(segments), so a refused hint costs no worker thread); None without a hint.
    Raises `PromptError` naming the field. What the hint omits comes from the body: a
    chat's first system message and last user message, a prompt's or text's string
    as the suffix."""
    hint = body.prism
    if hint is None:
        return None
    system: str | None = None
    if isinstance(body, ChatCompletionRequest):
        system, suffix = chat_defaults(body.messages)
    elif isinstance(body, CompletionRequest):
        prompt = body.single_prompt()
        suffix = prompt if isinstance(prompt, str) else None
    else:
        suffix = body.text if isinstance(body.text, str) else None
    return hinted_prompt(hint, system=system, suffix=suffix)


def _hinted_plan(body: TokenPathBody, context: PlanContext, chat: bool) -> TokenJob:
    """The token path of a hinted body (its hint's `chat`, else the endpoint's)."""
    assert body.prism is not None
    checked = context.hint if context.hint is not None else hinted(body)
    assert checked is not None
    as_chat = chat if body.prism.chat is None else body.prism.chat
    return replace(segmented_job(context.serializer, checked, chat=as_chat), origin="hinted")


def _counted(job: TokenJob, context: PlanContext) -> TokenJob:
    """A job of the token path named by where its segments came from: `none` or `off`
    when the proxy found nothing to name (by whether it looked)."""
    if job.origin:
        return job
    return replace(job, origin="none" if context.layouts else "off")


# --- /v1/chat/completions ------------------------------------------------------------
def plan_chat(
    body: ChatCompletionRequest,
    raw: dict[str, Any],
    context: PlanContext,
) -> Plan:
    """A chat on the token path (its hints; documents found in a single turn; else its
    turns), or through the engine's chat endpoint when only it serves the chat
    (`passthrough_reason`), the proxy has no chat template, or its tokenizer is not the
    engine's. `raw`: the body as validated."""
    if body.passthrough_reason() is not None:
        return _engine_chat(body, raw, context)
    if not context.engine_tokenizer:
        return as_written(body, raw)
    if body.prism is not None:
        return _hinted_plan(body, context, chat=True)
    serializer = context.serializer
    messages = body.forwarded(raw)["messages"]
    try:
        job = text_chat(messages, context)
    except NotRenderable:  # a continuation of the assistant's last message
        tokenizer = serializer.tokenizer
        plain = [{"role": m.role, "content": message_text(m)} for m in body.messages]
        ids = tokenizer.encode_chat(tokenizer.render_chat(plain))
        return _counted(private_job({"input_ids": ids}, len(ids)), context)
    except ChatTemplateError:  # no usable chat template: the engine renders the chat
        return Forward(CHAT_PATH, body.forwarded(raw))
    if context.rendering is not None:
        ids = job.build(job.segments).prompt_fields.get("input_ids")
        if ids is not None:
            context.rendering(messages, ids)
    return job


def single_turn(given: Sequence[Mapping[str, Any]]) -> tuple[str | None, str] | None:
    """(system, user text) of a chat of one user message after at most one system (or
    developer) message, with string content and nothing else (`given`: the messages
    as the template reads them); None otherwise. Only such a chat's text is searched
    for documents: in any other, the messages are the structure (its turns)."""
    if not given or given[-1]["role"] != "user" or len(given) > 2:
        return None
    if len(given) == 2 and given[0]["role"] not in ("system", "developer"):
        return None
    if any(set(m) - {"role", "content"} or not isinstance(m["content"], str) for m in given):
        return None
    return (given[0]["content"] if len(given) == 2 else None), given[-1]["content"]


def text_chat(messages: Sequence[Mapping[str, Any]], context: PlanContext) -> TokenJob:
    """A text chat without hints on the token path (`messages` as forwarded): documents
    found in a single turn's user message, or else in its system message
    (`find_documents`); else the chat cut at its message ends (`conversation`); with
    no layouts (extraction off), one private piece. Raises `NotRenderable` (a
    continuation of the assistant's last message) and `ChatTemplateError`."""
    serializer = context.serializer
    tokenizer = serializer.tokenizer
    given = template_messages(messages, content_format(tokenizer.chat_template))
    if not context.layouts:
        ids = tokenizer.encode_chat(tokenizer.render_chat(given))
        return _counted(private_job({"input_ids": ids}, len(ids), origin="off"), context)
    turn = single_turn(given)
    if turn is not None:
        system, text = turn
        found = _find(text, system, context)
        if found is None and system is not None and given[0]["role"] == "system":
            # the documents in the system message (LangChain's retrieval-QA chat prompt)
            found = _find(system, None, context, user=text)
        if found is not None:
            return segmented_job(serializer, found, chat=True)
    return _counted(turns_job(find_turns(tokenizer, given, None)), context)


def _find(
    text: str, system: str | None, context: PlanContext, user: str | None = None
) -> SegmentedPrompt | None:
    return find_documents(
        text,
        system=system,
        layouts=context.layouts,
        reorder=context.reorder,
        evidence=context.evidence,
        user=user,
    )


def _engine_chat(body: ChatCompletionRequest, raw: dict[str, Any], context: PlanContext) -> Plan:
    """A chat only the engine's own endpoint serves: documents in its tool results in
    the order of their first sighting (`tool_results`), and its turns as the engine
    renders them (tools included) when the proxy can render it so with the engine's
    tokenizer: QAS schedules it and DART gets its anchors like any other request."""
    forwarded = body.forwarded(raw)
    set_rid = (body.n or 1) == 1
    searching = bool(context.layouts)
    if searching and context.reorder and context.tool_results is not None:
        arrange_tool_messages(
            forwarded["messages"],
            layouts=context.layouts,
            evidence=context.evidence,
            results=context.tool_results,
        )
    job = None
    if searching and context.engine_tokenizer:
        # a session's key is needed only where an answer may end in a tool call
        last = context.sessions and bool(forwarded.get("tools"))
        job = _engine_turns(context.serializer, forwarded, last)
    if job is None or job.head_tokens == 0:
        job = None
    return Forward(CHAT_PATH, forwarded, set_rid, job)


def _engine_turns(
    serializer: Serializer, forwarded: dict[str, Any], last_message: bool
) -> TokenJob | None:
    """The turns of a chat the engine's own endpoint serves, rendered (tools included)
    as that endpoint renders it (`conversation`), or None when the proxy cannot render
    it as the engine would. `last_message`: the session features' cut at its end."""
    if forwarded.get("chat_template_kwargs") or forwarded.get("reasoning_effort") is not None:
        return None  # template variables the proxy does not pass
    tokenizer = serializer.tokenizer
    try:
        messages = template_messages(forwarded["messages"], content_format(tokenizer.chat_template))
        tools = template_tools(forwarded.get("tools"), forwarded.get("tool_choice"))
        return turns_job(find_turns(tokenizer, messages, tools, last_message=last_message))
    except (NotRenderable, ChatTemplateError):
        return None


# --- /v1/completions and /generate ----------------------------------------------------
def _one_prompt(
    serializer: Serializer, prompt: str | Sequence[int], context: PlanContext
) -> TokenJob:
    """One prompt without hints: documents found in its text, else the text or the ids
    as they are (one private piece)."""
    if isinstance(prompt, str):
        found = _find(prompt, None, context)
        if found is not None:
            return segmented_job(serializer, found, chat=False)
        return _counted(private_job({"text": prompt}, None), context)
    ids = list(prompt)
    return _counted(private_job({"input_ids": ids}, len(ids)), context)


def plan_completion(
    body: CompletionRequest,
    raw: dict[str, Any],
    context: PlanContext,
) -> Plan:
    """One prompt on the token path, or batches, `n`, logprobs and the like through the
    engine's own endpoint (a rid of the proxy's only for one answer)."""
    if body.passthrough_reason() is not None:
        forwarded = body.forwarded(raw)
        return Forward(COMPLETIONS_PATH, forwarded, set_rid=(body.n or 1) == 1)
    if not context.engine_tokenizer:
        return as_written(body, raw)
    if body.prism is not None:
        return _hinted_plan(body, context, chat=False)
    return _one_prompt(context.serializer, body.single_prompt(), context)


def plan_generate(
    body: GenerateRequest,
    raw: dict[str, Any],
    context: PlanContext,
) -> Plan:
    """One prompt on the token path, or batches and `n` through the engine's own
    `/generate` (whose own rids name a batch's prompts)."""
    if body.passthrough_reason() is not None:
        forwarded = body.forwarded(raw)
        return Forward(GENERATE_PATH, forwarded, set_rid=False)
    if not context.engine_tokenizer:
        return as_written(body, raw)
    if body.prism is not None:
        return _hinted_plan(body, context, chat=False)
    if body.input_ids is not None:  # checked in read_body
        return _one_prompt(context.serializer, body.input_ids, context)
    if isinstance(body.text, str):
        return _one_prompt(context.serializer, body.text, context)
    raise PromptError("text", "either text or input_ids is required")


def as_written(body: TokenPathBody, raw: dict[str, Any]) -> Forward:
    """The request as the client wrote it, to its endpoint at the engine: the plan of a
    request the token path could serve but for the tokenizer (not the engine's)."""
    if isinstance(body, ChatCompletionRequest):
        path = CHAT_PATH
    elif isinstance(body, CompletionRequest):
        path = COMPLETIONS_PATH
    else:
        path = GENERATE_PATH
    return Forward(path, body.forwarded(raw))
