"""`/v1/completions`: a prompt's plan (`prompts.plan.plan_completion`: one prompt on the
token path, with its hints, documents found in its text, or the text or ids as they
are; batches, `n`, logprobs and the like through the engine's own endpoint), served.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from prism_proxy.api.completions import CompletionRequest
from prism_proxy.api.costs import PromptSize
from prism_proxy.edge.admit import new_rid
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.openai_format import CompletionFormat, answer_format
from prism_proxy.edge.prompt_origin import forward, make_plan, plan_context, serve_one_prompt
from prism_proxy.edge.token_path import token_path
from prism_proxy.prompts.plan import Forward, plan_completion


async def completions(request: web.Request, gateway: Gateway) -> web.StreamResponse:
    return await serve_one_prompt(request, gateway, "completions", CompletionRequest, _completions)


async def _completions(
    request: web.Request,
    gateway: Gateway,
    client: str,
    body: CompletionRequest,
    raw: dict[str, Any],
    size: PromptSize,
) -> web.StreamResponse:
    group = body.prompt_cache_key or ""
    context = await plan_context(request, gateway, client, body)
    plan = await make_plan(request, gateway, size, lambda: plan_completion(body, raw, context))
    if isinstance(plan, Forward):
        return await forward(request, gateway, client, plan, group)
    rid = new_rid()
    return await token_path(
        request,
        gateway,
        plan,
        client=client,
        size=size,
        rid=rid,
        sampling_params=body.sampling_params(body.max_tokens),
        stream=body.stream,
        fmt=answer_format(
            CompletionFormat, body.rid or rid, "cmpl", body.model, body.include_usage
        ),
        extra_fields=body.generate_fields(),
        group=group,
    )
