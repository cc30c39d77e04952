"""SGLang-native `/generate`: one prompt on the token path (hints, documents found in its
text, or the text or ids as they are); batches and `n` through the engine's own
endpoint.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from prism_proxy.api.costs import PromptSize
from prism_proxy.api.generate import GenerateRequest
from prism_proxy.edge.admit import make_job, new_rid
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.openai_format import GenerateFormat, answer_format
from prism_proxy.edge.prompt_origin import (
    DocumentFinder,
    engine_instead,
    hinted_build,
    serve_one_prompt,
)
from prism_proxy.edge.token_path import token_path
from prism_proxy.prompts.jobs import PromptError, TokenJob, private_job, segmented_job


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
    # the engine's own rids name a batch's prompts
    answer = await engine_instead(request, gateway, client, body, raw, "/generate", set_rid=False)
    if answer is not None:
        return answer
    serializer = gateway.serializer
    finder = DocumentFinder(request, gateway, client, body.prism is not None)
    hinted = None
    if body.prism is not None:
        text = body.text if isinstance(body.text, str) else None
        hinted = hinted_build(serializer, body.prism, system=None, suffix=text, chat=False)

    def build() -> TokenJob:
        if hinted is not None:
            return hinted()
        if body.input_ids is not None:  # checked in read_body
            return private_job({"input_ids": body.input_ids}, len(body.input_ids))
        if isinstance(body.text, str):
            if (found := finder.find(body.text, None)) is not None:
                return segmented_job(serializer, found, chat=False)
            return private_job({"text": body.text}, None)
        raise PromptError("text", "either text or input_ids is required")

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
        sampling_params=body.backend_sampling_params(),
        stream=body.stream,
        fmt=answer_format(GenerateFormat, body.rid or rid, "", "", False),
        extra_fields=body.generate_fields(),
    )
