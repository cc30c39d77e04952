"""`/v1/embeddings`, in the shape SGLang 0.5.23 answers it (`serving_embedding.py`).

The simulated engine has no model: an input's embedding is a unit vector drawn from a
generator seeded by its token ids, so the same input always gets the same vector and
different inputs (almost surely) different ones. `dimensions` sets its length
(`EMBEDDING_DIMENSIONS` without it); `encoding_format` "base64" packs it as
little-endian float32, as SGLang does. Answered at once, outside the simulated
scheduler: no test of timing reads embeddings.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
from typing import Any

from aiohttp import web

from prism_sim.api_models import EmbeddingIn
from prism_sim.http_common import (
    ENGINE_KEY,
    BadRequest,
    check_token_ids,
    encode,
    error_response,
    parse_body,
)

EMBEDDING_DIMENSIONS = 32


def embedding(ids: list[int], dimensions: int) -> list[float]:
    """The unit vector of a tokenized input (module docstring)."""
    seed = int.from_bytes(hashlib.sha256(struct.pack(f"<{len(ids)}q", *ids)).digest()[:8])
    draw = random.Random(seed)
    vector = [draw.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def _serialized(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


async def embeddings(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        body = await parse_body(request, EmbeddingIn)
        items: list[Any] = [body.input] if isinstance(body.input, str) else list(body.input)
        if not items or (isinstance(body.input, list) and isinstance(items[0], int)):
            items = [body.input]
        if any(item == "" or item == [] for item in items):
            raise BadRequest("Input cannot be empty")
        ids = [
            await encode(engine, item) if isinstance(item, str) else check_token_ids(engine, item)
            for item in items
        ]
    except BadRequest as exc:
        return error_response(str(exc))
    dimensions = body.dimensions or EMBEDDING_DIMENSIONS
    data = [
        {
            "embedding": _serialized(embedding(item, dimensions), body.encoding_format),
            "index": index,
            "object": "embedding",
        }
        for index, item in enumerate(ids)
    ]
    tokens = sum(map(len, ids))
    usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
             "prompt_tokens_details": None}  # fmt: skip
    # as SGLang: the model's path, whatever the request named
    return web.json_response(
        {"data": data, "model": engine.model_path, "object": "list", "usage": usage}
    )
