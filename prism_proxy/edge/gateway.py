"""`Gateway`: every long-lived object the edge's handlers use, in one typed object.

The app stores one `Gateway` under `GATEWAY` once its resources are up (`app.py`:
`open_gateway`); a handler takes it once (`request.app[GATEWAY]`) and hands it to what
it calls. `assemble` builds it from a `ProxyConfig` and the resources that startup must
create asynchronously (`Started`: the JSON parser's worker, the engine's client, the
tokenizer checked against the engine's, the control RPC senders).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from prism_proxy.admission.driver import AdmissionController, PushFn
from prism_proxy.admission.session_keeper import SendRetention, SessionKeeper
from prism_proxy.api.grammars.gate import GrammarGate
from prism_proxy.backend.client import BackendClient
from prism_proxy.backend.control import ControlClient
from prism_proxy.backend.residency_poller import ResidencyPoller
from prism_proxy.backend.tokenizer_guard import TokenizerGuard
from prism_proxy.config import ProxyConfig
from prism_proxy.edge.account_limits import AccountUsage
from prism_proxy.edge.bodies import JsonParser
from prism_proxy.edge.grammar_ledger import GrammarLedger
from prism_proxy.edge.keys import KeyTable, weight_of
from prism_proxy.edge.limits import ClientReservations
from prism_proxy.edge.pieces import PieceSender
from prism_proxy.metrics import ProxyMetrics
from prism_proxy.prompts.conversation import RenderingCheck
from prism_proxy.prompts.evidence import BlockEvidence
from prism_proxy.prompts.serializer import Serializer
from prism_proxy.prompts.sharing import OwnPrefixes, SharedPrefixes
from prism_proxy.prompts.tool_results import ToolResults
from prism_proxy.qas.policies import SchedulingPolicy
from prism_proxy.scheduling import admission_core, dart_resident_sets
from prism_tokens.tokenizer import Tokenizer
from prism_wire import Retention


@dataclass(frozen=True)
class Started:
    """What app startup creates asynchronously, in this order, before the rest."""

    parser: JsonParser  # with its worker process for costly bodies (`edge.intake`)
    backend: BackendClient
    tokenizer_guard: TokenizerGuard  # whether the tokenizer is the engine's
    controls: list[ControlClient]  # one per DART control RPC


@dataclass(frozen=True)
class Gateway:
    """The proxy's long-lived objects, as the edge uses them (one per app)."""

    config: ProxyConfig
    metrics: ProxyMetrics
    parser: JsonParser
    backend: BackendClient
    tokenizer: Tokenizer
    # whether the tokenizer is the engine's: the token path is shut while it is not
    tokenizer_guard: TokenizerGuard
    serializer: Serializer
    controls: list[ControlClient]  # one per DART control RPC
    admission: AdmissionController
    pieces: PieceSender  # long prompts' prefill in pieces
    pollers: list[ResidencyPoller]  # DART's resident sets, read for QAS (maybe none)
    sessions: SessionKeeper | None  # agent sessions; None with `sessions` off
    evidence: BlockEvidence  # which blank-line blocks are documents
    tool_results: ToolResults  # the order tool results were served in
    rendering: RenderingCheck  # the token path against the engine's rendering
    keys: KeyTable | None  # accepted client API keys; None with keys off
    usage: AccountUsage  # what each account holds and used (its limits)
    grammars: GrammarGate  # which grammars may reach the engine
    reservations: ClientReservations  # per-client decode shares
    structured: GrammarLedger  # each client's new grammars
    sharing: SharedPrefixes  # which cached prefixes clients may see
    own: OwnPrefixes  # what each client sent, for its own reuse
    # set when no request carrying the grammar (new to the engine) is in flight any more
    compiled: dict[bytes, asyncio.Event] = field(default_factory=dict)


GATEWAY = web.AppKey("gateway", Gateway)


def dart_residency(
    policy: SchedulingPolicy, config: ProxyConfig, clients: list[ControlClient]
) -> list[ResidencyPoller]:
    """DART's resident sets for QAS, when it reads them (`scheduling.dart_resident_sets`),
    each kept up to date by a poller of its replica's control RPC."""
    sets = dart_resident_sets(policy, config, len(clients))
    if not sets:  # QAS reads its own cache view
        return []
    return [ResidencyPoller(c, resident) for c, resident in zip(clients, sets, strict=True)]


def push_to_all(clients: list[ControlClient]) -> PushFn | None:
    """Each wave's priority table to every DART (None: no control RPC)."""
    if not clients:
        return None

    def push(table: dict[str, float]) -> None:
        for client in clients:
            client.push(table)

    return push


def retain_to_all(clients: list[ControlClient]) -> SendRetention | None:
    """The session table's retention to every DART (None: no control RPC)."""
    if not clients:
        return None

    def send(retention: Retention) -> None:
        for client in clients:
            client.retain(retention)

    return send


def assemble(
    config: ProxyConfig,
    metrics: ProxyMetrics,
    keys: KeyTable | None,
    started: Started,
) -> Gateway:
    """The one assembly of the proxy's objects from its settings: no I/O, nothing
    started (the QAS loop and the residency pollers are the caller's tasks)."""
    tokenizer = started.tokenizer_guard.tokenizer
    controls = started.controls
    core = admission_core(config, account_weight=weight_of(keys))
    pollers = dart_residency(core.policy, config, controls)
    admission = AdmissionController(core, metrics=metrics, on_wave=push_to_all(controls))
    sessions = None
    if config.sessions:
        sessions = keeper = SessionKeeper(config.session_params(), retain_to_all(controls))
        metrics.sessions_paused.set_function(lambda: keeper.table.paused)
        metrics.sessions_retained.set_function(lambda: keeper.table.ledger.live_grants)
    share_bytes = config.share_cache_bytes // 2
    return Gateway(
        config=config,
        metrics=metrics,
        parser=started.parser,
        backend=started.backend,
        tokenizer=tokenizer,
        tokenizer_guard=started.tokenizer_guard,
        serializer=Serializer(tokenizer, config.segment_cache_bytes, config.head_cache_bytes),
        controls=controls,
        admission=admission,
        pieces=PieceSender(admission, started.backend, metrics, config.prefill_piece_tokens),
        pollers=pollers,
        sessions=sessions,
        evidence=BlockEvidence(config.evidence_cache_bytes),
        tool_results=ToolResults(config.evidence_cache_bytes),
        rendering=RenderingCheck(config.rendering_check_every),
        keys=keys,
        usage=AccountUsage(),
        grammars=GrammarGate(config.grammars),
        reservations=ClientReservations(),
        structured=GrammarLedger(
            config.max_client_grammar_compiles, config.max_client_grammars_per_minute
        ),
        sharing=SharedPrefixes(config.share_min_clients, share_bytes),
        own=OwnPrefixes(share_bytes),
    )


GatewayHandler = Callable[[web.Request, Gateway], Awaitable[web.StreamResponse]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def with_gateway(handler: GatewayHandler) -> Handler:
    """`handler` as a route's handler: called with the app's gateway, taken once per
    request."""

    async def serve(request: web.Request) -> web.StreamResponse:
        return await handler(request, request.app[GATEWAY])

    return functools.update_wrapper(serve, handler)
