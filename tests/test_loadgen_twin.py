"""The twin (`prism-loadgen simulate`): deterministic, the proxy's own ids and
anchors, pacing as the core defines it, and in agreement with the real-time stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.cli import main
from loadgen.clients.apis import chat_messages, client_order_ids, token_job
from loadgen.twin.twin import Twin, TwinSetup, simulate
from loadgen.workloads.rag_trace import RagTraceParams, build_rag_trace
from loadgen.workloads.trace_format import Trace, TraceRequest, read_trace
from prism_proxy.prompts.serializer import Serializer
from prism_tokens.chat import content_format, template_messages
from prism_tokens.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin")


@pytest.fixture(scope="module")
def trace(tokenizer) -> Trace:
    params = RagTraceParams(num_requests=300, qps=60.0)
    header, requests = build_rag_trace(params, 5, tokenizer)
    return Trace(header, tuple(requests))


def test_twin_is_deterministic_across_processes(tmp_path: Path) -> None:
    """Same seed, identical results, whatever Python's hash seed (sets of strings
    iterate differently under each)."""
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"run{hash_seed}"
        argv = ["-m", "loadgen", "simulate", "--out", str(out), "--qps", "70"]
        argv += ["--policies", "klpm,contextpilot-style,prism,sglang-lpm", "--num-requests", "200"]
        subprocess.run(
            [sys.executable, *argv, "--no-report"],
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            check=True,
            capture_output=True,
        )
        outputs.append({p.name: p.read_text() for p in sorted((out / "results").glob("*.json"))})
    assert len(outputs[0]) == 4
    assert outputs[0] == outputs[1]


def test_twin_sends_the_proxy_ids_and_paces_by_prefill(trace: Trace, tokenizer) -> None:
    setup = TwinSetup(policy="fifo", prefill_batch=3)
    twin = Twin(trace, setup, tokenizer)
    pending_seen: list[int] = []
    release = twin._release

    def watch(wave):  # the core's pending count right after each release
        release(wave)
        pending_seen.append(twin.core.pending_prefill)

    twin._release = watch
    records = twin.run()
    assert all(r.success for r in records) and len(records) == 300
    assert max(pending_seen) == 3  # B = 3, reached under load, never passed
    assert twin.core.inflight == 0 and twin.core.queue_depth == 0
    serializer = Serializer(tokenizer)
    # fifo releases each prompt in the client's order: the ids the proxy would send.
    for request in trace.requests[:20]:
        assert twin.tracked[request.rid].sim.input_ids == client_order_ids(request, serializer)


def test_twin_prism_reorders_and_places_anchors(trace: Trace, tokenizer) -> None:
    twin = Twin(trace, TwinSetup(policy="prism", eviction="dart"), tokenizer)
    records = twin.run()
    assert all(r.success for r in records)
    reordered = 0
    serializer = Serializer(tokenizer)
    for request in trace.requests:
        sim = twin.tracked[request.rid].sim
        assert sim.kv_hints is not None and sim.kv_hints["message_id"] == request.rid
        job = token_job(request, serializer)
        reordered += sim.input_ids != job.build(job.segments).prompt_fields["input_ids"]
    assert reordered > 50  # front alignment moved segments in many requests
    stats = twin.dart.stats()
    assert stats.anchors_resident > 0
    assert stats.epoch == len(twin.waves) and stats.table_size > 0  # one push per wave
    assert {r.lane for r in records} == {"hot", "cold"}


@pytest.mark.parametrize("layout", ["xml", "blank"])
def test_twin_serves_plain_chat_as_the_proxy_does(trace: Trace, tokenizer, layout) -> None:
    """`layout`: an unmodified client's plain chat; the twin finds the documents as the
    proxy does at its defaults. Under fifo the engine gets the client's text;
    under prism the documents are segments, reordered and anchored, and reuse more."""
    fifo = Twin(trace, TwinSetup(policy="fifo", layout=layout), tokenizer)
    assert all(r.success for r in fifo.run())
    for request in trace.requests[:20]:  # the client's text (each document tokenized alone)
        text = tokenizer.render_chat(chat_messages(request, layout))
        assert tokenizer.decode(fifo.tracked[request.rid].sim.input_ids) == text
    prism = Twin(trace, TwinSetup(policy="prism", eviction="dart", layout=layout), tokenizer)
    records = prism.run()
    assert all(r.success for r in records)
    moved = 0
    for request in trace.requests:
        tracked = prism.tracked[request.rid]
        assert tracked.job.segments and tracked.sim.kv_hints is not None
        moved += (
            tracked.sim.input_ids
            != tracked.job.build(tracked.job.segments).prompt_fields["input_ids"]
        )
    assert moved > 50
    assert prism.dart.stats().anchors_resident > 0
    hits = [summarize_hit(twin) for twin in (fifo, prism)]
    assert hits[1] > hits[0] + 0.10, hits


def test_twin_arranges_tool_results_as_the_proxy_does(trace: Trace, tokenizer) -> None:
    """`--set layout=tool`: the documents in a retrieval tool's result. Under fifo the
    engine gets the client's text; under prism each tool result is served most popular
    first, its text the client's documents in another order, and reuses more."""
    fmt = content_format(tokenizer.chat_template)

    def client_text(request: TraceRequest) -> str:  # as SGLang renders it (tool calls)
        return tokenizer.render_chat(template_messages(chat_messages(request, "tool"), fmt))

    fifo = Twin(trace, TwinSetup(policy="fifo", layout="tool"), tokenizer)
    assert all(r.success for r in fifo.run())
    for request in trace.requests[:20]:
        assert tokenizer.decode(fifo.tracked[request.rid].sim.input_ids) == client_text(request)
    prism = Twin(trace, TwinSetup(policy="prism", eviction="dart", layout="tool"), tokenizer)
    assert all(r.success for r in prism.run())
    arranged = 0
    for request in trace.requests:
        served = tokenizer.decode(prism.tracked[request.rid].sim.input_ids)
        client = client_text(request)
        assert sorted(served) == sorted(client)  # the same characters, other order
        arranged += served != client
    assert arranged > 50
    assert prism.tool_results.stats()["arranged"] == len(trace.requests)
    hits = [summarize_hit(twin) for twin in (fifo, prism)]
    assert hits[1] > hits[0] + 0.10, hits


