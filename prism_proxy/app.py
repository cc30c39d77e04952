"""`create_app(config)`: wiring only. Each long-lived resource has its own cleanup
context (started in order, stopped in reverse): JSON parser → backend session → tokenizer and
serializer → control RPC sender → QAS loop (and DART residency poller) → backend health
probe → readiness probe (`edge.readiness`).

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

from prism_proxy.admission.core import BackendLimits, PrefillPacing
from prism_proxy.admission.driver import AdmissionController, PushFn
from prism_proxy.admission.sessions import Push, RetainPush, SessionKeeper
from prism_proxy.api.grammars.gate import GrammarGate
from prism_proxy.backend.client import BackendClient
from prism_proxy.backend.control import ControlClient
from prism_proxy.backend.residency_poller import ResidencyPoller
from prism_proxy.backend.tokenizer_guard import TokenizerGuard
from prism_proxy.config import ProxyConfig, parse_listen
from prism_proxy.edge import state
from prism_proxy.edge.account_limits import AccountUsage
from prism_proxy.edge.account_metrics import account_holdings, account_metrics_middleware
from prism_proxy.edge.accounts import account_middleware, load_keys, weight_of
from prism_proxy.edge.bodies import JsonParser
from prism_proxy.edge.connection_policy import ConnectionPolicy, fd_budget
from prism_proxy.edge.endpoints import add_routes
from prism_proxy.edge.endpoints import metrics as metrics_handler
from prism_proxy.edge.errors import error_middleware
from prism_proxy.edge.forwarded import add_routes as add_forwarded_routes
from prism_proxy.edge.grammar_ledger import GrammarLedger
from prism_proxy.edge.limits import ClientReservations
from prism_proxy.edge.pieces import PieceSender
from prism_proxy.edge.probes import add_probe_routes
from prism_proxy.edge.readiness import READINESS, add_readiness_routes
from prism_proxy.edge.responses_api import add_routes as add_responses_routes
from prism_proxy.edge.runner import ProxyRunner, listen
from prism_proxy.edge.tracing import add_tracing, install_log_context, tracing_middleware
from prism_proxy.metrics import AccountCollector, CacheCollector, CacheStats, ProxyMetrics
from prism_proxy.prompts.conversation import RenderingCheck
from prism_proxy.prompts.evidence import BlockEvidence
from prism_proxy.prompts.serializer import Serializer
from prism_proxy.prompts.sharing import OwnPrefixes, SharedPrefixes
from prism_proxy.prompts.tool_results import ToolResults
from prism_proxy.qas.policies import SchedulingPolicy, make_policy
from prism_proxy.qas.prism import PrismPolicy
from prism_proxy.qas.residency import PendingResidency, ResidentSegments, UnionResidency
from prism_tokens.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def backend_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[state.CONFIG]
    session = BackendClient.create_session()
    app[state.BACKEND] = BackendClient(
        session,
        config.backend_url,
        metrics=app[state.METRICS],
        timeout_s=config.backend_timeout_s,
        connect_timeout_s=config.connect_timeout_s,
        api_key=config.engine_api_key,
    )
    yield
    await app[state.BACKEND].drain()
    await session.close()


async def parser_ctx(app: web.Application) -> AsyncIterator[None]:
    """The JSON parser and its worker process for costly bodies (`prism_proxy.edge.intake`)."""
    app[state.PARSER] = parser = JsonParser()
    yield
    await asyncio.to_thread(parser.close)


def cache_stats(app: web.Application) -> dict[str, CacheStats]:
    """Entries, bytes and capacity (hits and misses where counted) of every cache the
    proxy keeps, once its resources are up (for `CacheCollector`)."""
    stats: dict[str, CacheStats] = {}
    serializer = app.get(state.SERIALIZER)
    if serializer is not None:
        stats.update(serializer.cache_stats())
        chat_pieces = serializer.tokenizer.chat_pieces
        if chat_pieces is not None:
            stats["chat_pieces"] = chat_pieces.info()
    evidence = app.get(state.EVIDENCE)
    if evidence is not None:
        stats["evidence"] = evidence.stats()
    tool_results = app.get(state.TOOL_RESULTS)
    if tool_results is not None:
        stats["tool_results"] = tool_results.stats()
    sharing = app.get(state.SHARING)
    if sharing is not None:
        stats["sharing"] = sharing.stats()
        stats["own_prefixes"] = app[state.OWN].stats()
    admission = app.get(state.ADMISSION)
    view = admission.core.policy.cache_view if admission is not None else None
    if view is not None:
        stats["view"] = view.stats()
    return stats


async def tokenizer_ctx(app: web.Application) -> AsyncIterator[None]:
    """The tokenizer, checked against the engine's (`backend.tokenizer_guard`): a
    mismatch stops the start (RuntimeError) unless `tokenizer_mismatch` is `forward`."""
    config = app[state.CONFIG]

    def load(spec: str) -> Tokenizer:
        return load_tokenizer(spec, chat_cache_bytes=config.chat_cache_bytes)

    guard = await TokenizerGuard.start(
        config.tokenizer,
        app[state.BACKEND],
        forward=config.tokenizer_mismatch == "forward",
        metrics=app[state.METRICS],
        load=load,
        timeout_s=config.connect_timeout_s + 10.0,
    )
    tokenizer = guard.tokenizer
    app[state.TOKENIZER] = tokenizer
    app[state.TOKENIZER_GUARD] = guard
    app[state.SERIALIZER] = Serializer(
        tokenizer, config.segment_cache_bytes, config.head_cache_bytes
    )
    app[state.EVIDENCE] = BlockEvidence(config.evidence_cache_bytes)
    app[state.TOOL_RESULTS] = ToolResults(config.evidence_cache_bytes)
    app[state.RENDERING] = RenderingCheck(tokenizer, config.rendering_check_every)
    log.info("tokenizer %s (vocab %d)", tokenizer.name, tokenizer.vocab_size)
    yield
    await guard.close()


async def control_ctx(app: web.Application) -> AsyncIterator[None]:
    """One sender per DART control RPC (several when the proxy fronts a gateway and N
    replicas: each replica's DART gets every table)."""
    config = app[state.CONFIG]
    clients = [
        ControlClient(
            app[state.BACKEND].session,
            url,
            token=config.control_token,
            protect=config.protect,
            metrics=app[state.METRICS],
        )
        for url in config.control_urls
    ]
    app[state.CONTROLS] = clients
    tasks = [
        asyncio.create_task(client.run(), name=f"prism-control-rpc-{i}")
        for i, client in enumerate(clients)
    ]
    yield
    for task in tasks:
        await _cancel(task)


def push_to_all(clients: list[ControlClient]) -> PushFn | None:
    if not clients:
        return None

    def push(table: dict[str, float]) -> None:
        for client in clients:
            client.push(table)

    return push


def retain_to_all(clients: list[ControlClient]) -> RetainPush | None:
    if not clients:
        return None

    def push(retention: Push) -> None:
        for client in clients:
            client.retain(retention.retain, retention.release, retention.discard)

    return push


def dart_residency(
    policy: SchedulingPolicy, config: ProxyConfig, clients: list[ControlClient]
) -> list[ResidencyPoller]:
    """When prism weighs residency and may ask DART (`--set residency=auto|dart` with a
    control URL), it reads DART's resident sets (their union, with several replicas)
    instead of its own cache view, plus what it released that DART has not reported
    yet (`PendingResidency`)."""
    if not isinstance(policy, PrismPolicy) or config.qas.w_c <= 0:
        return []
    if not clients or config.residency == "view":
        return []
    sets = [ResidentSegments() for _ in clients]
    policy.residency = PendingResidency(sets[0] if len(sets) == 1 else UnionResidency(sets))
    return [ResidencyPoller(c, resident) for c, resident in zip(clients, sets, strict=True)]


async def admission_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[state.CONFIG]
    controls = app[state.CONTROLS]
    policy = make_policy(config.policy, config.qas)
    pollers = dart_residency(policy, config, controls)
    admission = AdmissionController(
        policy,
        pacing=PrefillPacing(config.prefill_batch, config.max_inflight, config.replicas),
        window_s=config.window_s,
        max_queue=config.max_queue,
        cold_deadline_s=config.qas.cold_deadline_s,
        metrics=app[state.METRICS],
        on_wave=push_to_all(controls),
        share_accounts=config.fair_share,
        account_weight=weight_of(app.get(state.KEYS)),
    )
    app[state.ADMISSION] = admission
    pieces = config.prefill_piece_tokens
    app[state.PIECES] = PieceSender(admission, app[state.BACKEND], app[state.METRICS], pieces)
    if config.sessions:
        keeper = SessionKeeper(config.session_params(), retain_to_all(controls))
        app[state.SESSIONS] = keeper
        app[state.METRICS].sessions_paused.set_function(lambda: keeper.table.paused)
        app[state.METRICS].sessions_retained.set_function(lambda: keeper.table.ledger.live_grants)
    tasks = [asyncio.create_task(admission.run(), name="prism-qas-loop")]
    for i, poller in enumerate(pollers):
        tasks.append(asyncio.create_task(poller.run(), name=f"prism-residency-{i}"))
    yield
    for task in tasks:
        await _cancel(task)


async def probe_backend(app: web.Application) -> None:
    """One health probe; the backend's server info also sets the pacing limits."""
    info = await app[state.BACKEND].probe()
    if info is not None:
        # the engine may have restarted (another startup time) or come back: check the
        # tokenizer again before the token path sends ids
        await app[state.TOKENIZER_GUARD].refresh(info)
        admission = app[state.ADMISSION]
        admission.learn_backend(BackendLimits.from_server_info(info))
        log.debug(
            "pacing: B=%d, backstop %d", admission.pacing.prefill_batch, admission.pacing.backstop
        )


async def health_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[state.CONFIG]
    await probe_backend(app)
    if config.health_interval_s <= 0:
        yield
        return

    async def probe_forever() -> None:
        while True:
            await asyncio.sleep(config.health_interval_s)
            await probe_backend(app)

    task = asyncio.create_task(probe_forever(), name="prism-backend-probe")
    yield
    await _cancel(task)


READY_TIMEOUT_S = 2.0  # a /ready answer slower than this counts as down


async def ready_ctx(app: web.Application) -> AsyncIterator[None]:
    """The cheap readiness probe behind /readyz (`edge.readiness`): the engine's
    `/ready` every `ready_interval_s`; when the engine is back after being down (or the
    tokenizer check is stale), the full probe at once (server info, tokenizer check).
    A backend without `/ready` (a gateway) gets the full probe instead."""
    interval_s = app[state.CONFIG].ready_interval_s
    if interval_s <= 0:
        yield
        return
    backend = app[state.BACKEND]
    guard = app[state.TOKENIZER_GUARD]

    async def probe_forever() -> None:
        while True:
            await asyncio.sleep(interval_s)
            was_up = backend.up
            answered = await backend.ready(READY_TIMEOUT_S)
            if answered is None or (
                answered and (was_up is not True or guard.check.stale(backend.downs))
            ):
                await probe_backend(app)

    task = asyncio.create_task(probe_forever(), name="prism-ready-probe")
    yield
    await _cancel(task)


async def log_drain(app: web.Application) -> None:
    """On shutdown: say what is being drained (aiohttp then waits for the handlers)."""
    admission = app[state.ADMISSION]
    log.info(
        "shutting down: no new connections; draining %d in flight and %d queued (up to %.0f s)",
        admission.inflight,
        admission.queue_depth,
        app[state.CONFIG].shutdown_timeout_s,
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
    app[state.CONFIG] = config
    add_tracing(app, config.access_log, config.tracing)
    if keys is not None:
        app[state.KEYS] = keys
    app[state.USAGE] = AccountUsage()
    app[state.METRICS] = metrics
    app[state.GRAMMARS] = GrammarGate(config.grammars)
    app[state.RESERVATIONS] = ClientReservations()
    app[state.STRUCTURED] = GrammarLedger(
        config.max_client_grammar_compiles, config.max_client_grammars_per_minute
    )
    app[state.COMPILED] = {}
    app[state.SHARING] = SharedPrefixes(config.share_min_clients, config.share_cache_bytes // 2)
    app[state.OWN] = OwnPrefixes(config.share_cache_bytes // 2)
    metrics.registry.register(CacheCollector(lambda: cache_stats(app)))
    metrics.registry.register(AccountCollector(lambda: account_holdings(app)))
    app.on_shutdown.append(log_drain)
    app.cleanup_ctx.extend(
        [parser_ctx, backend_ctx, tokenizer_ctx, control_ctx, admission_ctx, health_ctx, ready_ctx]
    )
    app.on_cleanup.append(log_stopped)
    add_routes(app)
    add_responses_routes(app)
    add_forwarded_routes(app)
    add_probe_routes(app)
    add_readiness_routes(app)
    return app


def create_admin_app(app: web.Application) -> web.Application:
    """The admin listener's application (`metrics_listen`): /metrics of `app`."""
    admin = web.Application(middlewares=[error_middleware])
    admin[state.CONFIG] = app[state.CONFIG]
    admin[state.METRICS] = app[state.METRICS]
    admin.router.add_get("/metrics", metrics_handler)
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
            delay_s = self.app[state.CONFIG].drain_delay_s
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
