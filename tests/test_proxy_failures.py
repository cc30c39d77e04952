"""Failure behaviour of the proxy: 400 naming the field, 413, 429 with
Retry-After, 502 for a dead backend, client disconnects (queued → withdrawn; sent →
`/abort_request`), and the queue/in-flight gauges returning to 0."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import openai
import pytest
from proxy_support import (
    ProxyFactory,
    eventually,
    loopback_app,
    proxy_factory_fixture,
    running_proxy,
    sim_metric,
    sim_server,
)

from loadgen.stack.processes import free_port
from prism_proxy.edge.gateway import GATEWAY

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 3}
LONG_STREAM = {**CHAT, "max_tokens": 20000, "stream": True}


def _gauges_zero(proxy) -> bool:
    registry = proxy.app[GATEWAY].metrics.registry
    return (
        registry.get_sample_value("prism:queue_depth") == 0
        and registry.get_sample_value("prism:inflight_requests") == 0
    )


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", b"{not json", "body"),
        ("/v1/chat/completions", b"[1, 2]", "body"),
        ("/v1/chat/completions", json.dumps({**CHAT, "messages": "hi"}).encode(), "messages"),
        ("/v1/chat/completions", json.dumps({**CHAT, "max_tokens": "x"}).encode(), "max_tokens"),
        (
            "/v1/chat/completions",
            json.dumps(
                {
                    **CHAT,
                    "prism": {"segments": [{"id": "d", "text": "a"}, {"id": "d", "text": "b"}]},
                }
            ).encode(),
            "prism.segments",
        ),
        ("/v1/completions", json.dumps({"model": "m"}).encode(), "prompt"),
        ("/generate", json.dumps({"sampling_params": {}}).encode(), "text"),
        ("/generate", json.dumps({"text": "x", "prism": {"bogus": 1}}).encode(), "prism.bogus"),
    ],
)
async def test_400_names_the_field(proxy_factory: ProxyFactory, path, body, param) -> None:
    proxy = await proxy_factory()
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.url + path, data=body) as response,
    ):
        error = (await response.json())["error"]
    assert response.status == 400
    assert error["param"] == param and param in error["message"]
    assert error["type"] == "invalid_request_error"


async def test_400_through_the_openai_client(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory()
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
    async with client:
        with pytest.raises(openai.BadRequestError, match="temperature"):
            await client.chat.completions.create(
                model="m", messages=CHAT["messages"], temperature=-1.0
            )


async def test_413_over_max_body_bytes(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(max_body_bytes=4096)
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.url + "/v1/chat/completions", json=body) as response:
            error = await response.json()
        assert response.status == 413 and "4096" in error["error"]["message"]
        async with session.post(proxy.url + "/v1/chat/completions", json=CHAT) as response:
            assert response.status == 200  # small bodies still pass


async def test_429_when_queue_full_then_recovers(proxy_factory: ProxyFactory, sim) -> None:
    proxy = await proxy_factory(max_inflight=1, max_queue=1, retry_after_s=3)
    admission = proxy.app[GATEWAY].admission
    url = proxy.url + "/v1/chat/completions"
    async with aiohttp.ClientSession() as session:
        holder = await session.post(url, json=LONG_STREAM)  # takes the only slot
        await holder.content.readline()
        queued = asyncio.create_task(session.post(url, json=CHAT))
        await eventually(lambda: admission.queue_depth == 1)
        async with session.post(url, json=CHAT) as rejected:
            error = await rejected.json()
        assert rejected.status == 429 and rejected.headers["Retry-After"] == "3"
        assert error["error"]["type"] == "rate_limit_exceeded"
        holder.close()  # the client leaves: its slot goes to the queued request
        async with await queued as response:
            assert response.status == 200
            assert (await response.json())["choices"][0]["message"]["content"]
    await eventually(lambda: _gauges_zero(proxy))


async def test_502_when_backend_is_down() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with (
        running_proxy(dead, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as session,
    ):
        for path, body in [
            ("/v1/chat/completions", CHAT),
            ("/v1/chat/completions", {**CHAT, "stream": True}),
            ("/generate", {"text": "hi", "stream": True}),
            ("/v1/completions", {"model": "m", "prompt": "hi", "n": 2}),  # passthrough
        ]:
            async with session.post(proxy.url + path, json=body) as response:
                error = await response.json()
            assert response.status == 502, path
            assert "unreachable" in error["error"]["message"]
        async with session.get(proxy.url + "/v1/models") as response:
            assert response.status == 502
        async with session.get(proxy.url + "/health") as response:
            assert (await response.json())["backend_up"] is False
        registry = proxy.app[GATEWAY].metrics.registry
        assert registry.get_sample_value("prism:backend_up") == 0
        assert _gauges_zero(proxy)


STREAMS = {
    "chat": ("/v1/chat/completions", "cold", LONG_STREAM),
    "generate": (
        "/generate",
        "cold",
        {"text": "Tell me", "stream": True, "sampling_params": {"max_new_tokens": 20000}},
    ),
    "passthrough": ("/v1/chat/completions", "passthrough", {**LONG_STREAM, "logprobs": True}),
}


@pytest.mark.parametrize("case", sorted(STREAMS))
async def test_disconnect_mid_stream_aborts_at_backend(
    proxy_factory: ProxyFactory, sim, case: str
) -> None:
    proxy = await proxy_factory()
    backend = proxy.app[GATEWAY].backend
    aborted_before = sim_metric(sim, "sglang:num_aborted_requests_total")
    path, lane, body = STREAMS[case]
    async with aiohttp.ClientSession() as session:
        response = await session.post(proxy.url + path, json=body)
        assert response.status == 200
        await response.content.readline()  # the stream is flowing
        response.close()  # the client goes away mid-stream
    await eventually(lambda: backend.aborts_sent == 1)
    await eventually(lambda: _gauges_zero(proxy))
    await eventually(
        lambda: sim_metric(sim, "sglang:num_aborted_requests_total") == aborted_before + 1
    )
    registry = proxy.app[GATEWAY].metrics.registry
    endpoint = "generate" if case == "generate" else "chat"
    labels = {"endpoint": endpoint, "lane": lane, "status": "499"}
    # counted when the cancelled handler's middleware unwinds, after the gauges fell
    await eventually(lambda: registry.get_sample_value("prism:requests_total", labels) == 1)


async def test_disconnect_while_queued_leaves_the_queue(proxy_factory: ProxyFactory, sim) -> None:
    proxy = await proxy_factory(max_inflight=1)
    admission = proxy.app[GATEWAY].admission
    url = proxy.url + "/v1/chat/completions"
    finished_before = sim_metric(sim, "sglang:num_requests_total")
    async with aiohttp.ClientSession() as session:
        holder = await session.post(url, json=LONG_STREAM)
        await holder.content.readline()
        leaver = asyncio.create_task(session.post(url, json=CHAT))
        await eventually(lambda: admission.queue_depth == 1)
        leaver.cancel()  # closes its connection while queued
        with pytest.raises(asyncio.CancelledError):
            await leaver
        await eventually(lambda: admission.queue_depth == 0)
        assert admission.inflight == 1  # only the holder was ever sent
        holder.close()
    await eventually(lambda: _gauges_zero(proxy))
    # An abort goes out in a task of its own; stopping the proxy waits for every such
    # task, so the count read after it is final: one abort, the holder's, none for the
    # leaver.
    await proxy.stop()
    assert proxy.app[GATEWAY].backend.aborts_sent == 1
    # The withdrawn request never reached the engine: nothing finished there normally.
    assert sim_metric(sim, "sglang:num_requests_total") == finished_before


@pytest.mark.parametrize(("backend_status", "proxy_status"), [(500, 502), (503, 503), (400, 400)])
async def test_backend_errors_map_to_clear_statuses(backend_status, proxy_status) -> None:
    """A backend answering with an error (here a loopback stub whose `/generate` always
    fails, and which serves nothing else: no `/v1/tokenize`, so the named tokenizer is
    used unverified) is tried once and reported with its message."""
    from aiohttp import web

    calls = []

    async def failing(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.json_response({"error": {"message": "engine exploded"}}, status=backend_status)

    app = web.Application()
    app.router.add_post("/generate", failing)
    async with loopback_app(app) as url, running_proxy(url, tokenizer="builtin") as proxy:
        async with (
            aiohttp.ClientSession() as session,
            session.post(proxy.url + "/v1/chat/completions", json=CHAT) as response,
        ):
            error = (await response.json())["error"]
        assert response.status == proxy_status
        assert "engine exploded" in error["message"]
        assert calls == ["/generate"]  # exactly one attempt, no retries
        assert _gauges_zero(proxy)


async def test_disconnect_while_backend_works_aborts(proxy_factory: ProxyFactory, sim) -> None:
    """Non-streaming: the client leaves while the backend generates → abort at once."""
    proxy = await proxy_factory()
    admission = proxy.app[GATEWAY].admission
    aborted_before = sim_metric(sim, "sglang:num_aborted_requests_total")
    body = {**CHAT, "max_tokens": 20000}
    async with aiohttp.ClientSession() as session:
        call = asyncio.create_task(session.post(proxy.url + "/v1/chat/completions", json=body))
        await eventually(lambda: admission.inflight == 1)
        await eventually(lambda: sim_metric(sim, "sglang:num_running_reqs") == 1)  # generating
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    await eventually(lambda: proxy.app[GATEWAY].backend.aborts_sent == 1)
    await eventually(lambda: _gauges_zero(proxy))
    await eventually(
        lambda: sim_metric(sim, "sglang:num_aborted_requests_total") == aborted_before + 1
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_client_fields_that_touch_other_requests_never_reach_the_backend(
    stream: bool,
) -> None:
    """SGLang aborts every rid that *starts with* the aborted one, so a client naming
    its request "prism-" (the prefix of the proxy's rids) could abort everyone's. The
    backend sees only the proxy's own fixed-length rids, and never a client's `kv_hints`
    (cache metadata) or `priority`; the client still gets its `rid` back as the id.
    A loopback stub backend records what arrives."""
    from aiohttp import web

    received: list[dict] = []

    async def backend(request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.json_response({"model_path": "stub"})
        if request.path.endswith("/tokenize"):  # an engine that cannot tokenize
            raise web.HTTPNotFound()
        body = await request.json()
        received.append(body)
        # /generate's shape; the passthrough paths relay whatever comes back
        result = {
            "text": "ok",
            "output_ids": [1],
            "meta_info": {"id": body["rid"], "prompt_tokens": 2, "completion_tokens": 1,
                          "cached_tokens": 0, "finish_reason": {"type": "length"}},
        }  # fmt: skip
        if not body.get("stream"):
            return web.json_response(result)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(result)}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", backend)
    hostile = {"rid": "prism-", "kv_hints": {"prism": {"anchors": []}}, "priority": 2**62}
    async with (
        loopback_app(app) as url,
        running_proxy(url, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as session,
    ):
        for path, body in [
            ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
            ("/v1/chat/completions", CHAT),
            ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 1}),
        ]:
            async with session.post(
                proxy.url + path, json={**body, **hostile, "stream": stream}
            ) as response:
                text = await response.text()
            assert response.status == 200, text
            assert "prism-" in text  # the client's own name for its request
    assert len(received) == 3
    for body in received:
        assert re.fullmatch(r"prism-[0-9a-f]{32}", body["rid"]), body["rid"]
        assert "priority" not in body
        assert body.get("kv_hints") is None or "protocol_version" in body["kv_hints"]


async def test_health_probes_follow_the_backend_down_and_up() -> None:
    """With `health_interval_s` set, `prism:backend_up` and `/health` follow a backend
    whose `/server_info` starts failing, then recovers (no client traffic needed);
    the limits it reports set the prefill pacing (SPEC §2)."""
    from aiohttp import web

    healthy = [True]

    async def server_info(request: web.Request) -> web.Response:
        if healthy[0]:
            return web.json_response({"chunked_prefill_size": 2048, "max_running_requests": 5})
        return web.json_response({"error": {"message": "down"}}, status=500)

    app = web.Application()
    app.router.add_get("/server_info", server_info)
    async with (
        loopback_app(app) as url,
        running_proxy(url, health_interval_s=0.02, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as session,
    ):
        registry = proxy.app[GATEWAY].metrics.registry
        assert registry.get_sample_value("prism:backend_up") == 1  # the startup probe
        pacing = proxy.app[GATEWAY].admission.pacing
        assert (pacing.prefill_batch, pacing.backstop) == (2, 5)  # 2048 / 1024 tokens
        assert registry.get_sample_value("prism:prefill_batch") == 2
        assert registry.get_sample_value("prism:inflight_limit") == 5
        healthy[0] = False
        await eventually(lambda: registry.get_sample_value("prism:backend_up") == 0)
        async with session.get(proxy.url + "/health") as response:
            assert response.status == 200  # the proxy itself still serves
            assert (await response.json())["backend_up"] is False
        healthy[0] = True
        await eventually(lambda: registry.get_sample_value("prism:backend_up") == 1)
        async with session.get(proxy.url + "/health") as response:
            assert (await response.json())["backend_up"] is True


@pytest.mark.parametrize("chunks_before_error", [0, 1])
async def test_error_chunk_in_a_backend_stream(chunks_before_error: int) -> None:
    """SGLang reports a failure inside a stream as a `{"error": ...}` chunk. Before any
    chunk went out the client gets a 502 answer; after, the stream ends with an error
    event and `[DONE]`; either way the message arrives and the status is counted."""
    from aiohttp import web

    async def backend(request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.json_response({"model_path": "stub"})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if chunks_before_error:
            chunk = {"text": "partial", "meta_info": {"id": "x"}}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        error = {"error": {"message": "out of memory", "code": 500}}
        await response.write(f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", backend)
    async with (
        loopback_app(app) as url,
        running_proxy(url, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as session,
        session.post(proxy.url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r,
    ):
        text = await r.text()
        registry = proxy.app[GATEWAY].metrics.registry
        labels = {"endpoint": "chat", "lane": "cold", "status": "502"}
        await eventually(lambda: registry.get_sample_value("prism:requests_total", labels) == 1)
        assert _gauges_zero(proxy)
    if chunks_before_error:
        assert r.status == 200
        events = [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]
        assert json.loads(events[1])["choices"][0]["delta"] == {"content": "partial"}
        error = json.loads(events[-2])["error"]
        assert events[-1] == "[DONE]" and error["code"] == 502
    else:
        assert r.status == 502
        error = json.loads(text)["error"]
    assert error["message"] == "backend error: out of memory"


async def test_one_requests_engine_error_leaves_the_engine_up() -> None:
    """An engine's 500 on one request is that request's 502; the engine stays up (no
    client can mark it down for everyone, flip readiness or stale the tokenizer check
    with input that makes the engine fail), while a failing probe still marks it down."""
    from aiohttp import web

    healthy = [True]

    async def server_info(request: web.Request) -> web.Response:
        if healthy[0]:
            return web.json_response({"chunked_prefill_size": 2048, "max_running_requests": 5})
        return web.json_response({"error": {"message": "down"}}, status=500)

    async def generate(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "Internal server error"}}, status=500)

    app = web.Application()
    app.router.add_get("/server_info", server_info)
    app.router.add_post("/generate", generate)
    async with (
        loopback_app(app) as url,
        running_proxy(url, health_interval_s=0.02, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as session,
    ):
        backend, registry = proxy.app[GATEWAY].backend, proxy.app[GATEWAY].metrics.registry
        assert backend.up is True
        downs = backend.downs
        for _ in range(3):
            async with session.post(proxy.url + "/generate", json={"text": "hi"}) as response:
                assert response.status == 502
        assert (backend.up, backend.downs) == (True, downs)
        assert registry.get_sample_value("prism:backend_up") == 1
        healthy[0] = False
        await eventually(lambda: registry.get_sample_value("prism:backend_up") == 0)
