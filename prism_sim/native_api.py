"""SGLang's native endpoints: /generate, /abort_request, /flush_cache, info, health, metrics.

Shapes follow SGLang 0.5.23 (`srt/entrypoints/http_server.py`, `managers/io_struct.py`).
Streaming `/generate` sends cumulative `text`/`output_ids` per chunk (incremental with
`--incremental-streaming-output`), then `data: [DONE]`; a batch's answers are streamed
interleaved as their tokens come, each chunk with its prompt's `index`
(`TokenizerManager._stream_batch_responses`). A client that goes away aborts
its request. Latencies in `meta_info` are modeled seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from prism_sim.api_models import AbortIn, GenerateIn, SamplingParamsIn
from prism_sim.engine import VERSION, RequestHandle, SimEngine
from prism_sim.http_common import (
    ENGINE_KEY,
    BadRequest,
    IncrementalText,
    check_token_ids,
    encode,
    error_response,
    open_sse,
    parse_body,
    send_sse,
    start_request,
)
from prism_sim.metrics import cached_tokens_details
from prism_sim.request import SimRequest
from prism_sim.scheduler import Scheduler


def meta_info(engine: SimEngine, req: SimRequest) -> dict[str, Any]:
    """SGLang's `meta_info`; `e2e_latency` (modeled seconds) only once finished."""
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish_reason,
        "prompt_tokens": len(req.input_ids),
        "weight_version": "default",
        "total_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
    }
    if engine.scheduler.host_tier is not None and req.cached_tokens > 0:
        # SGLang's split of cached_tokens by source (only with the host tier here)
        meta["cached_tokens_details"] = cached_tokens_details(req)
    if req.finish_s is not None:
        meta["e2e_latency"] = req.finish_s - req.arrival_s
    return meta


def _nth(value: Any, index: int, field: str) -> Any:
    """A per-prompt field: the list's `index`th entry, or the one value for all."""
    if not isinstance(value, list):
        return value
    if index >= len(value):
        raise BadRequest(f"{field}: a list needs one entry per prompt (got {len(value)})")
    return value[index]


async def _prompts(body: GenerateIn, engine: SimEngine) -> tuple[list[list[int]], bool]:
    """Token ids of each prompt and whether the request was a batch."""
    if (body.text is None) == (body.input_ids is None):
        raise BadRequest("Either text or input_ids should be provided.")
    if body.text is not None:
        texts = body.text if isinstance(body.text, list) else [body.text]
        return [await encode(engine, t) for t in texts], isinstance(body.text, list)
    ids = body.input_ids or []
    if ids and isinstance(ids[0], list):
        return [check_token_ids(engine, list(x)) for x in ids], True  # type: ignore[arg-type]
    return [check_token_ids(engine, list(ids))], False  # type: ignore[arg-type]


def _start(engine: SimEngine, body: GenerateIn, ids: list[int], index: int) -> RequestHandle:
    params = _nth(body.sampling_params, index, "sampling_params") or SamplingParamsIn()
    return start_request(
        engine,
        ids,
        params.max_new_tokens,
        field="max_new_tokens",
        rid=_nth(body.rid, index, "rid"),
        kv_hints=_nth(body.kv_hints, index, "kv_hints"),
        priority=body.priority,
        stream=body.stream,
    )


def _result(engine: SimEngine, req: SimRequest) -> dict[str, Any]:
    return {
        "text": engine.decode(req.output_ids),
        "output_ids": list(req.output_ids),
        "meta_info": meta_info(engine, req),
    }


async def generate(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    try:
        body = await parse_body(request, GenerateIn)
        prompts, is_batch = await _prompts(body, engine)
        handles: list[RequestHandle] = []
        try:
            for i, ids in enumerate(prompts):
                handles.append(_start(engine, body, ids, i))
        except BadRequest:
            for handle in handles:
                handle.abort()
            raise
    except BadRequest as exc:
        return error_response(str(exc))
    try:
        if body.stream:
            return await _stream(request, engine, handles, is_batch)
        results = await asyncio.gather(*(h.wait() for h in handles))
        payload = [_result(engine, r) for r in results]
        return web.json_response(payload if is_batch else payload[0])
    finally:
        for handle in handles:
            handle.abort()  # no-op when finished; a dropped client aborts its request


async def _chunks(
    engine: SimEngine, handle: RequestHandle, index: int | None
) -> AsyncIterator[dict[str, Any]]:
    """One answer's chunks as its tokens come (with its `index` in a batch)."""
    incremental = engine.config.incremental_streaming_output
    sent_ids = 0
    text = IncrementalText(engine.decode)
    async for req in handle.progress():
        delta = text.delta(req.output_ids, final=req.finished)
        chunk = {
            "text": delta if incremental else text.text,
            "output_ids": req.output_ids[sent_ids:] if incremental else list(req.output_ids),
            "meta_info": meta_info(engine, req),
        }
        if index is not None:
            chunk["index"] = index
        sent_ids = len(req.output_ids)
        yield chunk


async def _stream(
    request: web.Request, engine: SimEngine, handles: list[RequestHandle], batch: bool
) -> web.StreamResponse:
    response = await open_sse(request)
    streams = [_chunks(engine, h, i if batch else None) for i, h in enumerate(handles)]
    waiting = {asyncio.ensure_future(anext(stream)): i for i, stream in enumerate(streams)}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=waiting.__getitem__):  # in prompt order
                i = waiting.pop(task)
                try:
                    chunk = task.result()
                except StopAsyncIteration:
                    continue
                await send_sse(response, chunk)
                waiting[asyncio.ensure_future(anext(streams[i]))] = i
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
    await send_sse(response, "[DONE]")
    await response.write_eof()
    return response


