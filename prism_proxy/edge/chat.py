"""`/v1/chat/completions`: a chat's plan (`prompts.plan.plan_chat`: hints, documents
found in its messages, or its turns on the token path; what only the engine serves
through its own chat endpoint, scheduled by the turns the proxy renders), served.
`serve_chat` also serves `/v1/responses` (`edge.responses_api`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from prism_proxy.api.chat import ChatCompletionRequest
from prism_proxy.api.costs import PromptSize
from prism_proxy.edge.accounts import client_key
from prism_proxy.edge.admit import new_rid
from prism_proxy.edge.errors import ENDPOINT
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.intake import DecodeShare, read_body
from prism_proxy.edge.openai_format import ChatFormat, answer_format
from prism_proxy.edge.prompt_origin import forward, make_plan, plan_context
from prism_proxy.edge.structured import GrammarShare
from prism_proxy.edge.token_path import token_path
from prism_proxy.prompts.plan import Forward, plan_chat


async def chat_completions(request: web.Request, gateway: Gateway) -> web.StreamResponse:
    request[ENDPOINT] = "chat"
    body, raw, size = await read_body(request, gateway, ChatCompletionRequest)
    return await serve_chat(request, gateway, body, raw, size)


async def serve_chat(
    request: web.Request,
    gateway: Gateway,
    body: ChatCompletionRequest,
    raw: dict[str, Any],
    size: PromptSize,
) -> web.StreamResponse:
    """A checked chat request (`raw` its body as validated, `size` its prompt's, checked),
    to its answer, within its decode and grammar shares. The caller's
    `accounts.client_key` is computed once here and carried."""
    client = client_key(request)
    group = body.prompt_cache_key or ""
    # the shares' block here rather than `serve_one_prompt`'s: one file less on the
    # request's await chain, which every resumption of its task walks again
    async with (
        DecodeShare(request, gateway, client, body.decode_ask(), stream=body.stream),
        GrammarShare(request, gateway, client, body, raw),
    ):
        context = await plan_context(request, gateway, client, body, rendering=True)
        plan = await make_plan(request, gateway, size, lambda: plan_chat(body, raw, context))
        if isinstance(plan, Forward):
            return await forward(request, gateway, client, plan, group)
        rid = new_rid()
        params = body.sampling_params(body.max_new_tokens)
        # unset: until the context ends, as SGLang's chat endpoint reads it (not
        # /generate's 128)
        params.setdefault("max_new_tokens", None)
        return await token_path(
            request,
            gateway,
            plan,
            client=client,
            size=size,
            rid=rid,
            sampling_params=params,
            stream=body.stream,
            fmt=answer_format(
                ChatFormat, body.rid or rid, "chatcmpl", body.model, body.include_usage
            ),
            extra_fields=body.generate_fields(),
            group=group,
        )
