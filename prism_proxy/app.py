"""`create_app(config)`: wiring only. At startup the proxy's objects are opened as one
`Gateway` (`open_gateway`; started in order, stopped in reverse: JSON parser → backend
session → tokenizer checked against the engine's → control RPC senders → the rest,
assembled by `edge.gateway.assemble`, with the QAS loop and DART residency pollers
running), then the backend health probe and the readiness probe (`edge.readiness`),
each a cleanup context of its own.

Serving (`start_proxy`, `serve`): the proxy's own HTTP/1.x server (`edge.server`),
with its connection limits, and when `metrics_listen` is set an admin listener for
/metrics. Shutdown (`RunningProxy.stop()`): aiohttp stops listening, waits up to
`shutdown_timeout_s` for in-flight handlers (the QAS loop still runs, so queued
requests are released and streams finish), then the contexts below stop. Before all
that, /readyz turns 503 and, for `drain_delay_s`, new requests are still served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from prism_proxy.admission.core import BackendLimits
from prism_proxy.backend.client import BackendClient
from prism_proxy.backend.control import ControlClient
from prism_proxy.backend.tokenizer_guard import TokenizerGuard
from prism_proxy.config import ProxyConfig, parse_listen
from prism_proxy.edge.account_metrics import account_holdings, account_metrics_middleware
from prism_proxy.edge.accounts import account_middleware, load_keys
from prism_proxy.edge.bodies import JsonParser
from prism_proxy.edge.connection_policy import ConnectionPolicy, fd_budget
from prism_proxy.edge.endpoints import add_routes
from prism_proxy.edge.endpoints import metrics as metrics_handler
from prism_proxy.edge.errors import error_middleware
from prism_proxy.edge.forwarded import add_routes as add_forwarded_routes
from prism_proxy.edge.gateway import GATEWAY, Gateway, Started, assemble, with_gateway
from prism_proxy.edge.keys import KeyTable
from prism_proxy.edge.probes import add_probe_routes
from prism_proxy.edge.readiness import READINESS, add_readiness_routes
from prism_proxy.edge.responses_api import add_routes as add_responses_routes
from prism_proxy.edge.runner import ProxyRunner, listen
from prism_proxy.edge.tracing import add_tracing, install_log_context, tracing_middleware
from prism_proxy.metrics import AccountCollector, CacheCollector, CacheStats, ProxyMetrics
from prism_tokens.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def cache_stats(app: web.Application) -> dict[str, CacheStats]:
    """Entries, bytes and capacity (hits and misses where counted) of every cache the
    proxy keeps, once its resources are up (for `CacheCollector`)."""
    gateway = app.get(GATEWAY)
    if gateway is None:
        return {}
    stats: dict[str, CacheStats] = dict(gateway.serializer.cache_stats())
    chat_pieces = gateway.tokenizer.chat_pieces
    if chat_pieces is not None:
        stats["chat_pieces"] = chat_pieces.info()
    stats["evidence"] = gateway.evidence.stats()
    stats["tool_results"] = gateway.tool_results.stats()
    stats["sharing"] = gateway.sharing.stats()
    stats["own_prefixes"] = gateway.own.stats()
    view = gateway.admission.core.policy.cache_view
    if view is not None:
        stats["view"] = view.stats()
    return stats


async def start_resources(
    config: ProxyConfig, metrics: ProxyMetrics, stack: contextlib.AsyncExitStack
) -> Started:
    """Start, in order, what the proxy's objects need from I/O, each with its cleanup
    pushed on `stack` (run in reverse): the JSON parser and its worker process for
    costly bodies (`edge.intake`), the engine's client, the tokenizer checked against
    the engine's (`backend.tokenizer_guard`: a mismatch stops the start, RuntimeError,
    unless `tokenizer_mismatch` is `forward`), one sender per DART control RPC (several
    when the proxy fronts a gateway and N replicas: each replica's DART gets every
    table)."""
    parser = JsonParser()
    stack.push_async_callback(asyncio.to_thread, parser.close)
    session = BackendClient.create_session()
    stack.push_async_callback(session.close)
    backend = BackendClient(
        session,
        config.backend_url,
        metrics=metrics,
        timeout_s=config.backend_timeout_s,
        connect_timeout_s=config.connect_timeout_s,
        api_key=config.engine_api_key,
    )
    stack.push_async_callback(backend.drain)

    def load(spec: str) -> Tokenizer:
        return load_tokenizer(spec, chat_cache_bytes=config.chat_cache_bytes)

    guard = await TokenizerGuard.start(
        config.tokenizer,
        backend,
        forward=config.tokenizer_mismatch == "forward",
        metrics=metrics,
        load=load,
        timeout_s=config.connect_timeout_s + 10.0,
    )
    stack.push_async_callback(guard.close)
    tokenizer = guard.tokenizer
    log.info("tokenizer %s (vocab %d)", tokenizer.name, tokenizer.vocab_size)
    controls = [
        ControlClient(
            session, url, token=config.control_token, protect=config.protect, metrics=metrics
        )
        for url in config.control_urls
    ]
    for i, client in enumerate(controls):
        task = asyncio.create_task(client.run(), name=f"prism-control-rpc-{i}")
        stack.push_async_callback(_cancel, task)
    return Started(parser, backend, guard, controls)


@contextlib.asynccontextmanager
async def open_gateway(
    config: ProxyConfig, metrics: ProxyMetrics, keys: KeyTable | None
) -> AsyncIterator[Gateway]:
    """The proxy's objects (`edge.gateway.assemble`) on the resources startup opens,
    with the QAS loop and DART's residency pollers running; closed in reverse."""
    async with contextlib.AsyncExitStack() as stack:
        started = await start_resources(config, metrics, stack)
        gateway = assemble(config, metrics, keys, started)
        tasks = [asyncio.create_task(gateway.admission.run(), name="prism-qas-loop")]
        for i, poller in enumerate(gateway.pollers):
            tasks.append(asyncio.create_task(poller.run(), name=f"prism-residency-{i}"))
        for task in tasks:
            stack.push_async_callback(_cancel, task)
        yield gateway


