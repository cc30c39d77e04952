"""What the per-account metrics cost the proxy per request (`edge.account_metrics`), in
process.

    python -m bench.account_metrics_cost [--requests 50000]

Awaits a handler that returns a prepared answer on a mocked chat request, bare and
through the middleware that counts the request on its account (without keys: the one
`addr` label; with keys: the key's account name), plus the tokens of its answer. Prints
microseconds of CPU per request; no thresholds.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from prism_proxy.edge.account_metrics import account_metrics_middleware, count_tokens
from prism_proxy.edge.accounts import ACCOUNT
from prism_proxy.edge.errors import ENDPOINT
from prism_proxy.edge.keys import Account
from prism_proxy.edge.openai_format import TokenUsage
from prism_proxy.metrics import ProxyMetrics

USAGE = TokenUsage(prompt_tokens=812, completion_tokens=24, cached_tokens=0)


async def per_request_us(line: str, requests: int) -> float:
    metrics = ProxyMetrics.create()
    app = web.Application()
    request = make_mocked_request("POST", "/v1/chat/completions", app=app)
    request[ENDPOINT] = "chat"
    if line == "keys":
        request[ACCOUNT] = Account("team-a")
    answer = web.Response()

    async def handler(_: web.Request) -> web.StreamResponse:
        if line != "bare":
            count_tokens(request, metrics, line == "keys", USAGE)
        return answer

    call: Any = handler
    if line != "bare":
        call = account_metrics_middleware(metrics, keys_on=line == "keys")
    started = time.process_time()
    for _ in range(requests):
        if line == "bare":
            await handler(request)
        else:
            await call(request, handler)
    return (time.process_time() - started) / requests * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=50_000)
    args = parser.parse_args(argv)
    for line, label in (
        ("bare", "bare handler"),
        ("addr", "counted, no keys (addr)"),
        ("keys", "counted, with keys"),
    ):
        print(f"{label + ':':30} {asyncio.run(per_request_us(line, args.requests)):6.2f} µs")


if __name__ == "__main__":
    main()
