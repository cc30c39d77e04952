"""A request's body in: read within the byte limit, parsed off the event loop when costly,
validated by its model, and checked for what types cannot say (fields PRISM does not
serve, token ids outside the vocabulary, the prompt's size): 413 or 400 naming the field.
JSON parsing itself is `bodies.JsonParser`'s (off the event loop when costly).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, cast

from aiohttp import web
from pydantic import BaseModel, ValidationError

from prism_proxy.api.costs import CheckedBody, DecodeAsk, PromptSize
from prism_proxy.api.error_body import describe_validation_error
from prism_proxy.api.grammars.gate import GrammarGate
from prism_proxy.api.sglang_fields import MAX_PROMPT_LOGPROB_ENTRIES, REFUSED
from prism_proxy.backend.tokenizer_guard import TokenizerGuard
from prism_proxy.config import ProxyConfig
from prism_proxy.edge.bodies import BodyError, Caps, check_counts
from prism_proxy.edge.errors import REFUSED_BY, ApiError
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.limits import (
    EngineSize,
    LimitError,
    check_answer,
    check_decode,
    client_limit,
    request_limit,
    reserved_tokens,
)

M = TypeVar("M", bound=BaseModel)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body exceeds {limit} bytes", param="body")


def body_caps(config: ProxyConfig) -> Caps:
    return Caps(config.max_messages, config.max_segments, config.max_prompt_chars)


class SizedBody(Protocol):
    """A body whose prompt has a size (every body `read_body` reads)."""

    def prompt_size(self) -> PromptSize: ...


async def read_body(
    request: web.Request, gateway: Gateway, model: type[M]
) -> tuple[M, dict[str, Any], PromptSize]:
    """Parse and validate the JSON body and check its prompt's size (`sized_body`): 413
    over the limits, 400 naming the bad field. Costly bodies are judged off the event
    loop first (`prism_proxy.edge.bodies`). `model` must be a `SizedBody`."""
    raw = await read_raw(request, gateway)
    body, size = await sized_body(gateway, model, raw)
    return body, raw, size


async def sized_body(gateway: Gateway, model: type[M], raw: dict[str, Any]) -> tuple[M, PromptSize]:
    """`checked_body`, and the size of its prompt, checked (`check_prompt_size`): no body
    is served before its size is."""
    body = await checked_body(gateway, model, raw)
    size = cast(SizedBody, body).prompt_size()
    check_prompt_size(gateway.config, size)
    return body, size


async def read_raw(request: web.Request, gateway: Gateway) -> dict[str, Any]:
    """The JSON object of the body, within the byte limit and the list caps, with no
    refused field (`check_refused`); not yet validated."""
    config = gateway.config
    limit = config.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    try:
        data = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(limit) from None
    try:
        raw = await gateway.parser.parse(data)
        if not isinstance(raw, dict):
            raise BodyError(400, "body: expected a JSON object")
        check_counts(raw, body_caps(config))
    except BodyError as exc:
        raise ApiError(exc.status, exc.message, param=exc.param) from None
    check_refused(raw)
    return raw


async def checked_body(gateway: Gateway, model: type[M], raw: dict[str, Any]) -> M:
    """`raw` validated by `model`, then checked against the served model: its token
    ids, `top_k`, prompt logprobs (`check_served`) and grammars (`check_grammars`)."""
    try:
        body = model.model_validate(raw)
    except ValidationError as exc:
        param, message = describe_validation_error(exc)
        raise ApiError(400, message, param=param) from None
    checked = cast(CheckedBody, body)
    check_served(gateway.tokenizer_guard, checked)
    await check_grammars(gateway.grammars, checked)
    return body


def check_refused(raw: dict[str, Any]) -> None:
    """400 naming the first field PRISM does not serve (`sglang_fields.REFUSED`), in the
    body or its `sampling_params`."""
    places: list[tuple[str, Any]] = [("", raw)]
    params = raw.get("sampling_params")
    if isinstance(params, dict):
        places.append(("sampling_params.", params))
    elif isinstance(params, list):
        places.extend((f"sampling_params.{i}.", p) for i, p in enumerate(params))
    for prefix, fields in places:
        if not isinstance(fields, dict):
            continue
        for name, value in fields.items():  # set: present, not null, not false
            if name in REFUSED and value is not None and value is not False:
                message = f"{prefix}{name}: not accepted: {REFUSED[name]}"
                raise ApiError(400, message, param=prefix + name)


def check_ids(ids: Sequence[int], vocab_size: int, param: str) -> None:
    """Token ids the served model can embed: 0 <= id < vocab size, else 400 naming the
    first one outside (an id outside kills the engine). min/max run at C speed: a
    million ids cost ~20 ms; the index is looked for only when one is outside."""
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        index, token = next((i, t) for i, t in enumerate(ids) if not 0 <= t < vocab_size)
        raise ApiError(
            400,
            f"{param}.{index}: token id {token} is outside the vocabulary [0, {vocab_size})",
            param=f"{param}.{index}",
        )


def _unknown_vocabulary(refusal: str) -> None:
    """The proxy's tokenizer is not the engine's: the engine's vocabulary size is not
    known, so token ids (an id outside kills the engine) cannot be let through."""
    raise ApiError(
        503,
        f"{refusal}; token ids cannot be checked against the engine's vocabulary",
        kind="service_unavailable",
    )


def check_served(guard: TokenizerGuard, body: CheckedBody) -> None:
    """What types cannot say: every token id within the served vocabulary, `top_k`
    within it, and prompt logprobs within `MAX_PROMPT_LOGPROB_ENTRIES`."""
    vocab_size = guard.vocab_size
    try:
        for param, ids in body.token_ids():
            if vocab_size is None:
                _unknown_vocabulary(guard.refusal())
            check_ids(ids, vocab_size, param)
    except ValueError as exc:  # a logit_bias key that is no token id
        raise ApiError(400, str(exc), param="logit_bias") from None
    for param, top_k in body.top_ks():
        if vocab_size is None:
            _unknown_vocabulary(guard.refusal())
        if top_k > vocab_size:
            message = f"{param}: must be -1 or at most the vocabulary size {vocab_size}"
            raise ApiError(400, message, param=param)
    entries = body.prompt_logprob_entries()
    if entries > MAX_PROMPT_LOGPROB_ENTRIES:
        raise ApiError(
            400,
            f"logprobs: {entries} prompt positions x logprobs exceed the limit of "
            f"{MAX_PROMPT_LOGPROB_ENTRIES}",
            param="logprobs",
        )


# Grammars at least this long are checked in a worker thread.
OFFLOAD_GRAMMAR_CHARS = 4096


async def check_grammars(gate: GrammarGate, body: CheckedBody) -> None:
    """400 naming the first grammar (`ebnf`, `regex`, `structural_tag`) the deployment's
    `grammars` policy does not let through (`api.grammars.gate.GrammarGate`)."""
    for param, kind, text in body.grammars():
        found, reason = gate.known(kind, text)
        if not found:
            if len(text) >= OFFLOAD_GRAMMAR_CHARS:
                reason = await asyncio.to_thread(gate.reason, kind, text)
            else:
                reason = gate.reason(kind, text)
        if reason is not None:
            raise ApiError(400, f"{param}: not accepted: {reason}", param=param)


def check_prompt_size(config: ProxyConfig, size: PromptSize) -> None:
    """413 above `max_prompt_chars` (every path, the forwarded one included)."""
    limit = config.max_prompt_chars
    if size.chars > limit:
        raise ApiError(
            413,
            f"prompt: {size.chars} characters (token ids count one each) exceed the "
            f"limit of {limit}",
            param="prompt",
        )


def engine_size(gateway: Gateway) -> EngineSize:
    backend = gateway.admission.pacing.backend
    return EngineSize(backend.kv_pool_tokens, backend.context_tokens)


class DecodeShare:
    """A request's decode checked and held within its client's share for the block
    (`edge.limits`): 400 over `max_decode_tokens` or, for a non-streamed answer,
    `max_answer_bytes`; 429 with Retry-After beyond `max_client_decode_tokens`."""

    __slots__ = ("_client", "_reservations", "_tokens", "ask")

    def __init__(
        self, request: web.Request, gateway: Gateway, client: str, ask: DecodeAsk, *, stream: bool
    ) -> None:
        config = gateway.config
        engine = engine_size(gateway)
        self._reservations = gateway.reservations
        self._client = client
        self.ask = ask
        try:
            check_decode(ask, request_limit(config.max_decode_tokens, engine), engine)
            if not stream:
                check_answer(ask, config.max_answer_bytes, engine)
        except LimitError as exc:
            raise ApiError(exc.status, exc.message, param=exc.param) from None
        self._tokens = reserved_tokens(ask, engine)
        limit = client_limit(config.max_client_decode_tokens, engine)
        if not self._reservations.hold(self._client, self._tokens, limit):
            request[REFUSED_BY] = "max_client_decode_tokens"
            raise ApiError(
                429,
                f"this client's requests in flight already hold its share of forced or "
                f"multiplied decode (max_client_decode_tokens: {limit})",
                kind="rate_limit_exceeded",
                headers={"Retry-After": str(config.retry_after_s)},
            )

    async def __aenter__(self) -> DecodeShare:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._reservations.release(self._client, self._tokens)
