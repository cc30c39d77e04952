"""Where a request's prompt comes from, for the token-path endpoints: its hints
(`hinted_build`), documents found in its text (`DocumentFinder`, as the deployment and
the `x-prism-extract` header allow), or the engine's own endpoint when the token path is
closed to it (`token_path_open`); each request counted by origin (`count_origin`).
`serve_one_prompt`: what `/v1/completions` and `/generate` share, from the body read to
the shares it holds while served.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from aiohttp import web

from prism_proxy.api.costs import DecodeAsk, PromptSize
from prism_proxy.api.hints import PrismHint
from prism_proxy.api.segments import SegmentedPrompt
from prism_proxy.backend.errors import BackendError
from prism_proxy.edge.accounts import client_key
from prism_proxy.edge.admit import prompt_error
from prism_proxy.edge.errors import ENDPOINT, ApiError, backend_failure
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.intake import DecodeShare, check_prompt_size, read_body
from prism_proxy.edge.passthrough import passthrough
from prism_proxy.edge.structured import GrammarShare
from prism_proxy.metrics import ProxyMetrics
from prism_proxy.prompts.jobs import (
    PromptError,
    TokenJob,
    find_documents,
    hinted_prompt,
    segmented_job,
)
from prism_proxy.prompts.serializer import Serializer

EXTRACT_HEADER = "x-prism-extract"


def count_origin(
    request: web.Request, metrics: ProxyMetrics, outcome: str, layout: str = ""
) -> None:
    """Count a request by where its segments came from (`prism:extraction_total`)."""
    metrics.child(metrics.extraction, request[ENDPOINT], outcome, layout).inc()


class DocumentFinder:
    """Documents in a request without hints (`prompts.find_documents`), as the
    deployment's settings and the request's `x-prism-extract` header allow, and the
    request counted by where its job's segments came from. `find` may run in a worker
    thread."""

    __slots__ = ("evidence", "hinted", "layouts", "metrics", "reorder")

    def __init__(self, request: web.Request, gateway: Gateway, client: str, hinted: bool) -> None:
        config = gateway.config
        self.metrics = gateway.metrics
        # one client's arrangements never cut another's documents
        self.evidence = gateway.evidence.scoped(client)
        self.reorder = config.extraction_reorder
        self.layouts = config.extraction_layouts
        opt = request.headers.get(EXTRACT_HEADER)
        if opt is not None:
            opt = opt.strip().lower()
            if opt not in ("on", "off"):
                raise ApiError(
                    400, f"{EXTRACT_HEADER}: expected 'on' or 'off'", param=EXTRACT_HEADER
                )
            if opt == "off":
                self.layouts = ()
        self.hinted = hinted

    @property
    def searching(self) -> bool:
        """Whether this request may be segmented (no hints, extraction on for it)."""
        return not self.hinted and bool(self.layouts)

    def find(self, text: str, system: str | None) -> SegmentedPrompt | None:
        return find_documents(
            text, system=system, layouts=self.layouts, reorder=self.reorder, evidence=self.evidence
        )

    def count(self, request: web.Request, job: TokenJob) -> None:
        """Count the request by its job's `origin`; a job the proxy did not look into
        is `hinted`, or else `none` (nothing found) or `off` (extraction off for it)."""
        origin = job.origin or ("hinted" if self.hinted else ("none" if self.layouts else "off"))
        count_origin(request, self.metrics, origin, job.layout)


async def token_path_open(request: web.Request, gateway: Gateway, hinted: bool) -> bool:
    """Whether a request may take the token path: the proxy's tokenizer is the engine's
    (checked again first when the engine may have changed, `TokenizerGuard`). When it
    is not: False with `tokenizer_mismatch=forward` (the caller sends the request to the
    engine's own endpoint), else 503 naming the tokenizer. A hinted request needs the
    proxy's tokenizer whatever the mode: 503."""
    guard = gateway.tokenizer_guard
    try:
        if await guard.token_path():
            return True
    except BackendError as exc:
        raise backend_failure(exc) from None
    if guard.forward and not hinted:
        count_origin(request, gateway.metrics, "forwarded")
        return False
    raise ApiError(503, guard.refusal(), kind="service_unavailable")


def hinted_build(
    serializer: Serializer, hint: PrismHint, *, system: str | None, suffix: str | None, chat: bool
) -> Callable[[], TokenJob]:
    """A hinted request's prompt, checked here on the event loop (400 naming the field),
    and what builds its token job (serialized as a chat: the hint's `chat`, else the
    endpoint's default `chat`). The checks are lengths and ids, O(segments), so a
    refused hint (a 1 MB segment over `max_piece_chars`) costs no worker thread's hop;
    only the build of an accepted one (tokenization) leaves the loop (`make_job`)."""
    try:
        prompt = hinted_prompt(hint, system=system, suffix=suffix)
    except PromptError as exc:
        raise prompt_error(exc) from None
    serialized_as_chat = chat if hint.chat is None else hint.chat
    return lambda: segmented_job(serializer, prompt, chat=serialized_as_chat)


class OnePromptBody(Protocol):
    """What `serve_one_prompt` asks of a body (`CompletionRequest`, `GenerateRequest`:
    pydantic models)."""

    stream: bool
    prism: PrismHint | None

    def prompt_size(self) -> PromptSize: ...

    def decode_ask(self) -> DecodeAsk: ...

    def passthrough_reason(self) -> str | None: ...

    def forwarded(self, raw: dict[str, Any]) -> dict[str, Any]: ...


B = TypeVar("B", bound=OnePromptBody)
Serve = Callable[
    [web.Request, Gateway, str, B, dict[str, Any], PromptSize], Awaitable[web.StreamResponse]
]


async def serve_one_prompt(
    request: web.Request, gateway: Gateway, endpoint: str, model: type[B], serve: Serve[B]
) -> web.StreamResponse:
    """A one-prompt endpoint: its body read and checked (`intake`), its prompt's size
    checked, then `serve(request, gateway, client, body, raw, size)` within the
    request's decode and grammar shares (`DecodeShare`, `GrammarShare`); `client`: the
    caller's `accounts.client_key`, computed once here."""
    request[ENDPOINT] = endpoint
    body, raw = await read_body(request, gateway, model)
    size = body.prompt_size()
    check_prompt_size(gateway.config, size)
    client = client_key(request)
    async with (
        DecodeShare(request, gateway, client, body.decode_ask(), stream=body.stream),
        GrammarShare(request, gateway, client, body, raw),
    ):
        return await serve(request, gateway, client, body, raw, size)


async def engine_instead(
    request: web.Request,
    gateway: Gateway,
    client: str,
    body: OnePromptBody,
    raw: dict[str, Any],
    path: str,
    *,
    set_rid: bool,
    group: str = "",
) -> web.StreamResponse | None:
    """The answer of the engine's own endpoint `path` when a one-prompt request goes
    there: what only the engine serves (with a rid of the proxy's when `set_rid`), or
    any request while the token path is closed to it (`token_path_open`). None: the
    request takes the token path."""
    if body.passthrough_reason() is not None:
        count_origin(request, gateway.metrics, "forwarded")
        forwarded = body.forwarded(raw)
        return await passthrough(
            request, gateway, client, path, forwarded, set_rid=set_rid, group=group
        )
    if not await token_path_open(request, gateway, body.prism is not None):
        # one prompt (batches went the first way), as the client wrote it
        forwarded = body.forwarded(raw)
        return await passthrough(
            request, gateway, client, path, forwarded, set_rid=True, group=group
        )
    return None
