"""Following one request (`edge.tracing`): its `x-request-id` in and out (errors and
streams too), on its log records and on to the engine with the W3C trace context; the
access log's line; with OpenTelemetry's SDK (its in-memory exporter), one trace per
request with its admission wait, continuing the client's `traceparent`."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest
from aiohttp import web
from proxy_support import eventually, loopback_app, running_proxy, sim_server

from prism_proxy.edge.tracing import Tracing, request_id_of, trace_context_of

sim = pytest.fixture(scope="module")(sim_server)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
NEW_ID = re.compile(r"[0-9a-f]{32}")


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("req-42", True),
        ("0f6c2a7e-6a0b-4c55-9a43-1f0f4e2a9b11", True),
        ("tenant:a/b+c=d@e.f_g", True),
        ("x" * 128, True),
        ("x" * 129, False),  # too long
        ("two words", False),
        ('quote"', False),
        ("", False),
        (None, False),
    ],
)
def test_request_id_is_the_clients_when_safe(sent: str | None, kept: bool) -> None:
    got = request_id_of(sent)
    assert (got == sent) is kept
    if not kept:
        assert NEW_ID.fullmatch(got)


@pytest.mark.parametrize(
    ("traceparent", "tracestate", "forwarded"),
    [
        (TRACEPARENT, "vendor=1", {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}),
        (TRACEPARENT, None, {"traceparent": TRACEPARENT}),
        (TRACEPARENT, "x" * 513, {"traceparent": TRACEPARENT}),  # a tracestate too long
        (f"00-{'0' * 32}-{PARENT_ID}-01", "vendor=1", {}),  # an all-zero trace id
        (f"ff-{TRACE_ID}-{PARENT_ID}-01", None, {}),  # version ff is invalid
        (f"00-{TRACE_ID.upper()}-{PARENT_ID}-01", None, {}),  # not lowercase hex
        ("garbage", "vendor=1", {}),
        (None, "vendor=1", {}),  # a tracestate alone means nothing
    ],
)
def test_trace_context_is_forwarded_only_when_valid(
    traceparent: str | None, tracestate: str | None, forwarded: dict[str, str]
) -> None:
    assert trace_context_of(traceparent, tracestate) == forwarded


async def test_request_id_echoed_on_answers_errors_and_streams(sim) -> None:
    async with running_proxy(sim.url) as proxy, httpx.AsyncClient(timeout=30.0) as http:
        url = proxy.url + "/v1/chat/completions"
        answer = await http.post(url, json=CHAT, headers={"x-request-id": "mine-1"})
        assert answer.status_code == 200 and answer.headers["x-request-id"] == "mine-1"
        made = (await http.post(url, json=CHAT)).headers["x-request-id"]
        assert NEW_ID.fullmatch(made)
        refused = await http.post(url, json=CHAT, headers={"x-request-id": "not safe!"})
        assert refused.status_code == 200 and NEW_ID.fullmatch(refused.headers["x-request-id"])
        bad = await http.post(url, json={"model": "m"}, headers={"x-request-id": "bad-1"})
        assert bad.status_code == 400 and bad.headers["x-request-id"] == "bad-1"
        missing = await http.get(proxy.url + "/nowhere", headers={"x-request-id": "nf-1"})
        assert missing.status_code == 404 and missing.headers["x-request-id"] == "nf-1"
        stream = {**CHAT, "stream": True}
        async with http.stream("POST", url, json=stream, headers={"x-request-id": "s-1"}) as s:
            assert s.status_code == 200 and s.headers["x-request-id"] == "s-1"
            assert b"[DONE]" in b"".join([part async for part in s.aiter_bytes()])
    # the real openai client sees it too
    async with (
        running_proxy(sim.url) as proxy,
        openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client,
    ):
        raw = await client.chat.completions.with_raw_response.create(
            **CHAT, extra_headers={"x-request-id": "openai-1"}
        )
        assert raw.headers["x-request-id"] == "openai-1"
        assert raw.parse().choices[0].message.content


def _lower(path: str, request: web.Request) -> dict[str, str]:
    return {"path": path, **{name.lower(): value for name, value in request.headers.items()}}


def engine_recorder(seen: list[dict[str, str]]) -> web.Application:
    """A stub engine: `/generate` (the token path) and `/v1/chat/completions` (what is
    forwarded) record the headers they get and answer one token."""

    async def generate(request: web.Request) -> web.StreamResponse:
        seen.append(_lower("/generate", request))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"text": "x", "meta_info": {"finish_reason": {"type": "length"}}}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
        return response

    async def chat(request: web.Request) -> web.Response:
        seen.append(_lower("/v1/chat/completions", request))
        return web.json_response(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "x"},
                        "finish_reason": "length",
                    }
                ],
            }
        )

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.mark.parametrize("tracing", ["off", "auto"])
async def test_request_id_and_trace_context_reach_the_engine(tracing: str) -> None:
    """`auto` without a tracer provider (the API alone): the same as `off`."""
    seen: list[dict[str, str]] = []
    async with (
        loopback_app(engine_recorder(seen)) as url,
        running_proxy(url, tokenizer="builtin", tracing=tracing) as proxy,
        httpx.AsyncClient(timeout=30.0) as http,
    ):
        headers = {"x-request-id": "r-1", "traceparent": TRACEPARENT, "tracestate": "v=1"}
        answer = await http.post(proxy.url + "/v1/chat/completions", json=CHAT, headers=headers)
        assert answer.status_code == 200, answer.text
        # forwarded as it is (logprobs: the engine's own endpoint serves it)
        headers = {"x-request-id": "r-2", "traceparent": "not one"}
        forwarded = {**CHAT, "logprobs": True}
        answer = await http.post(
            proxy.url + "/v1/chat/completions", json=forwarded, headers=headers
        )
        assert answer.status_code == 200, answer.text
    token_path, passthrough = seen
    assert token_path["path"] == "/generate"
    assert token_path["x-request-id"] == "r-1"
    assert token_path["traceparent"] == TRACEPARENT and token_path["tracestate"] == "v=1"
    assert passthrough["path"] == "/v1/chat/completions"
    assert passthrough["x-request-id"] == "r-2"
    assert "traceparent" not in passthrough  # an invalid one is not passed on


async def test_json_access_log_line(sim, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="prism_proxy.access")
    async with (
        running_proxy(sim.url, access_log="json") as proxy,
        httpx.AsyncClient(timeout=30.0) as http,
    ):
        url = proxy.url + "/v1/chat/completions"
        answer = await http.post(url, json=CHAT, headers={"x-request-id": "log-1"})
        assert answer.status_code == 200
        bad = await http.post(url, json={"model": "m"})

        def lines() -> list[dict]:
            return [json.loads(r.getMessage()) for r in caplog.records if r.name.endswith("access")]

        await eventually(lambda: len(lines()) == 2)
    served, refused = lines()
    assert served["request_id"] == "log-1"
    assert (served["method"], served["path"], served["status"]) == (
        "POST",
        url[len(proxy.url) :],
        200,
    )
    assert served["lane"] in ("hot", "cold") and served["client"] == "127.0.0.1"
    assert served["prompt_tokens"] > 0 and served["completion_tokens"] == 3
    assert served["ttft_ms"] is not None and served["wait_ms"] is not None
    assert 0 <= served["wait_ms"] <= served["ttft_ms"] <= served["latency_ms"]
    assert refused["request_id"] == bad.headers["x-request-id"] and refused["status"] == 400
    assert refused["ttft_ms"] is None and refused["lane"] == "none"
    # the log records name their request
    record = next(r for r in caplog.records if r.name.endswith("access"))
    assert record.request_id == "log-1"


async def test_text_access_log_line(sim, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="prism_proxy.access")
    async with (
        running_proxy(sim.url, access_log="text") as proxy,
        httpx.AsyncClient(timeout=30.0) as http,
    ):
        answer = await http.post(
            proxy.url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": "t-1"}
        )
        assert answer.status_code == 200
        # a line break in a path stays encoded: one request, one line
        missing = await http.get(proxy.url + "/x%0Ay?key=secret", headers={"x-request-id": "t-2"})
        assert missing.status_code == 404

        def lines() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name.endswith("access")]

        await eventually(lambda: len(lines()) == 2)
    served, refused = lines()
    assert served.startswith('t-1 "POST /v1/chat/completions" 200 latency_ms=')
    assert " lane=" in served and " client=127.0.0.1" in served
    assert " completion_tokens=3" in served
    assert refused.startswith('t-2 "GET /x%0Ay" 404 latency_ms=') and "\n" not in refused
    assert "secret" not in refused


@pytest.fixture(scope="module")
def spans() -> Iterator[object]:
    """OpenTelemetry's SDK as the global tracer provider, spans kept in memory; shut
    down after the module (later proxies' spans are then dropped, not kept)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another tracer provider is set in this process")
    yield exporter
    exporter.clear()
    provider.shutdown()


async def test_one_trace_per_request_with_its_admission_wait(spans) -> None:
    seen: list[dict[str, str]] = []
    async with (
        loopback_app(engine_recorder(seen)) as url,
        running_proxy(url, tokenizer="builtin") as proxy,
        httpx.AsyncClient(timeout=30.0) as http,
    ):
        spans.clear()
        chat = proxy.url + "/v1/chat/completions"
        answers = [
            await http.post(chat, json=CHAT, headers={"traceparent": TRACEPARENT}),
            await http.post(chat, json=CHAT),
        ]
        assert [a.status_code for a in answers] == [200, 200]

        def finished() -> list:
            return [s for s in spans.get_finished_spans() if s.name == "prism.request"]

        await eventually(lambda: len(finished()) == 2)
    requests = finished()
    waits = [s for s in spans.get_finished_spans() if s.name == "prism.admission_wait"]
    assert len(waits) == 2
    # one trace each: the first continues the client's, the second is a new one
    continued, fresh = requests
    assert format(continued.context.trace_id, "032x") == TRACE_ID
    assert format(continued.parent.span_id, "016x") == PARENT_ID
    assert fresh.parent is None and fresh.context.trace_id != continued.context.trace_id
    for span, answer, engine in zip(requests, answers, seen, strict=True):
        assert span.attributes["prism.request_id"] == answer.headers["x-request-id"]
        assert span.attributes["http.response.status_code"] == 200
        names = [event.name for event in span.events]
        assert names == ["arrival", "queued", "released", "first_token"]
        (wait,) = [w for w in waits if w.context.trace_id == span.context.trace_id]
        assert wait.parent.span_id == span.context.span_id
        assert span.start_time <= wait.start_time <= wait.end_time <= span.end_time
        assert wait.attributes["prism.outcome"] == "released"
        assert wait.attributes["prism.lane"] in ("hot", "cold")
        # the engine continues the proxy's span (SGLang --enable-trace reads this)
        trace_id, parent_id = engine["traceparent"].split("-")[1:3]
        assert trace_id == format(span.context.trace_id, "032x")
        assert parent_id == format(span.context.span_id, "016x")


def test_without_opentelemetry_no_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy runs without the `otel` extra: the import fails, tracing is off."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # `import` raises ImportError
    assert Tracing("off", "auto").tracer is None
