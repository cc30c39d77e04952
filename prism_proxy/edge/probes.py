"""What a gateway or an SGLang client probes on a worker, answered by the proxy.

A gateway in front of several proxies (sgl-model-gateway `smg`, sglang-router) asks
each worker for its server and model info and its load. The proxy answers from its
backend, so the gateway sees the engine it fronts, and adds its own queue, so the
gateway sees the real load: requests waiting in QAS are waiting requests of that
replica, which the engine cannot report.

    GET /server_info, /get_server_info    the backend's (by either name), plus "prism":
                                          the proxy's state and the settings it runs
                                          with ("settings")
    GET /model_info, /get_model_info      the backend's (by either name)
    GET /v1/models                        the backend's
    GET /v1/loads, /loads                 the backend's /v1/loads (SGLang 0.5.23) with the
                                          proxy's queue added to rank 0's waiting
                                          requests, plus "prism"; when the backend has
                                          no /v1/loads, one rank from the proxy's counts
    GET /health_generate                  the backend's (a real one-token generation)

Of the backend's answers only the fields of `prism_proxy.api.engine_info`'s allow-lists
pass: SGLang's info carries its API keys, address and paths, which no client may read.

Admin paths (`/flush_cache`, `/abort_request`, weights, LoRA) are not served: no client
of the proxy may change another client's requests or the cache.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from prism_proxy.api import engine_info
from prism_proxy.api.engine_info import published
from prism_proxy.backend.errors import BackendError
from prism_proxy.edge.errors import ApiError, backend_failure, json_answer
from prism_proxy.edge.gateway import Gateway, with_gateway
from prism_proxy.qas.residency import residency_source


def proxy_state(gateway: Gateway) -> dict[str, Any]:
    """The proxy's own load and settings, as `prism` in the probe answers."""
    admission, config = gateway.admission, gateway.config
    return {
        "policy": config.policy,
        "qas": config.qas_variant,
        "queue_depth": admission.queue_depth,
        "inflight": admission.inflight,
        "pending_prefill": admission.pending_prefill,
        "prefill_batch": admission.pacing.prefill_batch,
        "inflight_limit": admission.pacing.backstop,
        "backend_replicas": admission.pacing.replicas,
        "settings": proxy_settings(gateway),
    }


def proxy_settings(gateway: Gateway) -> dict[str, Any]:
    """The settings the proxy runs with, as in effect now: the QAS variant
    and its resolved parameters, pacing (B and the backstop, each fixed or automatic,
    with its current value), the round window, the residency source and the control
    RPC. A sweep stores them beside each run's results."""
    admission, config = gateway.admission, gateway.config
    pacing = admission.pacing
    return {
        "policy": config.policy,
        "qas_variant": config.qas_variant,
        "qas": asdict(config.qas),
        "prefill_batch": {
            "mode": "auto" if pacing.setting is None else "fixed",
            "value": pacing.prefill_batch,
        },
        "backstop": {
            "mode": "auto" if pacing.backstop_setting is None else "fixed",
            "value": pacing.backstop,
        },
        "window_ms": config.window_ms,
        "residency": residency_source(admission.core.policy),
        "residency_setting": config.residency,
        "control_rpc": bool(config.control_urls),
        "control_rpcs": len(config.control_urls),
        "protect": config.protect,
        "backend_replicas": pacing.replicas,
        "extraction": list(config.extraction_layouts),
        "max_queue": config.max_queue,
    }


def with_proxy_queue(loads: dict[str, Any], proxy: dict[str, Any]) -> dict[str, Any]:
    """`/v1/loads` with the proxy's queued requests counted as rank 0's waiting ones."""
    ranks = [dict(rank) for rank in loads.get("loads") or [] if isinstance(rank, dict)]
    if not ranks:
        ranks = [{"dp_rank": 0, "num_running_reqs": proxy["inflight"], "num_waiting_reqs": 0}]
    first, queued = ranks[0], proxy["queue_depth"]
    first["num_waiting_reqs"] = int(first.get("num_waiting_reqs") or 0) + queued
    queues = first.get("queues")
    if isinstance(queues, dict):
        first["queues"] = {**queues, "waiting": int(queues.get("waiting") or 0) + queued}
    return {**loads, "loads": ranks, "prism": proxy}


async def _backend_object(gateway: Gateway, path: str) -> dict[str, Any]:
    """The backend's JSON object at `path` (`server_info`, `model_info`: by either of
    SGLang's names, `BackendClient.get_info`)."""
    backend = gateway.backend
    try:
        if path.startswith("/"):
            answer = await backend.get_json(path)
        else:
            answer = await backend.get_info(path)
    except BackendError as exc:
        raise backend_failure(exc) from None
    if not isinstance(answer, dict):
        raise ApiError(502, f"backend sent a {path} answer that is not an object")
    return answer


async def server_info(request: web.Request, gateway: Gateway) -> web.Response:
    info = await _backend_object(gateway, "server_info")
    return json_answer({**published(info, engine_info.SERVER_INFO), "prism": proxy_state(gateway)})


async def model_info(request: web.Request, gateway: Gateway) -> web.Response:
    info = await _backend_object(gateway, "model_info")
    return json_answer(published(info, engine_info.MODEL_INFO))


async def models(request: web.Request, gateway: Gateway) -> web.Response:
    answer = await _backend_object(gateway, "/v1/models")
    return json_answer(published(answer, engine_info.MODELS))


async def loads(request: web.Request, gateway: Gateway) -> web.Response:
    query = urlencode([(k, v) for k, v in request.query.items() if k in engine_info.LOADS_QUERY])
    path = "/v1/loads" + (f"?{query}" if query else "")
    proxy = proxy_state(gateway)
    try:
        backend = await gateway.backend.get_json(path)
    except BackendError as exc:
        if exc.status != 404:
            raise backend_failure(exc) from None
        backend = {"timestamp": datetime.now(UTC).isoformat(), "loads": []}
    if not isinstance(backend, dict):
        raise ApiError(502, "backend sent a /v1/loads answer that is not an object")
    return json_answer(with_proxy_queue(published(backend, engine_info.LOADS), proxy))


async def health_generate(request: web.Request, gateway: Gateway) -> web.Response:
    try:
        await gateway.backend.get_ok("/health_generate")
    except BackendError as exc:
        raise backend_failure(exc) from None
    return web.Response(text="")


def add_probe_routes(app: web.Application) -> None:
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, with_gateway(server_info))
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, with_gateway(model_info))
    for path in ("/v1/loads", "/loads"):
        app.router.add_get(path, with_gateway(loads))
    app.router.add_get("/v1/models", with_gateway(models))
    app.router.add_get("/health_generate", with_gateway(health_generate))
