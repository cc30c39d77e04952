"""The simulated engine's aiohttp app: SGLang 0.5.23's HTTP API over `SimEngine` (SPEC §7).

`create_app(config)` only wires routes; the engine loop is a `cleanup_ctx` resource that
starts with the app and is cancelled with it.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from prism_sim import embeddings_api, native_api, openai_api, tokenize_api
from prism_sim.engine import SimConfig, SimEngine
from prism_sim.http_common import ENGINE_KEY

# Paths SGLang serves without its API key, by prefix (probes and scrapes).
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def api_key_middleware(
    api_key: str,
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """SGLang's check of `--api-key`: `Authorization: Bearer <key>` on every path but
    `OPEN_PREFIXES`, else 401 `{"error": "Unauthorized"}` (its words)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and not request.path.startswith(OPEN_PREFIXES):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(
                token.encode(), api_key.encode()
            ):
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


def create_app(config: SimConfig, engine: SimEngine | None = None) -> web.Application:
    """Build the app; pass `engine` to reuse one built elsewhere (tests, DART)."""
    middlewares = [api_key_middleware(config.api_key)] if config.api_key else []
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
    app[ENGINE_KEY] = engine or SimEngine(config)

    async def engine_loop(app: web.Application) -> AsyncIterator[None]:
        engine = app[ENGINE_KEY]
        async with contextlib.AsyncExitStack() as stack:
            if engine.extension is not None:
                await stack.enter_async_context(engine.extension.lifecycle(engine))
            await stack.enter_async_context(engine.loop)
            yield

    app.cleanup_ctx.append(engine_loop)
    app.router.add_post("/generate", native_api.generate)
    app.router.add_post("/abort_request", native_api.abort_request)
    for method in ("GET", "POST"):
        app.router.add_route(method, "/flush_cache", native_api.flush_cache)
    app.router.add_get("/health", native_api.health)
    app.router.add_get("/ready", native_api.health)
    app.router.add_get("/health_generate", native_api.health_generate)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, native_api.model_info)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, native_api.server_info)
    app.router.add_get("/metrics", native_api.metrics)
    app.router.add_get("/v1/loads", native_api.loads)
    app.router.add_post("/v1/completions", openai_api.completions)
    app.router.add_post("/v1/chat/completions", openai_api.chat_completions)
    app.router.add_get("/v1/models", openai_api.models)
    tokenize_api.add_routes(app)
    app.router.add_post("/v1/embeddings", embeddings_api.embeddings)
    return app


async def start_site(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start serving `app` (a dropped client cancels its handler, which aborts it)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