async def abort_request(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        body = await parse_body(request, AbortIn)
    except BadRequest as exc:
        return error_response(str(exc))
    sched = engine.scheduler
    live = sched.live_requests()
    if body.abort_all:
        targets = [r.rid for r in live]
    elif body.rid and sched.get(body.rid) is not None:
        # As SGLang: the rid must exist, then every request whose rid starts with it goes.
        targets = [r.rid for r in live if r.rid.startswith(body.rid)]
    else:
        targets = []
    for rid in targets:
        engine.loop.abort(rid)
    return web.Response(status=200)


async def flush_cache(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if engine.scheduler.flush_cache():
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n"
        )
    return web.Response(
        status=400,
        text="Cache not flushed: there are running or waiting requests.\n",
    )


async def health(request: web.Request) -> web.Response:
    """200 while the engine loop runs; 503 once it has crashed."""
    return web.Response(status=503 if request.app[ENGINE_KEY].loop.failed else 200)


async def health_generate(request: web.Request) -> web.Response:
    """Run a one-token generation through the engine, like SGLang's health check."""
    engine = request.app[ENGINE_KEY]
    if engine.loop.failed is not None:
        return web.Response(status=503)
    handle = engine.start([engine.scheduler.filler_ids[0]], 1, rid=f"HEALTH_CHECK_{id(request)}")
    try:
        req = await handle.wait()
    finally:
        handle.abort()
    status = 200 if req.finish_reason and req.finish_reason.get("type") != "abort" else 503
    return web.Response(status=status)


def model_info_body(engine: SimEngine) -> dict[str, Any]:
    return {
        "model_path": engine.model_path,
        "tokenizer_path": engine.config.tokenizer or engine.tokenizer.name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
    }


async def model_info(request: web.Request) -> web.Response:
    return web.json_response(model_info_body(request.app[ENGINE_KEY]))


def batch_limits(scheduler: Scheduler) -> dict[str, Any]:
    """The batch limits `/server_info` reports (SGLang's field names)."""
    config = scheduler.config
    return {
        "max_running_requests": config.max_running_requests,
        "max_total_num_tokens": config.kv_capacity_tokens,
        "chunked_prefill_size": config.chunked_prefill_size or -1,
    }


async def server_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    cfg, profile, sched = engine.config, engine.profile, engine.scheduler
    body = {
        "version": VERSION,
        "engine": "prism-sim",
        "model_path": engine.model_path,
        "served_model_name": engine.model_name,
        "tokenizer_path": cfg.tokenizer,
        "host": cfg.host,
        "port": cfg.port,
        "profile": profile.name,
        "schedule_policy": sched.config.schedule_policy,
        "radix_eviction_policy": cfg.eviction,
        **batch_limits(sched),
        "page_size": 1,
        "speed": cfg.speed,
        "random_seed": cfg.seed,
        "incremental_streaming_output": cfg.incremental_streaming_output,
        "enable_metrics": True,
        "enable_cache_report": True,
        "startup_time": engine.startup_time,
        "internal_states": [
            {
                "num_running_reqs": sched.num_running,
                "effective_max_running_requests_per_dp": sched.config.max_running_requests,
                "num_queue_reqs": len(sched.waiting),
                "num_used_tokens": sched.used_tokens,
                "evictable_size": engine.cache.evictable_size(),
                "protected_size": engine.cache.protected_size(),
                "evicted_tokens_total": engine.cache.evicted_tokens_total,
                "modeled_time_s": engine.loop.now(),
                "loop_lag_s": engine.loop.lag_s,
            }
        ],
    }
    return web.json_response(body)


async def loads(request: web.Request) -> web.Response:
    """SGLang 0.5.23's `GET /v1/loads` (entrypoints/v1_loads.py): one load snapshot per
    DP rank (here one), the core fields of `LoadSnapshot` that a simulated engine has."""
    engine = request.app[ENGINE_KEY]
    sched = engine.scheduler
    capacity = sched.config.kv_capacity_tokens
    used = sched.used_tokens
    load = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": sched.num_running,
        "num_waiting_reqs": len(sched.waiting),
        "num_used_tokens": used,
        "num_total_tokens": used,
        "max_total_num_tokens": capacity,
        "max_running_requests": sched.config.max_running_requests,
        "token_usage": used / capacity if capacity else 0.0,
    }
    return web.json_response(
        {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": VERSION,
            "accelerator": None,
            "num_accelerators": 1,
            "loads": [load],
        }
    )


async def metrics(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    data = generate_latest(engine.metrics.registry)
    return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})
