"""`/v1/completions`: one prompt on the token path (hints, documents found in its text,
or the text or ids as they are); batches, `n`, logprobs and the like through the
engine's own endpoint.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from prism_proxy.api.completions import CompletionRequest
from prism_proxy.api.costs import PromptSize
from prism_proxy.edge.admit import make_job, new_rid
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.openai_format import CompletionFormat, answer_format
from prism_proxy.edge.prompt_origin import (
    DocumentFinder,
    engine_instead,
    hinted_build,
    serve_one_prompt,
)
from prism_proxy.edge.token_path import token_path
from prism_proxy.prompts.jobs import TokenJob, private_job, segmented_job


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
    one_rid = (body.n or 1) == 1
    answer = await engine_instead(
        request, gateway, client, body, raw, "/v1/completions", set_rid=one_rid, group=group
    )
    if answer is not None:
        return answer
    prompt = body.single_prompt()
    serializer = gateway.serializer
    finder = DocumentFinder(request, gateway, client, body.prism is not None)
    hinted = None
    if body.prism is not None:
        text = prompt if isinstance(prompt, str) else None
        hinted = hinted_build(serializer, body.prism, system=None, suffix=text, chat=False)

    def build() -> TokenJob:
        if hinted is not None:
            return hinted()
        if isinstance(prompt, str):
            if (found := finder.find(prompt, None)) is not None:
                return segmented_job(serializer, found, chat=False)
            return private_job({"text": prompt}, None)
        return private_job({"input_ids": prompt}, len(prompt))  # checked in read_body

    job = await make_job(size, build)
    finder.count(request, job)
    rid = new_rid()
    return await token_path(
        request,
        gateway,
        job,
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
