"""`/v1/embeddings`, `/v1/tokenize`, `/v1/detokenize`: the engine's own endpoints,
forwarded through the gateway's field checks (`api.forwarded`).

Embeddings run the model over their inputs: they are admitted like any forwarded
request (`relay.passthrough`: QAS orders them, the engine's load paces them); the
engine's answer (within `max_answer_bytes`) comes back with a served model name where
SGLang writes the model's path (`api.forwarded.embedding_answer`). Tokenizing runs no
model: it is sent on at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from prism_proxy.api.forwarded import (
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
    embedding_answer,
)
from prism_proxy.backend.errors import BackendError
from prism_proxy.edge.accounts import client_key
from prism_proxy.edge.errors import ENDPOINT, ApiError, backend_failure, json_answer
from prism_proxy.edge.gateway import Gateway, with_gateway
from prism_proxy.edge.intake import read_body
from prism_proxy.edge.passthrough import passthrough
from prism_proxy.edge.relay import OFFLOAD_ANSWER_BYTES

EMBEDDINGS_PATH = "/v1/embeddings"


async def embeddings(request: web.Request, gateway: Gateway) -> web.StreamResponse:
    request[ENDPOINT] = "embeddings"
    body, raw, _ = await read_body(request, gateway, EmbeddingRequest)
    # a batch's rid would be a list of the engine's own: one rid names one input
    forwarded = body.forwarded(raw)
    client = client_key(request)
    answer = await passthrough(
        request, gateway, client, EMBEDDINGS_PATH, forwarded, set_rid=not body.batch
    )
    data = answer.body if isinstance(answer, web.Response) else None
    if answer.status != 200 or not isinstance(data, bytes):
        return answer  # the engine's own error, or a client gone
    if len(data) >= OFFLOAD_ANSWER_BYTES:
        return await asyncio.to_thread(_published, data)
    return _published(data)


def _published(data: bytes) -> web.Response:
    try:
        answer = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ApiError(502, "the engine sent an invalid embeddings answer") from None
    if not isinstance(answer, dict):
        raise ApiError(502, "the engine sent an embeddings answer that is not an object")
    return json_answer(embedding_answer(answer))


async def _forward(gateway: Gateway, path: str, body: dict[str, Any]) -> web.Response:
    """Send `body` to the engine's `path` now; its answer, or its error's status."""
    try:
        answer = await gateway.backend.post_json(path, body, gateway.config.backend_timeout_s)
    except BackendError as exc:
        raise backend_failure(exc) from None
    return json_answer(answer)


async def tokenize(request: web.Request, gateway: Gateway) -> web.Response:
    request[ENDPOINT] = "tokenize"
    body, raw, _ = await read_body(request, gateway, TokenizeRequest)
    return await _forward(gateway, "/v1/tokenize", body.forwarded(raw))


async def detokenize(request: web.Request, gateway: Gateway) -> web.Response:
    request[ENDPOINT] = "detokenize"
    body, raw, _ = await read_body(request, gateway, DetokenizeRequest)
    return await _forward(gateway, "/v1/detokenize", body.forwarded(raw))


def add_routes(app: web.Application) -> None:
    app.router.add_post(EMBEDDINGS_PATH, with_gateway(embeddings))
    app.router.add_post("/v1/tokenize", with_gateway(tokenize))
    app.router.add_post("/v1/detokenize", with_gateway(detokenize))
