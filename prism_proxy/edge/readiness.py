"""Liveness and readiness, for orchestrators and load balancers.

    GET /livez    200 while the proxy's event loop serves (nothing else is asked)
    GET /health   the same, with the backend's state in the body (kept as it was)
    GET /readyz   200 when a request sent now can be served: the engine answered its
                  latest probe or exchange, the proxy's tokenizer was checked against
                  the engine running now, and the proxy is not draining; else 503,
                  with the reasons

How fast it follows the engine: besides the health probe (`health_interval_s`, the
engine's `/server_info`), `app.ready_ctx` asks the engine's cheap `/ready` every
`ready_interval_s` (1 s), and any failed exchange on any path marks the engine down at
once (`BackendClient`). When the engine comes back, its server info is read and the
tokenizer checked again before /readyz says 200. On shutdown the proxy drains:
/readyz answers 503 at once, for `drain_delay_s` while new requests are still served,
then the listener closes (`RunningProxy.stop`).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from prism_proxy.backend.tokenizer_guard import TokenizerCheck
from prism_proxy.edge.errors import json_answer
from prism_proxy.edge.gateway import Gateway, with_gateway


@dataclass
class Readiness:
    """What only the proxy knows of its readiness (the rest is read from the backend
    client and the tokenizer guard)."""

    draining: bool = False


READINESS = web.AppKey("readiness", Readiness)


def not_ready(
    backend_up: bool | None,
    downs: int,
    check: TokenizerCheck,
    *,
    forward: bool,
    draining: bool,
) -> list[str]:
    """Why the proxy is not ready (empty: ready). `backend_up` None: no exchange with
    the engine yet (starting). A tokenizer mismatch with `forward` is ready: requests
    go to the engine's own endpoints."""
    reasons = []
    if draining:
        reasons.append("draining: the proxy is shutting down")
    if backend_up is None:
        reasons.append("starting: the engine has not answered yet")
    elif not backend_up:
        reasons.append("the engine is down")
    elif check.stale(downs):
        reasons.append("the tokenizer is not checked against the engine running now")
    elif not (check.open or forward):
        reasons.append("the proxy's tokenizer does not match the engine's")
    return reasons


async def livez(request: web.Request) -> web.Response:
    return json_answer({"status": "ok"})


async def readyz(request: web.Request, gateway: Gateway) -> web.Response:
    backend = gateway.backend
    guard = gateway.tokenizer_guard
    reasons = not_ready(
        backend.up,
        backend.downs,
        guard.check,
        forward=guard.forward,
        draining=request.app[READINESS].draining,
    )
    if reasons:
        return json_answer({"status": "not ready", "reasons": reasons}, status=503)
    return json_answer({"status": "ready"})


def add_readiness_routes(app: web.Application) -> None:
    app[READINESS] = Readiness()
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", with_gateway(readyz))
