"""What following a request costs the proxy per request (`edge.tracing`), in process.

    python -m bench.tracing_cost [--requests 20000]

Runs the hooks one request goes through (arrival, queued, released, first token, token
counts, the engine's headers, the end) on a mocked request, for each setting: tracing
off and no access log (the floor every request pays: its id), the text and JSON access
logs (to a handler that drops the line), OpenTelemetry's API with no provider (no-op
spans), and the SDK with a span processor that drops the spans. Prints microseconds of
CPU per request; no thresholds.
"""

from __future__ import annotations

import argparse
import logging
import time

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from prism_proxy.edge import tracing
from prism_proxy.edge.errors import LANE
from prism_proxy.edge.tracing import TRACE, TRACING, Tracing

HEADERS = {
    "x-request-id": "req-42",
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
}


def per_request_us(access: str, mode: str, requests: int) -> float:
    app = web.Application()
    app[TRACING] = Tracing(access, mode)
    request = make_mocked_request("POST", "/v1/chat/completions", headers=HEADERS, app=app)
    started = time.process_time()
    for _ in range(requests):
        trace = app[TRACING].arrive(request)
        request[TRACE] = trace
        request[LANE] = "hot"
        tracing.queued(request)
        tracing.released(request, "hot", 0.001)
        tracing.engine_headers(request)
        tracing.first_token(request)
        tracing.tokens(request, 100, 8)
        app[TRACING].end(request, trace, 200)
    return (time.process_time() - started) / requests * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args(argv)
    access = logging.getLogger("prism_proxy.access")
    access.addHandler(logging.NullHandler())
    access.propagate = False
    access.setLevel(logging.INFO)
    print(f"tracing off, no access log:   {per_request_us('off', 'off', args.requests):6.1f} µs")
    print(f"text access log:              {per_request_us('text', 'off', args.requests):6.1f} µs")
    print(f"json access log:              {per_request_us('json', 'off', args.requests):6.1f} µs")
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        print("OpenTelemetry not installed: no span numbers")
        return
    print(f"OpenTelemetry API, no provider: {per_request_us('off', 'auto', args.requests):4.1f} µs")
    trace.set_tracer_provider(TracerProvider())  # spans made and ended, exported nowhere
    print(f"OpenTelemetry SDK spans:      {per_request_us('off', 'auto', args.requests):6.1f} µs")


if __name__ == "__main__":
    main()
