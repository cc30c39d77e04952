"""DART's control RPC (SPEC §4), identical in the SGLang plugin and the simulator.

    POST /prism/priorities  {epoch, table: {segment_id: score}, protect}
                            200 accepted | 409 stale epoch | 400 malformed | 401
    POST /prism/retain      {retain: {segment_id: [score, ttl_s(, tokens)]},
                            release: [segment_id], discard: [segment_id]}
                            200 | 400 malformed | 401 (R_t: see dart/core.py)
    POST /prism/reset       forget the table and R_t (DART orders like LRU until the
                            next push)
    GET  /prism/stats       JSON stats
    GET  /prism/residency?generation=G&since=V   (both optional)
                            {generation, version, full, resident: [seg], gone: [seg]}:
                            the segments changed after V if G is this DART instance
                            and V still answerable, else the full resident set;
                            400 when `since` is not a non-negative integer
    GET  /prism/health      {"status": "ok"} (no auth: it reveals nothing)
    GET  /prism/metrics     Prometheus text: prism:dart_evicted_tokens_total{class},
                            prism:dart_protected_tokens, prism:dart_protect_cap_tokens,
                            prism:dart_anchors_resident,
                            prism:dart_priority_epoch, prism:dart_segments_resident,
                            prism:dart_residency_version,
                            prism:dart_over_cap_evicted_tokens_total,
                            prism:dart_late_retentions_total,
                            prism:dart_host_demoted_tokens_total (with HiCache)

Every route but health needs `Authorization: Bearer <token>`. The handlers never touch
the tree: an accepted update is queued in the core's inbox (staleness is decided at
once) and the tree's owner applies it between tree operations; residency is read from
the core's `ResidencyLog` under its own lock. In SGLang the app runs on its own event
loop in a daemon thread of the scheduler process (`ControlThread`); the simulator
serves it on its own loop (`start_control_site`).
"""

from __future__ import annotations

import asyncio
import hmac
import re
import threading
from collections.abc import Awaitable, Callable, Iterator

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import ValidationError

from backend_plugin.config import ControlConfig
from backend_plugin.dart.core import DartCore
from backend_plugin.dart.keys import EvictionClass
from backend_plugin.dart.priority import PriorityUpdate, StaleEpochError
from prism_wire import (
    RPC_PRIORITIES,
    RPC_RESET,
    RPC_RESIDENCY,
    RPC_RETAIN,
    PriorityBody,
    Retention,
)

CORE_KEY = web.AppKey("prism_dart_core", DartCore)
INLINE_KEY = web.AppKey("prism_apply_inline", bool)
TOKEN_KEY = web.AppKey("prism_control_token", str)
REGISTRY_KEY = web.AppKey("prism_metrics_registry", CollectorRegistry)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, **extra: object) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = request.app[TOKEN_KEY]
    if token and request.path != "/prism/health":
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), token.encode()
        ):
            return _error(401, "missing or wrong bearer token")
    return await handler(request)


