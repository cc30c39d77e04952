"""`/v1/chat/completions`: a chat on the token path (hints, documents found in its
messages, or its turns), or, for what only the engine serves, through its own chat
endpoint with the turns the proxy renders (`chat_relay`). `serve_chat` also serves
`/v1/responses` (`edge.responses_api`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.api.costs import PromptSize
from prism_proxy.edge.accounts import client_key
from prism_proxy.edge.admit import make_job, new_rid, off_loop
from prism_proxy.edge.errors import ENDPOINT
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.intake import DecodeShare, check_prompt_size, read_body
from prism_proxy.edge.openai_format import ChatFormat, answer_format
from prism_proxy.edge.passthrough import passthrough
from prism_proxy.edge.prompt_origin import (
    DocumentFinder,
    count_origin,
    hinted_build,
    token_path_open,
)
from prism_proxy.edge.structured import GrammarShare
from prism_proxy.edge.token_path import token_path
from prism_proxy.prompts.conversation import chat_job, find_turns, turns_job
from prism_proxy.prompts.jobs import (
    TokenJob,
    chat_defaults,
    message_text,
    private_job,
)
from prism_proxy.prompts.tool_results import arrange_tool_messages
from prism_tokens.chat import NotRenderable, content_format, template_messages, template_tools
from prism_tokens.tokenizer import ChatTemplateError, Tokenizer


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
    request: web.Request,
    gateway: Gateway,
    client: str,
    body: ChatCompletionRequest,
    raw: dict[str, Any],
    size: PromptSize,
) -> web.StreamResponse:
    """A chat only the engine's own endpoint serves (tools and tool calls, `n`,
    logprobs, response formats...): it renders the prompt and parses the answer, so the
    client gets exactly the engine's answer. The proxy renders the same prompt to find
    its turns: QAS schedules it and DART gets its anchors like any other request.
    Served within the request's decode and grammar shares (`serve_chat`)."""
    forwarded = body.forwarded(raw)
    tokenizer = gateway.tokenizer
    job = None
    finder = DocumentFinder(request, gateway, client, hinted=False)
    policy = gateway.admission.core.policy
    if finder.searching and finder.reorder and policy.reorders:
        # documents in tool results, in the order of their first sighting
        results = gateway.tool_results
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
    open_ = gateway.tokenizer_guard.check.open
    if open_ and finder.searching:
        try:
            # a session's key is needed only where an answer may end in a tool call
            last = gateway.config.sessions and bool(forwarded.get("tools"))
            job = await off_loop(size, lambda: _chat_turns(tokenizer, forwarded, last))
        except ChatTemplateError:
            job = None
    if job is None or job.head_tokens == 0:
        count_origin(request, gateway.metrics, "forwarded")
        job = None
    else:
        count_origin(request, gateway.metrics, "turns", "messages")
    path = "/v1/chat/completions"
    set_rid = (body.n or 1) == 1
    group = body.prompt_cache_key or ""
    return await passthrough(
        request, gateway, client, path, forwarded, set_rid=set_rid, job=job, group=group
    )


async def chat_completions(request: web.Request, gateway: Gateway) -> web.StreamResponse:
    request[ENDPOINT] = "chat"
    body, raw = await read_body(request, gateway, ChatCompletionRequest)
    return await serve_chat(request, gateway, body, raw)


async def serve_chat(
    request: web.Request, gateway: Gateway, body: ChatCompletionRequest, raw: dict[str, Any]
) -> web.StreamResponse:
    """A checked chat request (`raw` its body as validated), from its size check to its
    answer: the token path, or the engine's own chat endpoint (`chat_relay`). The
    caller's `accounts.client_key` is computed once here and carried."""
    size = body.prompt_size()
    check_prompt_size(gateway.config, size)
    client = client_key(request)
    # the shares' block here rather than `serve_within_shares`: one file less on the
    # request's await chain, which every resumption of its task walks again; one block
    # for both ways
    async with (
        DecodeShare(request, gateway, client, body.decode_ask(), stream=body.stream),
        GrammarShare(request, gateway, client, body, raw),
    ):
        if body.passthrough_reason() is not None:
            return await chat_relay(request, gateway, client, body, raw, size)
        return await _chat_token_path(request, gateway, client, body, raw, size)


async def _chat_token_path(
    request: web.Request,
    gateway: Gateway,
    client: str,
    body: ChatCompletionRequest,
    raw: dict[str, Any],
    size: PromptSize,
) -> web.StreamResponse:
    if not await token_path_open(request, gateway, body.prism is not None):
        forwarded = body.forwarded(raw)
        group = body.prompt_cache_key or ""
        return await passthrough(
            request, gateway, client, "/v1/chat/completions", forwarded, set_rid=True, group=group
        )
    tokenizer = gateway.tokenizer
    serializer = gateway.serializer
    rendering = gateway.rendering
    drifts: list[tuple[bool, int]] = []
    finder = DocumentFinder(request, gateway, client, body.prism is not None)
    hinted = None
    if body.prism is not None:
        system, suffix = chat_defaults(body.messages)
        hinted = hinted_build(serializer, body.prism, system=system, suffix=suffix, chat=True)

    def build() -> TokenJob:
        if hinted is not None:
            return hinted()
        messages = body.forwarded(raw)["messages"]
        try:
            job = chat_job(
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
        if rendering.sampled():
            ids = job.build(job.segments).prompt_fields.get("input_ids")
            if ids is not None:
                drifts.append(rendering.drift(messages, ids))
        return job

    try:
        job = await make_job(size, build)
        finder.count(request, job)
        for differs, tokens in drifts:
            metrics = gateway.metrics
            metrics.child(metrics.rendering_checks, "differs" if differs else "same").inc()
            metrics.rendering_drift.observe(abs(tokens))
    except ChatTemplateError:
        # No usable chat template here: let the backend render the chat itself.
        count_origin(request, gateway.metrics, "forwarded")
        forwarded = body.forwarded(raw)
        path = "/v1/chat/completions"
        return await passthrough(request, gateway, client, path, forwarded, set_rid=True)
    rid = new_rid()
    params = body.sampling_params(body.max_new_tokens)
    # unset: until the context ends, as SGLang's chat endpoint reads it (not /generate's 128)
    params.setdefault("max_new_tokens", None)
    return await token_path(
        request,
        gateway,
        job,
        client=client,
        size=size,
        rid=rid,
        sampling_params=params,
        stream=body.stream,
        fmt=answer_format(ChatFormat, body.rid or rid, "chatcmpl", body.model, body.include_usage),
        extra_fields=body.generate_fields(),
        group=body.prompt_cache_key or "",
    )
