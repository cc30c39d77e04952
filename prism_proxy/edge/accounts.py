"""Who a request comes from: its account, for what a client may use and earn on its own
(per-key limits, the fair share of admission, agent-session retention in
`admission.credit`, per-client decode reservations, prefix isolation).

With API keys (`api_keys_file`, `PRISM_API_KEYS`; `edge.keys`), `account_middleware`
refuses a request that presents no accepted key with an OpenAI-style 401 on every
path but `OPEN_PATHS`, and the account is the key's name. Then, keys or not, it counts
each POST (the generating endpoints) in flight for its account from its headers to its
answer, refused with 429 over the account's in-flight or tokens-per-minute limit before
its body is read (`edge.account_limits`). Without keys the proxy tells
clients apart only by their peer address (aiohttp's `request.remote`: behind a
reverse proxy, the reverse proxy's).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from aiohttp import web

from prism_proxy.config import ConfigError, ProxyConfig
from prism_proxy.edge.account_limits import Limits, Refusal
from prism_proxy.edge.errors import ENDPOINT, REFUSED_BY, ApiError
from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.edge.keys import Account, KeyFileError, KeyTable, parse_env_keys, parse_key_file
from prism_proxy.edge.keys import presented_key as _presented_key

ACCOUNT = web.RequestKey("account", Account)
# Paths served without a key: the liveness and readiness probes orchestrators call,
# and /metrics (which belongs on the admin listener, `metrics_listen`, when the client
# port is exposed).
OPEN_PATHS = frozenset({"/health", "/livez", "/readyz", "/metrics"})
# The endpoint label a request refused here is counted under in `prism:requests` (the
# handlers set it themselves for the requests they serve).
ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/generate": "generate",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
    "/v1/tokenize": "tokenize",
    "/v1/detokenize": "detokenize",
}
INVALID_KEY = (
    "Incorrect API key provided: send a key this proxy accepts as "
    "'Authorization: Bearer <key>' (or 'x-api-key: <key>')"
)


def load_keys(config: ProxyConfig) -> KeyTable | None:
    """The accepted keys (None: keys are off). A key file that is set but empty
    accepts no key at all (fail closed)."""
    if config.api_keys_file is None and config.api_keys is None:
        return None
    entries = []
    try:
        if config.api_keys_file is not None:
            path = Path(config.api_keys_file)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"api_keys_file: cannot read {path}: {exc.strerror}") from None
            entries.extend(parse_key_file(text, f"api_keys_file {path}"))
        if config.api_keys is not None:
            entries.extend(parse_env_keys(config.api_keys))
        return KeyTable(entries)
    except KeyFileError as exc:
        raise ConfigError(str(exc)) from None


def client_key(request: web.Request) -> str:
    """The account a request's client is counted under: its key's account name with
    keys on, else its peer address ("" unknown)."""
    account = request.get(ACCOUNT)
    if account is not None:
        return account.name
    return request.remote or ""


def connection_key(peername: object) -> str:
    """The account a connection is counted under before any request could name one
    (`edge.connections`): its peer address, as `request.remote` gives it ("" for a
    Unix socket)."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return ""


def limits_of(request: web.Request, config: ProxyConfig) -> Limits:
    """The per-account limits in effect for `request` (its key's own, else the
    deployment's defaults)."""
    account = request.get(ACCOUNT)
    own = account.limits if account is not None else None

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    if own is None:
        return Limits(config.key_max_inflight, config.key_max_queued, config.key_tokens_per_minute)
    return Limits(
        pick(own.max_inflight, config.key_max_inflight),
        pick(own.max_queued, config.key_max_queued),
        pick(own.tokens_per_minute, config.key_tokens_per_minute),
    )


def refused(request: web.Request, refusal: Refusal) -> ApiError:
    """The 429 of a request over one of its account's limits (named for the metrics)."""
    request[REFUSED_BY] = refusal.limit
    return ApiError(
        429,
        refusal.message,
        kind="rate_limit_exceeded",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(refusal.retry_after_s)},
    )


def _count_refusal(request: web.Request) -> None:
    endpoint = ENDPOINTS.get(request.path)
    if endpoint is not None:
        request[ENDPOINT] = endpoint


@web.middleware
async def account_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """With keys on: 401 (`invalid_api_key`) unless the request presents an accepted
    key; the key's account is kept on the request for `client_key`. A POST counts in
    flight for its account until its answer is written (429 over its limits)."""
    if request.path in OPEN_PATHS:
        return await handler(request)
    gateway = request.app[GATEWAY]
    table = gateway.keys
    if table is not None:
        headers = request.headers
        key = _presented_key(headers.get("Authorization"), headers.get("x-api-key"))
        account = table.lookup(key) if key is not None else None
        if account is None:
            _count_refusal(request)
            raise ApiError(
                401,
                INVALID_KEY,
                kind="invalid_request_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": 'Bearer realm="prism"'},
            )
        request[ACCOUNT] = account
    if request.method != "POST":
        return await handler(request)
    usage = gateway.usage
    name = client_key(request)
    config = gateway.config
    refusal = usage.open(name, limits_of(request, config), time.monotonic(), config.retry_after_s)
    if refusal is not None:
        _count_refusal(request)
        raise refused(request, refusal)
    try:
        return await handler(request)
    finally:
        usage.close(name, time.monotonic())
