"""The endpoints: `/v1/chat/completions`, `/v1/completions`, `/generate`, `/v1/models`,
`/health`, `/metrics`. Each parses its body (`intake`), builds the request's token job
(hints, documents found in its text, or the turns of a chat), and sends it on the token
path or, for what only the engine serves, through (`relay`).

Every accepted request ends in exactly one response: errors raised anywhere become
`ApiError` and one JSON error body (`errors.error_middleware`).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from aiohttp import web

from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.api.completions import CompletionRequest
from prism_proxy.api.costs import PromptSize
from prism_proxy.api.generate import GenerateRequest
from prism_proxy.api.hints import PrismHint
from prism_proxy.api.segments import SegmentedPrompt
from prism_proxy.backend.client import BackendError
from prism_proxy.edge import state
from prism_proxy.edge.accounts import client_key
from prism_proxy.edge.admit import make_job, new_rid, off_loop, prompt_error
from prism_proxy.edge.errors import ENDPOINT, LANE, ApiError, backend_failure, json_answer
from prism_proxy.edge.intake import DecodeShare, check_prompt_size, read_body
from prism_proxy.edge.openai_format import (
    ChatFormat,
    CompletionFormat,
    GenerateFormat,
    ResponseFormat,
)
from prism_proxy.edge.relay import passthrough, token_path
from prism_proxy.edge.structured import GrammarShare
from prism_proxy.prompts.conversation import chat_job, find_turns, turns_job
from prism_proxy.prompts.jobs import (
    Finding,
    PromptError,
    TokenJob,
    chat_defaults,
    find_documents,
    hinted_prompt,
    message_text,
    private_job,
    segmented_job,
)
from prism_proxy.prompts.tool_results import arrange_tool_messages
from prism_tokens.chat import NotRenderable, content_format, template_messages, template_tools
from prism_tokens.tokenizer import ChatTemplateError, Tokenizer


def _format(cls: type[ResponseFormat], rid: str, prefix: str, model: str, usage: bool):
    return cls(
        completion_id=f"{prefix}-{rid}" if prefix else rid, model=model, created=int(time.time()),
        include_usage=usage,
    )  # fmt: skip


EXTRACT_HEADER = "x-prism-extract"


def count_origin(request: web.Request, outcome: str, layout: str = "") -> None:
    """Count a request by where its segments came from (`prism:extraction_total`)."""
    metrics = request.app[state.METRICS]
    metrics.child(metrics.extraction, request[ENDPOINT], outcome, layout).inc()


class DocumentFinder:
    """Documents in a request without hints (`prompts.find_documents`), as the
    deployment's settings and the request's `x-prism-extract` header allow; remembers
    what it found for the metrics. `find` may run in a worker thread."""

    __slots__ = ("evidence", "hinted", "layout", "layouts", "outcome", "reorder")

    def __init__(self, request: web.Request, hinted: bool) -> None:
        config = request.app[state.CONFIG]
        # one client's arrangements never cut another's documents
        self.evidence = request.app[state.EVIDENCE].scoped(client_key(request))
        self.reorder = config.extraction_reorder
        self.layouts = config.extraction_layouts
        opt = request.headers.get(EXTRACT_HEADER)
        if opt is not None:
            opt = opt.strip().lower()
            if opt not in ("on", "off"):
                raise ApiError(
                    400, f"{EXTRACT_HEADER}: expected 'on' or 'off'", param=EXTRACT_HEADER
                )
            if opt == "off":
                self.layouts = ()
        self.hinted = hinted
        self.outcome = "hinted" if hinted else ("none" if self.layouts else "off")
        self.layout = ""

    @property
    def searching(self) -> bool:
        """Whether this request may be segmented (no hints, extraction on for it)."""
        return not self.hinted and bool(self.layouts)

    def find(self, text: str, system: str | None) -> Finding | None:
        finding = find_documents(
            text, system=system, layouts=self.layouts, reorder=self.reorder, evidence=self.evidence
        )
        if finding is not None:
            self.outcome, self.layout = finding.outcome, finding.layout
        return finding

    def count(self, request: web.Request) -> None:
        count_origin(request, self.outcome, self.layout)


async def token_path_open(request: web.Request, hinted: bool) -> bool:
    """Whether a request may take the token path: the proxy's tokenizer is the engine's
    (checked again first when the engine may have changed, `TokenizerGuard`). When it
    is not: False with `tokenizer_mismatch=forward` (the caller sends the request to the
    engine's own endpoint), else 503 naming the tokenizer. A hinted request needs the
    proxy's tokenizer whatever the mode: 503."""
    guard = request.app[state.TOKENIZER_GUARD]
    try:
        if await guard.token_path():
            return True
    except BackendError as exc:
        raise backend_failure(exc) from None
    if guard.forward and not hinted:
        count_origin(request, "forwarded")
        return False
    raise ApiError(503, guard.refusal(), kind="service_unavailable")


class HintedPrompt(NamedTuple):
    prompt: SegmentedPrompt
    chat: bool  # serialized with the chat template


def hint_prompt(
    hint: PrismHint, *, system: str | None, suffix: str | None, chat: bool
) -> HintedPrompt:
    """A hinted request's prompt, checked here on the event loop (400 naming the field),
    and whether it is serialized as a chat (the hint's `chat`, else the endpoint's
    default `chat`). The checks are lengths and ids, O(segments), so a refused hint (a
    1 MB segment over `max_piece_chars`) costs no worker thread's hop; only serializing
    an accepted one (tokenization) leaves the loop (`make_job`)."""
    try:
        prompt = hinted_prompt(hint, system=system, suffix=suffix)
    except PromptError as exc:
        raise prompt_error(exc) from None
    return HintedPrompt(prompt, chat if hint.chat is None else hint.chat)


def _chat_turns(
    tokenizer: Tokenizer, forwarded: dict[str, Any], last_message: bool
) -> TokenJob | None:
    """The turns of a chat the engine's own endpoint serves, rendered (tools included)
    as that endpoint renders it (`conversation`), or None when the proxy cannot render
    it as the engine would. `last_message`: the session features' cut at its end."""
    if forwarded.get("chat_template_kwargs") or forwarded.get("reasoning_effort") is not None:
        return None  # template variables the proxy does not pass
    try:
        messages = template_messages(forwarded["messages"], content_format(tokenizer.chat_template))
        tools = template_tools(forwarded.get("tools"), forwarded.get("tool_choice"))
        return turns_job(find_turns(tokenizer, messages, tools, last_message=last_message))
    except NotRenderable:
        return None


async def chat_relay(
    request: web.Request, body: ChatCompletionRequest, raw: dict[str, Any], size: PromptSize
) -> web.StreamResponse:
    """A chat only the engine's own endpoint serves (tools and tool calls, `n`,
    logprobs, response formats...): it renders the prompt and parses the answer, so the
    client gets exactly the engine's answer. The proxy renders the same prompt to find
    its turns: QAS schedules it and DART gets its anchors like any other request."""
    forwarded = body.forwarded(raw)
    tokenizer = request.app[state.TOKENIZER]
    job = None
    finder = DocumentFinder(request, hinted=False)
    policy = request.app[state.ADMISSION].core.policy
    if finder.searching and finder.reorder and policy.reorders:
        # documents in tool results, in the order of their first sighting
        results = request.app[state.TOOL_RESULTS]
        await off_loop(
            size,
            lambda: arrange_tool_messages(
                forwarded["messages"],
                layouts=finder.layouts,
                evidence=finder.evidence,
                results=results,
            ),
        )
    # the turns are the proxy's tokenization: only with the engine's tokenizer
    open_ = request.app[state.TOKENIZER_GUARD].check.open
    if open_ and finder.searching:
        try:
            # a session's key is needed only where an answer may end in a tool call
            last = request.app[state.CONFIG].sessions and bool(forwarded.get("tools"))
            job = await off_loop(size, lambda: _chat_turns(tokenizer, forwarded, last))
        except ChatTemplateError:
            job = None
    if job is None or job.head_tokens == 0:
        count_origin(request, "forwarded")
        job = None
    else:
        count_origin(request, "turns", "messages")
    path = "/v1/chat/completions"
    set_rid = (body.n or 1) == 1
    group = body.prompt_cache_key or ""
    async with (
        DecodeShare(request, body.decode_ask(), stream=body.stream),
        GrammarShare(request, body, raw),
    ):
        return await passthrough(request, path, forwarded, set_rid=set_rid, job=job, group=group)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    request[ENDPOINT] = "chat"
    body, raw = await read_body(request, ChatCompletionRequest)
    return await serve_chat(request, body, raw)


async def serve_chat(
    request: web.Request, body: ChatCompletionRequest, raw: dict[str, Any]
) -> web.StreamResponse:
    """A checked chat request (`raw` its body as validated), from its size check to its
    answer: the token path, or the engine's own chat endpoint (`chat_relay`)."""
    size = body.prompt_size()
    check_prompt_size(request, size)
    if body.passthrough_reason() is not None:
        return await chat_relay(request, body, raw, size)
    async with (
        DecodeShare(request, body.decode_ask(), stream=body.stream),
        GrammarShare(request, body, raw),
    ):
        return await _chat_token_path(request, body, raw, size)


async def _chat_token_path(
    request: web.Request, body: ChatCompletionRequest, raw: dict[str, Any], size: PromptSize
) -> web.StreamResponse:
    if not await token_path_open(request, body.prism is not None):
        forwarded = body.forwarded(raw)
        group = body.prompt_cache_key or ""
        return await passthrough(
            request, "/v1/chat/completions", forwarded, set_rid=True, group=group
        )
    tokenizer = request.app[state.TOKENIZER]
    serializer = request.app[state.SERIALIZER]
    rendering = request.app[state.RENDERING]
    drifts: list[tuple[bool, int]] = []
    finder = DocumentFinder(request, body.prism is not None)
    hinted = None
    if body.prism is not None:
        system, suffix = chat_defaults(body.messages)
        hinted = hint_prompt(body.prism, system=system, suffix=suffix, chat=True)

    def build() -> TokenJob:
        if hinted is not None:
            return segmented_job(serializer, hinted.prompt, chat=hinted.chat)
        messages = body.forwarded(raw)["messages"]
        try:
            found = chat_job(
                serializer,
                messages,
                layouts=finder.layouts,
                reorder=finder.reorder,
                evidence=finder.evidence,
            )
        except NotRenderable:  # a continuation of the assistant's last message
            messages = [{"role": m.role, "content": message_text(m)} for m in body.messages]
            ids = tokenizer.encode_chat(tokenizer.render_chat(messages))
            return private_job({"input_ids": ids}, len(ids))
        finder.outcome, finder.layout = found.outcome, found.layout
        if rendering.sampled():
            ids = found.job.build(found.job.segments).prompt_fields.get("input_ids")
            if ids is not None:
                drifts.append(rendering.drift(messages, ids))
        return found.job

    try:
        job = await make_job(size, build)
        finder.count(request)
        for differs, tokens in drifts:
            metrics = request.app[state.METRICS]
            metrics.child(metrics.rendering_checks, "differs" if differs else "same").inc()
            metrics.rendering_drift.observe(abs(tokens))
    except ChatTemplateError:
        # No usable chat template here: let the backend render the chat itself.
        count_origin(request, "forwarded")
        return await passthrough(request, "/v1/chat/completions", body.forwarded(raw), set_rid=True)
    rid = new_rid()
    params = body.sampling_params(body.max_new_tokens)
    # unset: until the context ends, as SGLang's chat endpoint reads it (not /generate's 128)
    params.setdefault("max_new_tokens", None)
    return await token_path(
        request,
        job,
        size=size,
        rid=rid,
        sampling_params=params,
        stream=body.stream,
        fmt=_format(ChatFormat, body.rid or rid, "chatcmpl", body.model, body.include_usage),
        extra_fields=body.generate_fields(),
        group=body.prompt_cache_key or "",
    )


async def completions(request: web.Request) -> web.StreamResponse:
    request[ENDPOINT] = "completions"
    body, raw = await read_body(request, CompletionRequest)
    size = body.prompt_size()
    check_prompt_size(request, size)
    async with (
        DecodeShare(request, body.decode_ask(), stream=body.stream),
        GrammarShare(request, body, raw),
    ):
        return await _completions(request, body, raw, size)


async def _completions(
    request: web.Request, body: CompletionRequest, raw: dict[str, Any], size: PromptSize
) -> web.StreamResponse:
    if body.passthrough_reason() is not None:
        forwarded = body.forwarded(raw)
        count_origin(request, "forwarded")
        group = body.prompt_cache_key or ""
        return await passthrough(
            request, "/v1/completions", forwarded, set_rid=(body.n or 1) == 1, group=group
        )
    if not await token_path_open(request, body.prism is not None):
        group = body.prompt_cache_key or ""
        return await passthrough(
            request, "/v1/completions", body.forwarded(raw), set_rid=True, group=group
        )
    prompt = body.single_prompt()
    serializer = request.app[state.SERIALIZER]
    finder = DocumentFinder(request, body.prism is not None)
    hinted = None
    if body.prism is not None:
        text = prompt if isinstance(prompt, str) else None
        hinted = hint_prompt(body.prism, system=None, suffix=text, chat=False)

    def build() -> TokenJob:
        if hinted is not None:
            return segmented_job(serializer, hinted.prompt, chat=hinted.chat)
        if isinstance(prompt, str):
            if (finding := finder.find(prompt, None)) is not None:
                return segmented_job(serializer, finding.prompt, chat=False)
            return private_job({"text": prompt}, None)
        return private_job({"input_ids": prompt}, len(prompt))  # checked in read_body

    job = await make_job(size, build)
    finder.count(request)
    rid = new_rid()
    return await token_path(
        request,
        job,
        size=size,
        rid=rid,
        sampling_params=body.sampling_params(body.max_tokens),
        stream=body.stream,
        fmt=_format(CompletionFormat, body.rid or rid, "cmpl", body.model, body.include_usage),
        extra_fields=body.generate_fields(),
        group=body.prompt_cache_key or "",
    )


async def generate(request: web.Request) -> web.StreamResponse:
    request[ENDPOINT] = "generate"
    body, raw = await read_body(request, GenerateRequest)
    size = body.prompt_size()
    check_prompt_size(request, size)
    async with (
        DecodeShare(request, body.decode_ask(), stream=body.stream),
        GrammarShare(request, body, raw),
    ):
        return await _generate(request, body, raw, size)


async def _generate(
    request: web.Request, body: GenerateRequest, raw: dict[str, Any], size: PromptSize
) -> web.StreamResponse:
    if body.passthrough_reason() is not None:
        count_origin(request, "forwarded")
        return await passthrough(request, "/generate", body.forwarded(raw), set_rid=False)
    if not await token_path_open(request, body.prism is not None):
        # one prompt (batches are passthrough already), as the client wrote it
        return await passthrough(request, "/generate", body.forwarded(raw), set_rid=True)
    serializer = request.app[state.SERIALIZER]
    finder = DocumentFinder(request, body.prism is not None)
    hinted = None
    if body.prism is not None:
        text = body.text if isinstance(body.text, str) else None
        hinted = hint_prompt(body.prism, system=None, suffix=text, chat=False)

    def build() -> TokenJob:
        if hinted is not None:
            return segmented_job(serializer, hinted.prompt, chat=hinted.chat)
        if body.input_ids is not None:  # checked in read_body
            return private_job({"input_ids": body.input_ids}, len(body.input_ids))
        if isinstance(body.text, str):
            if (finding := finder.find(body.text, None)) is not None:
                return segmented_job(serializer, finding.prompt, chat=False)
            return private_job({"text": body.text}, None)
        raise PromptError("text", "either text or input_ids is required")

    job = await make_job(size, build)
    finder.count(request)
    rid = new_rid()
    return await token_path(
        request,
        job,
        size=size,
        rid=rid,
        sampling_params=body.backend_sampling_params(),
        stream=body.stream,
        fmt=_format(GenerateFormat, body.rid or rid, "", "", False),
        extra_fields=body.generate_fields(),
    )


async def health(request: web.Request) -> web.Response:
    """Liveness of the proxy itself (200 while it serves); the body reports the rest."""
    app = request.app
    admission = app[state.ADMISSION]
    return json_answer(
        {
            "status": "ok",
            "backend_up": bool(app[state.BACKEND].up),
            "queue_depth": admission.queue_depth,
            "inflight": admission.inflight,
            "policy": app[state.CONFIG].policy,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[state.METRICS].render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


LANE_HEADER = "x-prism-lane"


async def lane_header(request: web.Request, response: web.StreamResponse) -> None:
    """Tell the client which lane released its request (`hot`, `cold`, `passthrough`),
    so load generators can report per-lane numbers; nothing when it never got one."""
    lane = request.get(LANE)
    if lane is not None and lane != "none":
        response.headers[LANE_HEADER] = lane


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    if app[state.CONFIG].metrics_listen is None:  # else on the admin listener only
        app.router.add_get("/metrics", metrics)
    app.on_response_prepare.append(lane_header)
