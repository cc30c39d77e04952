"""Open-loop replay of a trace against a target URL.

Each request is sent at its arrival time, whatever happened to earlier ones (a single
dispatcher sleeps until the next arrival and spawns a task; it never awaits answers).
Every request streams; TTFT is the time to the first chunk with non-empty output text,
end-to-end latency the time to the end of the stream.

Time scale. When the backend's clock runs ``F`` times faster than the wall clock
(``prism-sim --speed F``), replay with ``time_scale=F``: arrivals are sent at
``arrival / F`` wall seconds and every measured time is multiplied by ``F``, so the
results are in modeled seconds and comparable across speeds. ``send_lag_ms`` (how late
each send left, modeled) shows whether the client kept up.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from loadgen.clients.apis import build_request, parse_event
from loadgen.clients.hot_keys import BoundedKeys
from loadgen.clients.routing import ROUTING_KEY_HEADER, ROUTING_KEYS, routing_headers
from loadgen.clients.smg_ring import SmgRing
from loadgen.clients.summary import RequestRecord, summarize
from loadgen.workloads.trace_format import Trace, TraceRequest


@dataclass(frozen=True)
class ReplayConfig:
    target: str
    api: str = "prism"
    layout: str = "blank"  # --api openai: how the documents sit in the user message
    time_scale: float = 1.0
    model: str | None = None
    request_timeout_s: float = 600.0
    progress: bool | None = None  # None: only on a terminal
    routing_key: str = "none"  # X-SMG-Routing-Key for a gateway: ROUTING_KEYS
    max_replica_share: float = 0.4  # "anchor-bounded": the cap m (loadgen.clients.hot_keys)
    # ContextPilot's `POST /reorder` (`contextpilot_order`): asked
    # for each request's document order at its send time, inside its measured time
    reorder_url: str | None = None

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise ValueError("time_scale must be positive")
        if self.routing_key not in ROUTING_KEYS:
            raise ValueError(f"routing_key is one of {', '.join(ROUTING_KEYS)}")


async def discover_model(session: aiohttp.ClientSession, target: str) -> str:
    """The first model the target lists on ``/v1/models`` (``default`` if none)."""
    try:
        async with session.get(target + "/v1/models") as response:
            if response.status == 200:
                models = (await response.json()).get("data") or []
                if models:
                    return str(models[0]["id"])
    except (aiohttp.ClientError, ValueError, KeyError):
        pass
    return "default"


@dataclass
class _Tally:
    has_content: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None


async def _read_stream(response: aiohttp.ClientResponse, api: str, on_first: Any) -> _Tally:
    tally = _Tally()
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        try:
            chunk = json.loads(payload)
        except ValueError:
            tally.error = f"bad stream chunk: {payload[:80]!r}"
            break
        event = parse_event(api, chunk)
        if event.error is not None:
            tally.error = event.error
            break
        if event.has_content and not tally.has_content:
            tally.has_content = True
            on_first()
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            value = getattr(event, name)
            if value is not None:
                setattr(tally, name, value)
    return tally


def trace_popularity(request: TraceRequest) -> dict[str, float] | None:
    """The trace's hot ranks as popularity: 1/rank, so rank 1 is the most popular and
    every hot passage outranks the cold ones (popularity 0)."""
    ranks = request.meta.get("hot_ranks") or {}
    return {segment: 1.0 / float(rank) for segment, rank in ranks.items()} or None


def routing_headers_for(
    request: TraceRequest, mode: str, bounded: BoundedKeys | None = None
) -> dict[str, str]:
    """`X-SMG-Routing-Key` for a gateway in front of replicas.

    * `canonical`: the segment PRISM's canonical order puts first, which any client can
      compute from the request alone;
    * `anchor`: the request's most popular segment by the trace's hot ranks, the
      generator's knowledge (a client with exact popularity counts; else canonical);
    * `anchor-bounded`: the same anchor with hot keys spread (`bounded`);
    * `none`: no key."""
    if mode == "none":
        return {}
    ids = [s.id for s in request.segments]
    if mode == "canonical":
        return routing_headers(ids)
    if mode == "anchor-bounded":
        if bounded is None:
            raise ValueError("anchor-bounded needs a BoundedKeys policy")
        return bounded.headers(ids, trace_popularity(request))
    return routing_headers(ids, trace_popularity(request))


async def gateway_workers(session: aiohttp.ClientSession, target: str) -> list[str]:
    """The worker URLs smg lists on `/workers` (what its hash ring is built from)."""
    async with session.get(target + "/workers") as response:
        response.raise_for_status()
        return [str(worker["url"]) for worker in (await response.json())["workers"]]


async def plan_routing(
    session: aiohttp.ClientSession, config: ReplayConfig, trace: Trace
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """Every request's routing headers, in arrival order, before the clock starts (the
    keys depend only on the anchors' order), and what the plan expects per replica."""
    bounded = None
    info: dict[str, Any] = {"mode": config.routing_key}
    if config.routing_key == "anchor-bounded":
        ring = SmgRing(await gateway_workers(session, config.target))
        bounded = BoundedKeys(ring.place, len(ring.urls), config.max_replica_share)
        info.update(workers=list(ring.urls), cap=bounded.cap, window=bounded.window)
    headers = [routing_headers_for(r, config.routing_key, bounded) for r in trace.requests]
    if bounded is not None:
        keys = [h.get(ROUTING_KEY_HEADER) for h in headers]
        info["planned_per_replica"] = {
            url: sum(1 for k in keys if k is not None and bounded.place(k) == url)
            for url in info["workers"]
        }
        info["moved"] = sum(
            1
            for key, request in zip(keys, trace.requests, strict=True)
            if key is not None and key not in {s.id for s in request.segments}
        )
    return headers, info