async def probe_backend(gateway: Gateway) -> None:
    """One health probe; the backend's server info also sets the pacing limits."""
    info = await gateway.backend.probe()
    if info is not None:
        # the engine may have restarted (another startup time) or come back: check the
        # tokenizer again before the token path sends ids
        await gateway.tokenizer_guard.refresh(info)
        admission = gateway.admission
        admission.learn_backend(BackendLimits.from_server_info(info))
        log.debug(
            "pacing: B=%d, backstop %d", admission.pacing.prefill_batch, admission.pacing.backstop
        )


async def health_ctx(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY]
    await probe_backend(gateway)
    interval_s = gateway.config.health_interval_s
    if interval_s <= 0:
        yield
        return

    async def probe_forever() -> None:
        while True:
            await asyncio.sleep(interval_s)
            await probe_backend(gateway)

    task = asyncio.create_task(probe_forever(), name="prism-backend-probe")
    yield
    await _cancel(task)


READY_TIMEOUT_S = 2.0  # a /ready answer slower than this counts as down


async def ready_ctx(app: web.Application) -> AsyncIterator[None]:
    """The cheap readiness probe behind /readyz (`edge.readiness`): the engine's
    `/ready` every `ready_interval_s`; when the engine is back after being down (or the
    tokenizer check is stale), the full probe at once (server info, tokenizer check).
    A backend without `/ready` (a gateway) gets the full probe instead."""
    gateway = app[GATEWAY]
    interval_s = gateway.config.ready_interval_s
    if interval_s <= 0:
        yield
        return
    backend = gateway.backend
    guard = gateway.tokenizer_guard

    async def probe_forever() -> None:
        while True:
            await asyncio.sleep(interval_s)
            was_up = backend.up
            answered = await backend.ready(READY_TIMEOUT_S)
            if answered is None or (
                answered and (was_up is not True or guard.check.stale(backend.downs))
            ):
                await probe_backend(gateway)

    task = asyncio.create_task(probe_forever(), name="prism-ready-probe")
    yield
    await _cancel(task)


async def log_drain(app: web.Application) -> None:
    """On shutdown: say what is being drained (aiohttp then waits for the handlers)."""
    gateway = app[GATEWAY]
    admission = gateway.admission
    log.info(
        "shutting down: no new connections; draining %d in flight and %d queued (up to %.0f s)",
        admission.inflight,
        admission.queue_depth,
        gateway.config.shutdown_timeout_s,
    )


async def log_stopped(app: web.Application) -> None:
    log.info("stopped")


