"""Open-loop replay over real HTTP: against the simulated engine directly (``sglang``,
``openai`` APIs) and through the proxy (``prism`` API); results schema and summary."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from proxy_support import wait_until

from loadgen.cli import main
from loadgen.clients.replay import ReplayConfig, replay
from loadgen.clients.summary import RequestRecord, summarize
from loadgen.experiments.sweep import metric_totals
from loadgen.stack.processes import free_port, run_server
from loadgen.workloads.rag_trace import RagTraceParams, build_rag_trace
from loadgen.workloads.trace_format import Trace, read_trace, write_trace
from prism_tokens.tokenizer import load_tokenizer

SPEED = 4.0
MAX_TOKENS = 8  # each request's answer, in tokens
SUMMARY_KEYS = {
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_input_tokens",
    "total_output_tokens",
    "mean_ttft_ms",
    "median_ttft_ms",
    "std_ttft_ms",
    "p90_ttft_ms",
    "p95_ttft_ms",
    "p99_ttft_ms",
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
    "p99_e2e_latency_ms",
    "hit_rate",
    "errors",
    "lanes",
}
RECORD_KEYS = {
    "rid",
    "arrival_s",
    "send_lag_ms",
    "success",
    "ttft_ms",
    "e2e_latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "hot",
    "lane",
    "status",
    "error",
}


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    params = RagTraceParams(
        passages=40, hot_set=5, num_requests=40, qps=40.0, max_tokens=MAX_TOKENS
    )
    header, requests = build_rag_trace(params, 11, load_tokenizer("builtin"))
    path = tmp_path_factory.mktemp("trace") / "rag.jsonl"
    write_trace(path, header, requests)
    return path


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    logs = tmp_path_factory.mktemp("logs")
    with run_server("prism_sim", ["--speed", f"{SPEED:g}"], log_dir=logs) as server:
        yield server


def _check_results(results: dict, trace: Trace) -> dict:
    summary = results["summary"]
    assert set(summary) >= SUMMARY_KEYS
    assert summary["completed"] == len(trace.requests) and summary["failed"] == 0
    records = results["requests"]
    assert [r["rid"] for r in records] == [r.rid for r in trace.requests]
    for record in records:
        assert set(record) == RECORD_KEYS
        assert record["success"] and record["status"] == 200
        # Measured on the stream: the first token comes before the other 7 do.
        assert 0 < record["ttft_ms"] < record["e2e_latency_ms"]
        assert record["completion_tokens"] == 8
        assert record["prompt_tokens"] > 600
        assert 0 <= record["cached_tokens"] < record["prompt_tokens"]
    prompt = sum(r["prompt_tokens"] for r in records)
    cached = sum(r["cached_tokens"] for r in records)
    assert summary["hit_rate"] == pytest.approx(cached / prompt)
    # The shared system prompt alone is a cached prefix for every request but the first.
    assert sum(1 for r in records if r["cached_tokens"] >= 40) >= len(records) - 1
    assert results["trace"]["workload"] == "zipf_hotspot"
    return summary


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_replay_direct_to_sim(api: str, sim, trace_file: Path) -> None:
    trace = read_trace(trace_file)
    config = ReplayConfig(target=sim.url, api=api, time_scale=SPEED, progress=False)
    results = asyncio.run(replay(trace, config))
    summary = _check_results(results, trace)
    assert summary["lanes"] == {}  # the engine reports no lanes
    assert results["config"]["time_scale"] == SPEED


def test_replay_through_proxy_cli(sim, trace_file: Path, tmp_path: Path) -> None:
    """`prism-loadgen replay --api prism` through a real proxy in front of the engine."""
    # The direct replays above left the trace's prompts in the engine's cache: sent by
    # no client of the proxy's, they would not be reported to this one (prompts.sharing)
    assert httpx.post(sim.url + "/flush_cache", timeout=30.0).status_code == 200
    args = ["serve", "--backend", sim.url, "--policy", "prism", "--log-level", "warning"]
    with run_server("prism_proxy", args, log_dir=tmp_path) as proxy:
        out = tmp_path / "results.json"
        argv = ["replay", "--trace", str(trace_file), "--target", proxy.url, "--api", "prism"]
        assert main([*argv, "--time-scale", f"{SPEED:g}", "--out", str(out)]) == 0
        results = json.loads(out.read_text())
        summary = _check_results(results, read_trace(trace_file))
        # The proxy counts a stream's tokens as its last chunk goes out, when the client
        # may already have read it: wait until every request's are counted.
        totals: dict[str, float] = {}

        def counted() -> bool:
            totals.update(metric_totals(httpx.get(proxy.url + "/metrics", timeout=10.0).text))
            return totals.get("prism:prompt_tokens_total", 0) >= summary["total_input_tokens"]

        wait_until(counted)
    # The proxy saw (and counted) the same prompt tokens the replay recorded.
    assert summary["total_input_tokens"] > 0
    assert totals["prism:prompt_tokens_total"] == summary["total_input_tokens"]
    # Cached tokens: the metric counts the engine's whole match; the client is told at
    # most what it sent or was generated for it (prompts.sharing), and an answer counts
    # as its own once the proxy has relayed its end. A prompt that runs on into tokens
    # the engine cached from an earlier answer still being relayed is told less, by at
    # most that answer's length (a race that a busy machine widens).
    engine_cached = totals["prism:cached_tokens_total"]
    told_cached = summary["total_cached_tokens"]
    assert 0 < told_cached <= engine_cached
    assert engine_cached - told_cached <= summary["completed"] * MAX_TOKENS


def test_replay_unreachable_target(trace_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    target = f"http://127.0.0.1:{free_port()}"
    argv = ["replay", "--trace", str(trace_file), "--target", target, "--api", "sglang"]
    assert main([*argv, "--time-scale", "100", "--out", str(out)]) == 1
    summary = json.loads(out.read_text())["summary"]
    assert summary["completed"] == 0 and summary["failed"] == 40
    assert sum(summary["errors"].values()) == 40
    assert summary["hit_rate"] is None and summary["p99_ttft_ms"] is None


def _record(rid: str, ttft: float, prompt: int, cached: int, lane: str | None, hot: bool):
    return RequestRecord(
        rid=rid,
        arrival_s=0.0,
        send_lag_ms=0.0,
        success=True,
        ttft_ms=ttft,
        e2e_latency_ms=ttft + 100.0,
        prompt_tokens=prompt,
        completion_tokens=4,
        cached_tokens=cached,
        hot=hot,
        lane=lane,
        status=200,
    )


def test_summary_by_hand() -> None:
    records = [
        _record("a", 100.0, 100, 50, "hot", True),
        _record("b", 200.0, 100, 0, "cold", False),
        _record("c", 300.0, 200, 150, "hot", True),
        RequestRecord("d", 0.0, 0.0, False, None, None, None, None, None, False, None, 502, "x"),
    ]
    s = summarize(records, duration_s=2.0, request_rate=5.0)
    assert s["completed"] == 3 and s["failed"] == 1 and s["errors"] == {"x": 1}
    assert s["request_throughput"] == 1.5  # 3 completed / 2 s
    assert s["hit_rate"] == pytest.approx(200 / 400)  # (50+0+150) / (100+100+200)
    assert s["mean_ttft_ms"] == pytest.approx(200.0) and s["median_ttft_ms"] == 200.0
    # numpy's linear percentile over [100, 200, 300]: 100 + 0.99·200 = 298.
    assert s["p99_ttft_ms"] == pytest.approx(298.0)
    assert s["lanes"]["hot"]["completed"] == 2
    assert s["lanes"]["hot"]["hit_rate"] == pytest.approx(200 / 300)
    assert s["lanes"]["cold"]["hit_rate"] == 0.0
    assert s["hot"]["completed"] == 2 and s["cold"]["completed"] == 1
    assert s["output_throughput"] == 6.0  # 12 tokens / 2 s
    assert s["concurrency"] == pytest.approx((200 + 300 + 400) / 1000 / 2.0)


async def test_replay_is_open_loop() -> None:
    """The server answers nothing until it has received every request: a replay that
    waited for answers before sending the next would never finish."""
    from aiohttp import web

    num_requests = 12
    received: list[str] = []
    all_in = asyncio.Event()

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        received.append(body["rid"])
        if len(received) == num_requests:
            all_in.set()
        await all_in.wait()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        meta = {"prompt_tokens": 10, "completion_tokens": 0, "cached_tokens": 4}
        await response.write(f"data: {json.dumps({'text': '', 'meta_info': meta})}\n\n".encode())
        for n in (1, 2):
            meta = {**meta, "completion_tokens": n}
            chunk = {"text": "x" * n, "meta_info": meta}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        params = RagTraceParams(passages=20, hot_set=4, num_requests=num_requests, qps=20.0)
        header, requests = build_rag_trace(params, 5, load_tokenizer("builtin"))
        trace = Trace(header=header, requests=tuple(requests))
        config = ReplayConfig(
            target=f"http://127.0.0.1:{port}", api="sglang", time_scale=20.0, model="m"
        )
        results = await asyncio.wait_for(replay(trace, config), timeout=60)
    finally:
        await runner.cleanup()
    assert received == [r.rid for r in requests]  # sent in arrival order
    summary = results["summary"]
    assert summary["completed"] == num_requests
    assert summary["hit_rate"] == pytest.approx(0.4)
    assert summary["total_output_tokens"] == 2 * num_requests


def test_parse_openai_stream_chunks() -> None:
    from loadgen.clients.apis import build_request, parse_event

    role = parse_event("openai", {"choices": [{"delta": {"role": "assistant", "content": ""}}]})
    assert not role.has_content
    text = parse_event("openai", {"choices": [{"delta": {"content": "Hi"}}]})
    assert text.has_content
    usage = {"prompt_tokens": 50, "completion_tokens": 3}
    usage["prompt_tokens_details"] = {"cached_tokens": 20}
    last = parse_event("prism", {"choices": [], "usage": usage})
    assert (last.prompt_tokens, last.completion_tokens, last.cached_tokens) == (50, 3, 20)
    assert parse_event("sglang", {"error": {"message": "boom"}}).error == "boom"
    _, requests = build_rag_trace(
        RagTraceParams(passages=20, hot_set=4, num_requests=1, k=2, hot_count=1),
        0,
        load_tokenizer("builtin"),
    )
    path, body = build_request("prism", requests[0], "m")
    assert path == "/v1/chat/completions" and body["stream"] is True
    hints = body["prism"]
    assert [s["id"] for s in hints["segments"]] == [s.id for s in requests[0].segments]
    assert hints["suffix"] == requests[0].suffix and hints["reorder"] is True
    assert body["messages"][-1]["content"].endswith(requests[0].suffix)
    path, body = build_request("sglang", requests[0], "m")
    assert path == "/generate" and body["text"].startswith(requests[0].system)
    assert body["sampling_params"]["max_new_tokens"] == 32
    path, body = build_request("openai", requests[0], "m")
    assert "prism" not in body
