"""Typed application keys: the long-lived resources the handlers use (aiohttp `AppKey`)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from prism_proxy.admission.driver import AdmissionController
from prism_proxy.admission.sessions import SessionKeeper
from prism_proxy.api.grammars.gate import GrammarGate
from prism_proxy.backend.client import BackendClient
from prism_proxy.backend.control import ControlClient
from prism_proxy.backend.tokenizer_guard import TokenizerGuard
from prism_proxy.config import ProxyConfig
from prism_proxy.edge.account_limits import AccountUsage
from prism_proxy.edge.bodies import JsonParser
from prism_proxy.edge.grammar_ledger import GrammarLedger
from prism_proxy.edge.keys import KeyTable
from prism_proxy.edge.limits import ClientReservations
from prism_proxy.edge.pieces import PieceSender
from prism_proxy.metrics import ProxyMetrics
from prism_proxy.prompts.conversation import RenderingCheck
from prism_proxy.prompts.evidence import BlockEvidence
from prism_proxy.prompts.serializer import Serializer
from prism_proxy.prompts.sharing import OwnPrefixes, SharedPrefixes
from prism_proxy.prompts.tool_results import ToolResults
from prism_tokens.tokenizer import Tokenizer

CONFIG = web.AppKey("config", ProxyConfig)
METRICS = web.AppKey("metrics", ProxyMetrics)
BACKEND = web.AppKey("backend", BackendClient)
TOKENIZER = web.AppKey("tokenizer", Tokenizer)
# whether the tokenizer is the engine's: the token path is shut while it is not
TOKENIZER_GUARD = web.AppKey("tokenizer_guard", TokenizerGuard)
SERIALIZER = web.AppKey("serializer", Serializer)
CONTROLS = web.AppKey("controls", list[ControlClient])  # one per DART control RPC
ADMISSION = web.AppKey("admission", AdmissionController)
PIECES = web.AppKey("pieces", PieceSender)  # long prompts' prefill in pieces
PARSER = web.AppKey("parser", JsonParser)
SESSIONS = web.AppKey("sessions", SessionKeeper)  # set only with `sessions` on
EVIDENCE = web.AppKey("evidence", BlockEvidence)  # which blank-line blocks are documents
TOOL_RESULTS = web.AppKey("tool_results", ToolResults)  # the order tool results were served in
GRAMMARS = web.AppKey("grammars", GrammarGate)  # which grammars may reach the engine
RESERVATIONS = web.AppKey("reservations", ClientReservations)  # per-client decode shares
SHARING = web.AppKey("sharing", SharedPrefixes)  # which cached prefixes clients may see
RENDERING = web.AppKey("rendering", RenderingCheck)  # the token path against the engine's rendering
OWN = web.AppKey("own", OwnPrefixes)  # what each client sent, for its own reuse
STRUCTURED = web.AppKey("structured", GrammarLedger)  # each client's new grammars
# set when no request carrying the grammar (new to the engine) is in flight any more
COMPILED = web.AppKey("compiled", dict[bytes, asyncio.Event])
KEYS = web.AppKey("keys", KeyTable)  # accepted client API keys; set only with keys on
USAGE = web.AppKey("usage", AccountUsage)  # what each account holds and used (its limits)
