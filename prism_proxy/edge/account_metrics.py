"""What each account asks and gets, as metrics (issue 36; docs/keys.md, "Metrics per
account"): its finished requests by status (a 429 by the limit that refused it), the
tokens of its answers, and (read at scrape time) its requests in flight and queued.

The `account` label must stay bounded: Prometheus keeps every series it ever saw.

* With API keys: the key's account name (bounded by the key file), and
  `(unauthenticated)` for the requests refused 401 (no accepted key, so no account;
  parentheses are never in a key's name, so it cannot be one).
* Without keys: `addr`, one value for every client. Client addresses are unbounded (a
  scan, a NAT pool, IPv6 privacy addresses), and a top-N would need a bounded sketch
  whose ranks change between scrapes, so a series would start and stop under the
  operator. Who, among the addresses, asks what is in the access log (`client`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from prism_proxy.edge.accounts import ACCOUNT
from prism_proxy.edge.errors import ENDPOINT, REFUSED_BY, handle_counted
from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.edge.openai_format import TokenUsage
from prism_proxy.metrics import AccountHoldings, ProxyMetrics

KEYLESS = "addr"
UNAUTHENTICATED = "(unauthenticated)"
NO_LIMIT = "none"  # the `limit` of every answer but a 429


def account_label(request: web.Request, keys_on: bool) -> str:
    """The `account` label of a request (module docstring)."""
    if not keys_on:
        return KEYLESS  # no account is ever set: skip the lookup (a miss raises inside)
    account = request.get(ACCOUNT)
    return UNAUTHENTICATED if account is None else account.name


def count_tokens(
    request: web.Request, metrics: ProxyMetrics, keys_on: bool, usage: TokenUsage
) -> None:
    """The tokens of a request's answer, on its account."""
    account = account_label(request, keys_on)
    metrics.child(metrics.account_tokens, account, "prompt").inc(usage.prompt_tokens)
    metrics.child(metrics.account_tokens, account, "completion").inc(usage.completion_tokens)


def account_holdings(app: web.Application) -> AccountHoldings:
    """Each account's (in flight, queued) now: every key account (0 when idle, so its
    series stays), or all clients under `addr` without keys."""
    gateway = app.get(GATEWAY)
    if gateway is None:
        return {}  # not started yet
    holdings = gateway.usage.holdings()
    table = gateway.keys
    if table is None:
        inflight = queued = 0
        for _, open_requests, queued_requests in holdings:
            inflight += open_requests
            queued += queued_requests
        return {KEYLESS: (inflight, queued)}
    found = dict.fromkeys(table.accounts, (0, 0))
    for account, open_requests, queued_requests in holdings:
        found[account] = (open_requests, queued_requests)
    return found


def account_metrics_middleware(metrics: ProxyMetrics, keys_on: bool) -> Middleware:
    """The middleware that counts each request of the generating endpoints (those that
    name their `ENDPOINT`, as `prism:requests` does) on its account once it is answered.
    It goes outside `error_middleware`, so it sees the status of every answer, errors
    included. Built once per app with what it needs (no lookups per request)."""
    requests = metrics.account_requests
    child = metrics.child

    @web.middleware
    async def count_per_account(request: web.Request, handler: Any) -> web.StreamResponse:
        def ended(status: int) -> None:
            if request.get(ENDPOINT) is None:  # set inside: by path, or by the handler
                return
            limit = request.get(REFUSED_BY, "other") if status == 429 else NO_LIMIT
            child(requests, account_label(request, keys_on), str(status), limit).inc()

        return await handle_counted(request, handler, ended)

    return count_per_account