async def _priorities(request: web.Request) -> web.Response:
    try:
        # orjson: strict JSON, nesting <= 1024 (no RecursionError on "[[[[...").
        body = PriorityBody.model_validate(orjson.loads(await request.read()))
    except (ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
        return _error(400, "malformed priority update", detail=str(exc)[:2000])
    core = request.app[CORE_KEY]
    try:
        core.inbox.submit(PriorityUpdate(body.epoch, body.table, body.protect))
    except StaleEpochError as exc:
        return _error(409, "stale epoch", epoch=exc.epoch, current_epoch=exc.current)
    if request.app[INLINE_KEY]:
        core.apply_pending()
    return web.json_response({"accepted": True, "epoch": body.epoch})


async def _retain(request: web.Request) -> web.Response:
    try:
        retention = Retention.from_json(await request.read())
    except ValueError as exc:  # ValidationError and JSONDecodeError are ValueErrors
        return _error(400, "malformed retention update", detail=str(exc)[:2000])
    core = request.app[CORE_KEY]
    core.inbox.submit_retain(retention)
    if request.app[INLINE_KEY]:
        core.apply_pending()
    return web.json_response({"accepted": True})


async def _reset(request: web.Request) -> web.Response:
    request.app[CORE_KEY].inbox.submit_reset()
    if request.app[INLINE_KEY]:
        request.app[CORE_KEY].apply_pending()
    return web.json_response({"reset": True})


async def _stats(request: web.Request) -> web.Response:
    core = request.app[CORE_KEY]
    payload = core.stats().as_dict()
    payload["accepted_epoch"] = core.inbox.accepted_epoch
    return web.json_response(payload)


_SINCE = re.compile(r"[0-9]{1,19}")  # bounded: versions are far below 10^19


async def _residency(request: web.Request) -> web.Response:
    query = request.query
    raw = query.get("since")
    if raw is not None and _SINCE.fullmatch(raw) is None:
        return _error(400, "since must be a non-negative integer", since=raw[:100])
    since = int(raw) if raw is not None else None
    report = request.app[CORE_KEY].residency_summary(query.get("generation"), since)
    return web.Response(body=orjson.dumps(report.as_dict()), content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


class DartCollector(Collector):
    """Reads the core's stats at scrape time."""

    def __init__(self, core: DartCore) -> None:
        self.core = core

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self.core.stats()
        evicted = CounterMetricFamily(
            "prism:dart_evicted_tokens", "Tokens evicted by DART, by class", labels=["class"]
        )
        for cls in EvictionClass:
            evicted.add_metric([cls.value], stats.evicted_tokens.get(cls.value, 0))
        yield evicted
        yield GaugeMetricFamily(
            "prism:dart_protected_tokens",
            "Resident tokens of the protected segments F_t",
            value=stats.protected_tokens,
        )
        yield GaugeMetricFamily(
            "prism:dart_protect_cap_tokens",
            "Most resident tokens F_t may hold: protect_fraction x KV pool (-1: no bound)",
            value=-1 if stats.protect_cap_tokens is None else stats.protect_cap_tokens,
        )
        yield GaugeMetricFamily(
            "prism:dart_anchors_resident", "Resident anchor nodes", value=stats.anchors_resident
        )
        yield GaugeMetricFamily(
            "prism:dart_priority_epoch",
            "Epoch of the applied priority table (-1: none)",
            value=-1 if stats.epoch is None else stats.epoch,
        )
        yield GaugeMetricFamily(
            "prism:dart_segments_resident",
            "Reusable segments with resident tokens (system prompt excluded)",
            value=stats.segments_resident,
        )
        yield GaugeMetricFamily(
            "prism:dart_residency_version",
            "Residency changes recorded by this DART instance",
            value=stats.residency_version,
        )
        yield CounterMetricFamily(
            "prism:dart_over_cap_evicted_tokens",
            "Tokens evicted of owners with a live retention entry that R_t's cap left out",
            value=stats.over_cap_evicted_tokens,
        )
        yield CounterMetricFamily(
            "prism:dart_late_retentions",
            "Retention entries that arrived when none of the owner's tokens were resident",
            value=stats.late_retentions,
        )
        if stats.host_demoted_tokens is not None:
            yield CounterMetricFamily(
                "prism:dart_host_demoted_tokens",
                "Evicted tokens whose KV went to the host tier (HiCache) instead of being freed",
                value=stats.host_demoted_tokens,
            )


def create_control_app(
    core: DartCore, token: str | None, *, apply_inline: bool = False
) -> web.Application:
    """Wire the routes; `token=None` means open (the caller checked it may be).

    `apply_inline`: apply accepted updates at once. Only for a tree driven from the
    same event loop between its (synchronous) steps, as in the simulator.
    """
    app = web.Application(middlewares=[_auth], client_max_size=4 * 1024 * 1024)
    app[CORE_KEY] = core
    app[INLINE_KEY] = apply_inline
    app[TOKEN_KEY] = token or ""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(DartCollector(core))
    app[REGISTRY_KEY] = registry
    app.router.add_post(RPC_PRIORITIES, _priorities)
    app.router.add_post(RPC_RETAIN, _retain)
    app.router.add_post(RPC_RESET, _reset)
    app.router.add_get("/prism/stats", _stats)
    app.router.add_get(RPC_RESIDENCY, _residency)
    app.router.add_get("/prism/health", _health)
    app.router.add_get("/prism/metrics", _metrics)
    return app


async def start_control_site(
    core: DartCore, config: ControlConfig, *, port: int | None = None, apply_inline: bool = False
) -> tuple[web.AppRunner, int]:
    """Serve the RPC on the running loop; returns the runner (clean it up) and the port."""
    config.check_auth()
    app = create_control_app(core, config.token, apply_inline=apply_inline)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port if port is None else port).start()
    return runner, int(runner.addresses[0][1])


class ControlThread:
    """The RPC on its own event loop in a daemon thread (SGLang's scheduler process)."""

    def __init__(self, core: DartCore, config: ControlConfig) -> None:
        config.check_auth()
        self.core = core
        self.config = config
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, name="prism-control-rpc", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self, port: int | None = None, timeout_s: float = 10.0) -> int:
        """Start and wait until bound; returns the port. Raises if binding failed."""
        self._requested_port = port
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("control RPC did not start")
        if self._error is not None:
            raise RuntimeError(f"control RPC failed to start: {self._error}") from self._error
        assert self.port is not None
        return self.port

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner, self.port = self._loop.run_until_complete(
                start_control_site(self.core, self.config, port=self._requested_port)
            )
        except BaseException as exc:
            self._error = exc
            self._loop.close()
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
