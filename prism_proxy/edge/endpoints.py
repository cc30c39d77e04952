"""The routes of the token-path endpoints, and the proxy's own `/health` and `/metrics`.

`/v1/chat/completions` (`edge.chat`), `/v1/completions` (`edge.completions`) and
`/generate` (`edge.generate`) each parse their body (`intake`), build the request's token
job (hints, documents found in its text, or the turns of a chat; `edge.prompt_origin`),
and send it on the token path or, for what only the engine serves, through (`relay`).

Every accepted request ends in exactly one response: errors raised anywhere become
`ApiError` and one JSON error body (`errors.error_middleware`).
"""

from __future__ import annotations

from aiohttp import web

from prism_proxy.config import ProxyConfig
from prism_proxy.edge.chat import chat_completions
from prism_proxy.edge.completions import completions
from prism_proxy.edge.errors import LANE, json_answer
from prism_proxy.edge.gateway import Gateway, with_gateway
from prism_proxy.edge.generate import generate


async def health(request: web.Request, gateway: Gateway) -> web.Response:
    """Liveness of the proxy itself (200 while it serves); the body reports the rest."""
    admission = gateway.admission
    return json_answer(
        {
            "status": "ok",
            "backend_up": bool(gateway.backend.up),
            "queue_depth": admission.queue_depth,
            "inflight": admission.inflight,
            "policy": gateway.config.policy,
        }
    )


async def metrics(request: web.Request, gateway: Gateway) -> web.Response:
    body, content_type = gateway.metrics.render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response


LANE_HEADER = "x-prism-lane"


async def lane_header(request: web.Request, response: web.StreamResponse) -> None:
    """Tell the client which lane released its request (`hot`, `cold`, `passthrough`),
    so load generators can report per-lane numbers; nothing when it never got one."""
    lane = request.get(LANE)
    if lane is not None and lane != "none":
        response.headers[LANE_HEADER] = lane


def add_routes(app: web.Application, config: ProxyConfig) -> None:
    app.router.add_post("/v1/chat/completions", with_gateway(chat_completions))
    app.router.add_post("/v1/completions", with_gateway(completions))
    app.router.add_post("/generate", with_gateway(generate))
    app.router.add_get("/health", with_gateway(health))
    if config.metrics_listen is None:  # else on the admin listener only
        app.router.add_get("/metrics", with_gateway(metrics))
    app.on_response_prepare.append(lane_header)
