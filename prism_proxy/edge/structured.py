"""Structured outputs admitted with care: one client's grammars cannot hold another
client's request in the engine's grammar compiler, nor grow the engine without bound.

* a grammar larger than `max_schema_bytes` is refused with 400 naming it;
* a grammar the engine has not compiled yet ("new": no request carrying it was answered
  by the engine through this proxy) is a compilation in the engine's shared pool: at
  most `max_client_grammar_compiles` requests of one client carrying one may be in
  flight at once, and at most `max_client_grammars_per_minute` new ones may come from
  one client within a minute; beyond either, 429 with Retry-After. A grammar the engine
  has compiled (same text, `api.structured`) is cheap and always passes;
* a request whose new grammars are being compiled for another request waits in the
  proxy for that one's answer (SGLang would start one more compilation of the same
  grammar for each request arriving meanwhile), then passes as a cheap one.

`edge.grammar_ledger` keeps the books, pure; `GrammarShare` is the block an endpoint
holds around the request's way to the engine.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

from aiohttp import web
from pydantic import BaseModel

from prism_proxy.api.structured import EngineGrammar, engine_grammars
from prism_proxy.edge.errors import REFUSED_BY, ApiError
from prism_proxy.edge.gateway import Gateway


def check_sizes(grammars: Sequence[EngineGrammar], limit_bytes: int) -> None:
    """400 naming the first grammar over `max_schema_bytes`."""
    for grammar in grammars:
        size = grammar.size_bytes
        if size > limit_bytes:
            raise ApiError(
                400,
                f"{grammar.param}: {size} bytes exceed the largest schema or grammar "
                f"accepted, {limit_bytes} bytes (max_schema_bytes)",
                param=grammar.param,
            )


class GrammarShare:
    """The block around a request's way to the engine that holds its client's slot for
    its new grammars (module docstring): 400 over `max_schema_bytes` (at once), 429 with
    Retry-After over the client's share (on entering). A request whose new grammars are
    all being compiled for another request waits in the proxy until that one is
    answered, then goes as a cheap one (SGLang would compile them once more for each
    request that arrives meanwhile). Nothing is held for a request without new
    grammars; leaving the block normally marks its grammars compiled."""

    __slots__ = ("_client", "_compiled", "_keys", "_ledger", "_new", "_request", "_retry_after_s")

    def __init__(
        self, request: web.Request, gateway: Gateway, client: str, body: BaseModel, raw: dict
    ) -> None:
        config = gateway.config
        grammars = engine_grammars(raw, type(body).model_fields)
        check_sizes(grammars, config.max_schema_bytes)
        self._keys = list(dict.fromkeys(grammar.key for grammar in grammars))
        self._ledger = gateway.structured
        self._compiled = gateway.compiled
        self._client = client
        self._retry_after_s = config.retry_after_s
        self._request = request
        self._new: list[bytes] = []

    async def __aenter__(self) -> GrammarShare:
        ledger = self._ledger
        while self._keys:
            new = ledger.new(self._keys)
            if not new:
                break
            if all(ledger.being_compiled(key) for key in new):
                await self._compiled[new[0]].wait()  # until the other request is answered
                continue
            refusal = ledger.admit(self._client, new, time.monotonic())
            if refusal is not None:
                retry_after = max(self._retry_after_s, math.ceil(refusal.retry_after_s))
                self._request[REFUSED_BY] = "grammars"
                raise ApiError(
                    429,
                    refusal.message,
                    kind="rate_limit_exceeded",
                    headers={"Retry-After": str(retry_after)},
                )
            self._new = new
            for key in new:
                self._compiled.setdefault(key, asyncio.Event())
            break
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if self._new:
            ledger = self._ledger
            ledger.finish(self._client, self._new, exc is None, time.monotonic())
            for key in self._new:
                if not ledger.being_compiled(key):
                    self._compiled.pop(key).set()  # wakes the requests waiting for it