def create_app(config: ProxyConfig) -> web.Application:
    """The proxy's aiohttp application (no I/O until it starts)."""
    # Bodies up to the limit are read; larger ones get 413 (checked in read_body too).
    keys = load_keys(config)  # ConfigError on a bad key file: the proxy does not start
    metrics = ProxyMetrics.create()
    app = web.Application(
        middlewares=[
            tracing_middleware,
            account_metrics_middleware(metrics, keys is not None),
            error_middleware,
            account_middleware,
        ],
        client_max_size=config.max_body_bytes,
    )
    add_tracing(app, config.access_log, config.tracing)
    metrics.registry.register(CacheCollector(lambda: cache_stats(app)))
    metrics.registry.register(AccountCollector(lambda: account_holdings(app)))

    async def gateway_ctx(app: web.Application) -> AsyncIterator[None]:
        async with open_gateway(config, metrics, keys) as gateway:
            app[GATEWAY] = gateway
            yield

    app.on_shutdown.append(log_drain)
    app.cleanup_ctx.extend([gateway_ctx, health_ctx, ready_ctx])
    app.on_cleanup.append(log_stopped)
    add_routes(app, config)
    add_responses_routes(app)
    add_forwarded_routes(app)
    add_probe_routes(app)
    add_readiness_routes(app)
    return app


def create_admin_app(app: web.Application) -> web.Application:
    """The admin listener's application (`metrics_listen`): /metrics of `app`."""
    admin = web.Application(middlewares=[error_middleware])
    admin[GATEWAY] = app[GATEWAY]
    admin.router.add_get("/metrics", with_gateway(metrics_handler))
    return admin


@dataclass
class RunningProxy:
    """A started proxy: its client listener's URL, and the admin listener's when
    `metrics_listen` is set."""

    runner: web.AppRunner
    app: web.Application
    url: str
    admin: web.AppRunner | None = None
    admin_url: str | None = None

    async def stop(self) -> None:
        """Turn /readyz 503 and keep serving `drain_delay_s` (a load balancer stops
        sending meanwhile), then stop listening, drain the client connections, stop
        (admin last)."""
        try:
            self.app[READINESS].draining = True
            delay_s = self.app[GATEWAY].config.drain_delay_s
            if delay_s > 0:
                log.info("draining: /readyz answers 503; still serving for %.1f s", delay_s)
                await asyncio.sleep(delay_s)
            await self.runner.cleanup()
        finally:
            if self.admin is not None:
                await self.admin.cleanup()


async def start_proxy(config: ProxyConfig) -> RunningProxy:
    """Start the app on `config.host:config.port` (port 0: any free port), and the admin
    listener on `config.metrics_listen`."""
    admin_address = parse_listen(config.metrics_listen) if config.metrics_listen else None
    policy = ConnectionPolicy.from_config(config, fd_budget(config.max_connections))
    install_log_context()
    # the proxy's own access log (`edge.tracing`) replaces aiohttp's debug-level one
    debug_log = config.log_level == "debug" and config.access_log == "off"
    access_log = logging.getLogger("aiohttp.access") if debug_log else None
    app = create_app(config)
    runner = ProxyRunner(
        app, policy, shutdown_timeout=config.shutdown_timeout_s, access_log=access_log
    )
    try:
        await runner.setup()
    except BaseException:  # a resource failed to start: stop the ones that did
        await runner.cleanup()
        raise
    proxy = RunningProxy(runner, app, "")
    try:
        proxy.url = await listen(runner, config.host, config.port)
        if admin_address is not None:
            proxy.admin = ProxyRunner(create_admin_app(app), policy, shutdown_timeout=1.0)
            await proxy.admin.setup()
            proxy.admin_url = await listen(proxy.admin, *admin_address)
    except BaseException:
        await proxy.stop()
        raise
    return proxy


async def serve(config: ProxyConfig) -> None:
    """`prism-proxy serve`: run until SIGTERM or SIGINT, then drain for up to
    `shutdown_timeout_s` and stop; a second signal stops at once."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    main = asyncio.current_task()

    def on_signal() -> None:
        if stopping.is_set() and main is not None:
            main.cancel()
        stopping.set()

    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, on_signal)
    try:
        proxy = await start_proxy(config)
        try:
            where = f"; /metrics on {proxy.admin_url}" if proxy.admin_url else ""
            log.info("listening on %s%s", proxy.url, where)
            await stopping.wait()
        finally:
            await proxy.stop()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
