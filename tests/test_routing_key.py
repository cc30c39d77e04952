"""The routing key a gateway routes replicas by, and the loads a proxy reports (issue 15)."""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web
from proxy_support import loopback_app

from loadgen.replay import ReplayConfig, send_one
from loadgen.trace_format import Segment, TraceRequest
from prism_proxy.probes import with_proxy_queue
from prism_proxy.qas.alignment import canonical_key
from prism_proxy.routing import ROUTING_KEY_HEADER, anchor_segment, routing_headers


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


async def test_replay_sends_the_anchor_as_routing_key() -> None:
    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get(ROUTING_KEY_HEADER))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        delta = {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}
        await response.write(f"data: {json.dumps(delta)}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    request = TraceRequest(
        rid="r1",
        arrival=0.0,
        system="s",
        segments=(Segment("p00003", "three"), Segment("p00001", "one")),
        suffix="q",
        max_tokens=2,
        reorder=True,
        hot=True,
        meta={"hot_ranks": {"p00001": 4, "p00003": 1}},
    )
    async with loopback_app(app) as url, aiohttp.ClientSession() as session:
        for mode in ("anchor", "none"):
            config = ReplayConfig(target=url, api="openai", routing_key=mode, model="m")
            body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True}
            record = await send_one(session, config, request, ("/v1/chat/completions", body), 0.0)
            assert record.success, record.error
    assert seen == ["p00003", None]  # hot rank 1 is the anchor