def summarize_hit(twin: Twin) -> float:
    sims = [t.sim for t in twin.tracked.values()]
    return sum(s.cached_tokens for s in sims) / sum(len(s.input_ids) for s in sims)


def test_native_twin_has_no_proxy(trace: Trace, tokenizer) -> None:
    results = simulate(trace, TwinSetup(policy=None, schedule_policy="lpm"), tokenizer)
    assert results["proxy_state"] is None
    assert results["summary"]["completed"] == 300
    assert {r["lane"] for r in results["requests"]} == {None}


@pytest.mark.slow
def test_twin_agrees_with_the_real_time_stack(tmp_path: Path) -> None:
    """The same small trace through the real proxy and simulated engine over HTTP in
    real time, and through the twin: hit rates within 2 points for each policy."""
    argv = ["--qps", "40", "--num-requests", "240", "--policies", "fifo,prism,sglang-fcfs"]
    assert main(["sweep", "--out", str(tmp_path / "real"), *argv, "--no-report"]) == 0
    assert main(["simulate", "--out", str(tmp_path / "twin"), *argv, "--no-report"]) == 0
    for name in ("fifo", "prism", "sglang-fcfs"):
        real = json.loads((tmp_path / "real" / "results" / f"{name}_qps40.json").read_text())
        twin = json.loads((tmp_path / "twin" / "results" / f"{name}_qps40.json").read_text())
        assert real["summary"]["completed"] == twin["summary"]["completed"] == 240
        gap = abs(real["summary"]["hit_rate"] - twin["summary"]["hit_rate"])
        assert gap <= 0.02, (name, real["summary"]["hit_rate"], twin["summary"]["hit_rate"])
    # Both ran the same trace file format and the same prompts.
    traces = sorted((tmp_path / "real" / "traces").glob("*.jsonl"))
    assert [t.read_text() for t in traces] == [
        t.read_text() for t in sorted((tmp_path / "twin" / "traces").glob("*.jsonl"))
    ]
    assert read_trace(traces[0]).header.num_requests == 240
