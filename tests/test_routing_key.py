"""The routing key a gateway routes replicas by, and the loads a proxy reports."""

from __future__ import annotations

import json
from collections import Counter

import aiohttp
from aiohttp import web
from proxy_support import loopback_app

from loadgen.clients.hot_keys import spread_keys
from loadgen.clients.replay import ReplayConfig, replay, send_one
from loadgen.clients.routing import ROUTING_KEY_HEADER, anchor_segment, routing_headers
from loadgen.clients.smg_ring import SmgRing
from loadgen.workloads.trace_format import Segment, Trace, TraceHeader, TraceRequest
from prism_proxy.edge.probes import with_proxy_queue
from prism_proxy.qas.alignment import canonical_key


def test_anchor_is_the_most_popular_segment_else_the_canonical_first() -> None:
    ids = ["doc-7", "doc-2", "doc-9"]
    assert anchor_segment(ids) == min(ids, key=canonical_key)
    assert anchor_segment(list(reversed(ids))) == anchor_segment(ids)  # order-free
    assert anchor_segment(ids, {"doc-9": 5, "doc-2": 1}) == "doc-9"
    tied = anchor_segment(ids, {"doc-7": 3, "doc-2": 3})
    assert tied == min(["doc-7", "doc-2"], key=canonical_key)
    assert anchor_segment([]) is None and routing_headers([]) == {}
    assert routing_headers(ids) == {ROUTING_KEY_HEADER: anchor_segment(ids)}


def test_loads_count_the_proxys_queue_as_waiting_requests() -> None:
    proxy = {"queue_depth": 7, "inflight": 3}
    backend = {"loads": [{"dp_rank": 0, "num_waiting_reqs": 2, "queues": {"waiting": 2}}]}
    merged = with_proxy_queue(backend, proxy)
    assert merged["loads"][0]["num_waiting_reqs"] == 9
    assert merged["loads"][0]["queues"]["waiting"] == 9
    assert backend["loads"][0]["num_waiting_reqs"] == 2  # the backend's answer is not changed
    alone = with_proxy_queue({"loads": []}, proxy)
    assert alone["loads"] == [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 7}]
    assert alone["prism"] is proxy


def header_recorder(seen: list) -> web.Application:
    """A one-chunk chat stream that records each request's routing key: what the
    gateway in front of the replicas would receive from the client."""

    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get(ROUTING_KEY_HEADER))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delta = {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}
        await response.write(f"data: {json.dumps(delta)}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_replay_sends_the_anchor_as_routing_key() -> None:
    seen: list[str | None] = []

    app = header_recorder(seen)
    request = TraceRequest(
        rid="r1",
        arrival=0.0,
        system="s",
        segments=(Segment("p00003", "three"), Segment("p00001", "one"), Segment("p00000", "z")),
        suffix="q",
        max_tokens=2,
        reorder=True,
        hot=True,
        meta={"hot_ranks": {"p00001": 4, "p00003": 1}},
    )
    async with loopback_app(app) as url, aiohttp.ClientSession() as session:
        for mode in ("anchor", "canonical", "none"):
            config = ReplayConfig(target=url, api="openai", routing_key=mode, model="m")
            body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True}
            record = await send_one(session, config, request, ("/v1/chat/completions", body), 0.0)
            assert record.success, record.error
    # hot rank 1 is the anchor, before any cold segment; canonical: what the client
    # computes from the request alone (PRISM's canonical first), whatever the hot ranks
    canonical = min(("p00003", "p00001", "p00000"), key=canonical_key)
    assert seen == ["p00003", canonical, None]


async def test_replay_spreads_a_hot_anchor_over_the_gateways_replicas() -> None:
    seen: list[str | None] = []
    workers = [f"http://127.0.0.1:{port}" for port in (30001, 30002, 30003)]

    async def listing(_request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": url} for url in workers]})

    app = header_recorder(seen)
    app.router.add_get("/workers", listing)
    requests = [
        TraceRequest(rid=f"r{i}", arrival=0.0, system="s", suffix="q", max_tokens=2,
                     segments=(Segment("hot", "h"), Segment(f"cold-{i}", "c")),
                     reorder=True, hot=True, meta={"hot_ranks": {"hot": 1}})
        for i in range(300)
    ]  # fmt: skip
    trace = Trace(TraceHeader("t", {}, 0, len(requests), "builtin"), tuple(requests))
    async with loopback_app(app) as url:
        config = ReplayConfig(target=url, api="openai", routing_key="anchor-bounded", model="m")
        results = await replay(trace, config)
    routing, ring = results["routing"], SmgRing(workers)
    assert results["summary"]["completed"] == 300
    assert routing["workers"] == workers and routing["cap"] == 103  # ceil(0.4 * 256)
    sent = Counter(seen)  # the hot anchor fills its home replica, then spills to the others
    assert sent["hot"] >= 103 and set(sent) == set(spread_keys("hot", ring.place, 3))
    assert routing["moved"] == 300 - sent["hot"]
    assert routing["planned_per_replica"] == dict(Counter(ring.place(k) for k in seen))
