"""SGLang-native `/generate`: a prompt's plan (`prompts.plan.plan_generate`: one prompt on
the token path, with its hints, documents found in its text, or the text or ids as
they are; batches and `n` through the engine's own endpoint), served.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from prism_proxy.api.costs import PromptSize
from prism_proxy.api.generate import GenerateRequest
from prism_proxy.edge.admit import new_rid
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.openai_format import GenerateFormat, answer_format
from prism_proxy.edge.prompt_origin import forward, make_plan, plan_context, serve_one_prompt
from prism_proxy.edge.token_path import token_path
from prism_proxy.prompts.plan import Forward, plan_generate


async def generate(request: web.Request, gateway: Gateway) -> web.StreamResponse:
    return await serve_one_prompt(request, gateway, "generate", GenerateRequest, _generate)


async def _generate(
    request: web.Request,
    gateway: Gateway,
    client: str,
    body: GenerateRequest,
    raw: dict[str, Any],
    size: PromptSize,
) -> web.StreamResponse:
    context = await plan_context(request, gateway, client, body)
    plan = await make_plan(request, gateway, size, lambda: plan_generate(body, raw, context))
    if isinstance(plan, Forward):
        return await forward(request, gateway, client, plan)
    rid = new_rid()
    return await token_path(
        request,
        gateway,
        plan,
        client=client,
        size=size,
        rid=rid,
        sampling_params=body.backend_sampling_params(),
        stream=body.stream,
        fmt=answer_format(GenerateFormat, body.rid or rid, "", "", False),
        extra_fields=body.generate_fields(),
    )