async def send_one(
    session: aiohttp.ClientSession,
    config: ReplayConfig,
    request: TraceRequest,
    call: tuple[str, dict[str, Any]] | None,
    scheduled_at: float,
    headers: dict[str, str] | None = None,
    model: str = "default",
) -> RequestRecord:
    """Send one request (``call`` = its path and body; None: built here, after asking
    ``config.reorder_url`` for its document order; ``headers``: its routing headers,
    by default from ``config.routing_key``), stream its answer, and measure it (modeled
    time)."""
    loop = asyncio.get_running_loop()
    scale = config.time_scale
    sent_at = loop.time()
    first_at: list[float] = []
    lane: str | None = None
    status: int | None = None
    tally = _Tally()
    try:
        if call is None:
            call = await reordered_call(session, config, request, model)
        path, body = call
        if headers is None:
            headers = routing_headers_for(request, config.routing_key)
        async with session.post(config.target + path, json=body, headers=headers) as response:
            status = response.status
            lane = response.headers.get("x-prism-lane")
            if status != 200:
                text = (await response.text())[:200]
                tally.error = f"HTTP {status}: {text}"
            else:
                tally = await _read_stream(
                    response, config.api, lambda: first_at.append(loop.time())
                )
    except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as exc:
        # One failed request is a record, never the end of the replay.
        tally.error = f"{type(exc).__name__}: {exc}"[:200]
    ended_at = loop.time()
    if tally.error is None and not first_at:
        tally.error = "stream ended without output"
    success = tally.error is None
    return RequestRecord(
        rid=request.rid,
        arrival_s=request.arrival,
        send_lag_ms=(sent_at - scheduled_at) * scale * 1000.0,
        success=success,
        ttft_ms=(first_at[0] - sent_at) * scale * 1000.0 if first_at else None,
        e2e_latency_ms=(ended_at - sent_at) * scale * 1000.0 if success else None,
        prompt_tokens=tally.prompt_tokens,
        completion_tokens=tally.completion_tokens,
        cached_tokens=tally.cached_tokens,
        hot=request.hot,
        lane=lane,
        status=status,
        error=tally.error,
    )


async def contextpilot_order(
    session: aiohttp.ClientSession, reorder_url: str, request: TraceRequest
) -> TraceRequest:
    """`request` with its documents in the order ContextPilot's `POST /reorder` gives
    them (one context: the documents' texts, which it keys by identical strings).
    A request whose documents may not move, or has fewer than two, is not asked.
    ValueError when the answer is not the same documents."""
    if not request.reorder or len(request.segments) < 2:
        return request
    texts = [segment.text for segment in request.segments]
    async with session.post(reorder_url, json={"contexts": [texts]}) as response:
        if response.status != 200:
            raise ValueError(f"ContextPilot /reorder: HTTP {response.status}")
        answer = await response.json()
    contexts = answer.get("reordered_contexts") if isinstance(answer, dict) else None
    order = contexts[0] if isinstance(contexts, list) and contexts else None
    if not isinstance(order, list) or sorted(map(str, order)) != sorted(texts):
        raise ValueError("ContextPilot /reorder answered other documents than it was sent")
    by_text = {segment.text: segment for segment in request.segments}
    return replace(request, segments=tuple(by_text[text] for text in order))


async def reordered_call(
    session: aiohttp.ClientSession, config: ReplayConfig, request: TraceRequest, model: str
) -> tuple[str, dict[str, Any]]:
    """The path and body of ``request`` with its documents in the order
    ``config.reorder_url`` gives (plain chat in the config's layout)."""
    if config.reorder_url is None or config.api != "openai":
        raise ValueError("a reordered call needs reorder_url and api 'openai'")
    ordered = await contextpilot_order(session, config.reorder_url, request)
    return build_request(config.api, ordered, model, None, config.layout)


def _serializer(trace: Trace) -> Any:
    """The proxy's serializer over the trace's own tokenizer (``--api native``)."""
    from prism_proxy.prompts.serializer import Serializer
    from prism_tokens.tokenizer import load_tokenizer

    return Serializer(load_tokenizer(trace.header.tokenizer or "builtin"))


def _progress_bar(total: int, enabled: bool | None) -> Any:
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="replay", file=sys.stderr)


async def replay(trace: Trace, config: ReplayConfig) -> dict[str, Any]:
    """Replay ``trace`` open-loop; returns the results document."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=config.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=0)
    bar = _progress_bar(len(trace.requests), config.progress)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = config.model or await discover_model(session, config.target)
        serializer = _serializer(trace) if config.api == "native" else None
        # Bodies are built before the clock starts: no client work on the send path
        # (but a reordering client's, built at send time after its reorder call).
        calls = [
            None
            if config.reorder_url is not None
            else build_request(config.api, r, model, serializer, config.layout)
            for r in trace.requests
        ]
        headers, routing = await plan_routing(session, config, trace)
        tasks: list[asyncio.Task[RequestRecord]] = []
        start = loop.time()
        for request, call, header in zip(trace.requests, calls, headers, strict=True):
            scheduled = start + request.arrival / config.time_scale
            delay = scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(
                send_one(session, config, request, call, scheduled, header, model)
            )
            if bar is not None:
                task.add_done_callback(lambda _t: bar.update(1))
            tasks.append(task)
        records = list(await asyncio.gather(*tasks))
        duration_s = (loop.time() - start) * config.time_scale
    if bar is not None:
        bar.close()
    qps = trace.header.params.get("qps")
    return {
        "config": {**asdict(config), "model": model},
        "trace": trace.header.to_json(),
        "summary": summarize(records, duration_s, float(qps) if qps else None),
        "routing": routing,
        "requests": [r.to_json() for r in records],
    }


def write_results(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
