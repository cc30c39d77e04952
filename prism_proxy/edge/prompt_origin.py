"""Where a request's plan is made (`prompts.plan`) for the token-path endpoints: what
the plan depends on, gathered on the event loop (`plan_context`: the token path's
tokenizer check, the hint checked, the deployment's layouts and the `x-prism-extract`
header, the caller's evidence, the session's tool results), the plan made off it when
large and counted by origin (`make_plan`, `count_origin`); a plan for the engine's own
endpoint served (`forward`). `serve_one_prompt`: what `/v1/completions`
and `/generate` share, from the body read to the shares it holds while served.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from aiohttp import web

from prism_proxy.api.costs import DecodeAsk, PromptSize
from prism_proxy.api.hints import PrismHint
from prism_proxy.backend.errors import BackendError
from prism_proxy.edge.accounts import client_key
from prism_proxy.edge.admit import off_loop, prompt_error
from prism_proxy.edge.errors import ENDPOINT, ApiError, backend_failure
from prism_proxy.edge.gateway import Gateway
from prism_proxy.edge.intake import DecodeShare, read_body
from prism_proxy.edge.passthrough import passthrough
from prism_proxy.edge.structured import GrammarShare
from prism_proxy.metrics import ProxyMetrics
from prism_proxy.prompts.conversation import rendering_drift
from prism_proxy.prompts.jobs import PromptError
from prism_proxy.prompts.plan import Forward, Plan, PlanContext, TokenPathBody, hinted

EXTRACT_HEADER = "x-prism-extract"


def count_origin(
    request: web.Request, metrics: ProxyMetrics, outcome: str, layout: str = ""
) -> None:
    """Count a request by where its segments came from (`prism:extraction_total`)."""
    metrics.child(metrics.extraction, request[ENDPOINT], outcome, layout).inc()


async def plan_context(
    request: web.Request,
    gateway: Gateway,
    client: str,
    body: TokenPathBody,
    *,
    rendering: bool = False,
) -> PlanContext:
    """What this request's plan depends on (`prompts.plan.PlanContext`), made on the
    event loop: whether the proxy's tokenizer is the engine's (for the token path,
    `token_path_open`: 503 where the request cannot go as written); its hint checked
    (400 naming the field: lengths and ids, so a refused hint costs no worker thread's
    hop); the deployment's layouts (none when the request's `x-prism-extract` header
    is `off`; 400 for another value than on/off); the caller's own evidence (one
    client's arrangements never cut another's documents); the session's tool results
    when the policy reorders; and, for an endpoint whose chats are sampled
    (`rendering`) when this one is, the check that measures its rendering drift."""
    engine_only = body.passthrough_reason() is not None
    hint = None
    if engine_only:
        engine_tokenizer = gateway.tokenizer_guard.check.open
    else:
        engine_tokenizer = await token_path_open(gateway, body.prism is not None)
        if engine_tokenizer:
            try:
                hint = hinted(body)
            except PromptError as exc:
                raise prompt_error(exc) from None
    config = gateway.config
    layouts = tuple(config.extraction_layouts)
    opt = request.headers.get(EXTRACT_HEADER)
    if opt is not None:
        opt = opt.strip().lower()
        if opt not in ("on", "off"):
            raise ApiError(400, f"{EXTRACT_HEADER}: expected 'on' or 'off'", param=EXTRACT_HEADER)
        if opt == "off":
            layouts = ()
    sampled = rendering and engine_tokenizer and not engine_only and body.prism is None
    reorders = gateway.admission.core.policy.reorders
    return PlanContext(
        serializer=gateway.serializer,
        layouts=layouts,
        reorder=config.extraction_reorder,
        evidence=gateway.evidence.scoped(client),
        tool_results=gateway.tool_results if reorders else None,
        sessions=config.sessions,
        engine_tokenizer=engine_tokenizer,
        hint=hint,
        rendering=rendering_check(gateway) if sampled and gateway.rendering.sampled() else None,
    )


def rendering_check(
    gateway: Gateway,
) -> Callable[[Sequence[Mapping[str, Any]], Sequence[int]], None]:
    """The check a sampled chat's plan calls: how the proxy's rendering of its messages
    differs from the ids it sends (`rendering_drift`), counted in the metrics."""
    tokenizer, metrics = gateway.serializer.tokenizer, gateway.metrics

    def check(messages: Sequence[Mapping[str, Any]], ids: Sequence[int]) -> None:
        differs, tokens = rendering_drift(tokenizer, messages, ids)
        metrics.child(metrics.rendering_checks, "differs" if differs else "same").inc()
        metrics.rendering_drift.observe(abs(tokens))

    return check


async def token_path_open(gateway: Gateway, hinted: bool) -> bool:
    """Whether a request may take the token path: the proxy's tokenizer is the engine's
    (checked again first when the engine may have changed, `TokenizerGuard`). When it
    is not: False with `tokenizer_mismatch=forward` (the request goes to the engine's
    own endpoint as written), else 503 naming the tokenizer. A hinted request needs the
    proxy's tokenizer whatever the mode: 503."""
    guard = gateway.tokenizer_guard
    try:
        if await guard.token_path():
            return True
    except BackendError as exc:
        raise backend_failure(exc) from None
    if guard.forward and not hinted:
        return False
    raise ApiError(503, guard.refusal(), kind="service_unavailable")


async def make_plan(
    request: web.Request, gateway: Gateway, size: PromptSize, work: Callable[[], Plan]
) -> Plan:
    """A request's plan (`work`: the endpoint's function of `prompts.plan`), made off
    the event loop when the prompt is large (400 for a prompt the proxy cannot serve),
    counted by its origin."""
    try:
        plan = await off_loop(size, work)
    except PromptError as exc:
        raise prompt_error(exc) from None
    count_origin(request, gateway.metrics, plan.origin, plan.layout)
    return plan


async def forward(
    request: web.Request, gateway: Gateway, client: str, plan: Forward, group: str = ""
) -> web.StreamResponse:
    """A request for the engine's own endpoint, served (`passthrough`)."""
    return await passthrough(
        request,
        gateway,
        client,
        plan.path,
        plan.body,
        set_rid=plan.set_rid,
        job=plan.job,
        group=group,
    )


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
    body, raw, size = await read_body(request, gateway, model)
    client = client_key(request)
    async with (
        DecodeShare(request, gateway, client, body.decode_ask(), stream=body.stream),
        GrammarShare(request, gateway, client, body, raw),
    ):
        return await serve(request, gateway, client, body, raw, size)
