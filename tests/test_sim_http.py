"""The simulated engine's SGLang HTTP API, through real HTTP on loopback (SPEC §7).

The app runs in-process on an aiohttp `AppRunner` (port 0) at a high `--speed`; one
test starts the real CLI as a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.stack.processes import run_server
from prism_sim.engine import SimConfig, SimEngine
from prism_sim.server import create_app, start_site
from prism_tokens.tokenizer import Tokenizer, load_tokenizer

SPEED = 200.0


@dataclass
class Sim:
    url: str
    engine: SimEngine
    http: aiohttp.ClientSession


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_tokenizer(None)


@pytest.fixture
async def sim(tokenizer: Tokenizer) -> AsyncIterator[Sim]:
    config = SimConfig(speed=SPEED)
    engine = SimEngine(config, tokenizer=tokenizer)
    runner = await start_site(create_app(config, engine), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    async with aiohttp.ClientSession() as http:
        yield Sim(f"http://{host}:{port}", engine, http)
    await runner.cleanup()


async def post(sim: Sim, path: str, body: object) -> tuple[int, object]:
    async with sim.http.post(sim.url + path, json=body) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except json.JSONDecodeError:
            return resp.status, text


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[object]:
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


async def metrics(sim: Sim) -> dict[str, float]:
    async with sim.http.get(sim.url + "/metrics") as resp:
        text = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def test_generate_with_text(sim: Sim, tokenizer: Tokenizer) -> None:
    text = "Summarize the passage about the river and the old mill."
    status, body = await post(
        sim, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 6}}
    )
    assert status == 200 and isinstance(body, dict)
    meta = body["meta_info"]
    assert meta["prompt_tokens"] == len(tokenizer.encode(text))
    assert meta["completion_tokens"] == 6 == len(body["output_ids"])
    assert body["text"] == tokenizer.decode(body["output_ids"])
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["cached_tokens"] == 0
    assert meta["e2e_latency"] > 0


async def test_generate_with_input_ids_rid_and_kv_hints(sim: Sim) -> None:
    hints = {"prism": {"anchors": [{"kind": "system", "segment_id": None, "offset": 3}]}}
    body_in = {
        "input_ids": [11, 12, 13, 14, 15],
        "rid": "my-rid-1",
        "kv_hints": hints,
        "sampling_params": {"max_new_tokens": 2},
    }
    status, body = await post(sim, "/generate", body_in)
    assert status == 200 and isinstance(body, dict)
    assert body["meta_info"]["id"] == "my-rid-1"
    assert body["meta_info"]["prompt_tokens"] == 5


async def test_batch_generate_returns_a_list(sim: Sim) -> None:
    status, body = await post(
        sim,
        "/generate",
        {"input_ids": [[1, 2, 3], [4, 5]], "sampling_params": {"max_new_tokens": 2}},
    )
    assert status == 200 and isinstance(body, list)
    assert [b["meta_info"]["prompt_tokens"] for b in body] == [3, 2]


async def test_cached_tokens_equal_the_shared_prefix(sim: Sim) -> None:
    shared = list(range(2000, 2050))
    first = {"input_ids": [*shared, 1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
    second = {"input_ids": [*shared, 7, 8], "sampling_params": {"max_new_tokens": 2}}
    _, a = await post(sim, "/generate", first)
    _, b = await post(sim, "/generate", second)
    assert isinstance(a, dict) and isinstance(b, dict)
    assert a["meta_info"]["cached_tokens"] == 0
    assert b["meta_info"]["cached_tokens"] == 50
    m = await metrics(sim)
    assert m["sglang:cached_tokens_total"] == 50
    assert m["sglang:prompt_tokens_total"] == 53 + 52


async def test_streaming_is_cumulative_and_ends_with_done(sim: Sim, tokenizer: Tokenizer) -> None:
    body = {"input_ids": [21, 22, 23], "stream": True, "sampling_params": {"max_new_tokens": 5}}
    async with sim.http.post(sim.url + "/generate", json=body) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [e async for e in sse_events(resp)]
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    assert len(chunks) == len(events) - 1 >= 1
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    final = chunks[-1]
    assert len(final["output_ids"]) == 5
    assert final["text"] == tokenizer.decode(final["output_ids"])
    assert final["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    # As SGLang: e2e_latency (modeled seconds) only on the finished chunk.
    assert all("e2e_latency" not in c["meta_info"] for c in chunks[:-1])
    assert final["meta_info"]["e2e_latency"] > 0


async def test_a_streamed_batch_interleaves_its_answers_by_index(sim: Sim) -> None:
    """As SGLang's `_stream_batch_responses`: each prompt's chunks carry its `index`,
    cumulative per answer, and every answer ends with its finish reason; then one
    `[DONE]`. A client that leaves aborts every answer of the batch."""
    body = {"input_ids": [[51, 52, 53], [54, 55]], "stream": True,
            "sampling_params": [{"max_new_tokens": 4}, {"max_new_tokens": 6}]}  # fmt: skip
    async with sim.http.post(sim.url + "/generate", json=body) as resp:
        assert resp.status == 200
        events = [e async for e in sse_events(resp)]
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    by_index = {i: [c for c in chunks if c["index"] == i] for i in (0, 1)}
    assert len(chunks) == sum(len(answer) for answer in by_index.values())
    for i, (prompt, tokens) in enumerate([(3, 4), (2, 6)]):
        answer = by_index[i]
        ids = [c["output_ids"] for c in answer]
        assert all(b[: len(a)] == a for a, b in itertools.pairwise(ids))
        final = answer[-1]["meta_info"]
        assert final["prompt_tokens"] == prompt and final["completion_tokens"] == tokens
        assert final["finish_reason"]["type"] == "length"
        assert all(c["meta_info"]["finish_reason"] is None for c in answer[:-1])
    long_batch = {**body, "sampling_params": {"max_new_tokens": 100_000}}
    async with aiohttp.ClientSession() as own:
        resp = await own.post(sim.url + "/generate", json=long_batch)
        await resp.content.readline()  # the first chunk arrived: both are running
        resp.close()
    await wait_for(lambda: sim.engine.scheduler.stats.num_aborted_total == 2)
    assert sim.engine.scheduler.num_running == 0


async def test_abort_of_a_running_stream_ends_it_with_abort(sim: Sim) -> None:
    # 100k decode tokens would take ~600 modeled seconds; the abort comes after chunk 1.
    body = {
        "input_ids": [31, 32, 33],
        "rid": "to-abort",
        "stream": True,
        "sampling_params": {"max_new_tokens": 100_000},
    }
    events: list[object] = []
    async with sim.http.post(sim.url + "/generate", json=body) as resp:
        async for event in sse_events(resp):
            events.append(event)
            if len(events) == 1:
                status, _ = await post(sim, "/abort_request", {"rid": "to-abort"})
                assert status == 200
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert isinstance(last, dict)
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 100_000
    m = await metrics(sim)
    assert m["sglang:num_aborted_requests_total"] == 1
    assert m["sglang:num_running_reqs"] == 0
    # Aborted after admission: its tokens count (as SGLang), not as a normal finish.
    assert m["sglang:prompt_tokens_total"] == 3
    assert m["sglang:generation_tokens_total"] == last["meta_info"]["completion_tokens"]
    assert m["sglang:num_requests_total"] == 0


async def test_client_disconnect_aborts_the_request(sim: Sim) -> None:
    body = {"input_ids": [41, 42], "stream": True, "sampling_params": {"max_new_tokens": 100_000}}
    async with aiohttp.ClientSession() as own:
        resp = await own.post(sim.url + "/generate", json=body)
        await resp.content.readline()  # first chunk arrived: the request is running
        resp.close()
    await wait_for(lambda: sim.engine.scheduler.num_running == 0)
    assert sim.engine.scheduler.stats.num_aborted_total == 1
    assert sim.engine.scheduler.cache.protected_size() == 0


async def test_flush_cache_empties_the_tree_and_is_refused_while_busy(sim: Sim) -> None:
    ids = list(range(3000, 3040))
    req = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}
    await post(sim, "/generate", req)
    _, again = await post(sim, "/generate", req)
    assert isinstance(again, dict) and again["meta_info"]["cached_tokens"] == 39
    long_body = {"input_ids": [5, 6], "rid": "busy", "stream": True,
                 "sampling_params": {"max_new_tokens": 100_000}}  # fmt: skip
    async with sim.http.post(sim.url + "/generate", json=long_body) as resp:
        await resp.content.readline()
        async with sim.http.post(sim.url + "/flush_cache") as flush:
            assert flush.status == 400
        await post(sim, "/abort_request", {"rid": "busy"})
        _ = [e async for e in sse_events(resp)]
    async with sim.http.post(sim.url + "/flush_cache") as flush:
        assert flush.status == 200
    _, after = await post(sim, "/generate", req)
    assert isinstance(after, dict) and after["meta_info"]["cached_tokens"] == 0


async def test_bad_requests_get_400(sim: Sim) -> None:
    status, body = await post(sim, "/generate", {"sampling_params": {"max_new_tokens": 2}})
    assert status == 400 and "error" in body  # type: ignore[operator]
    too_long = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 10_000_000}}
    status, _ = await post(sim, "/generate", too_long)
    assert status == 400  # needs more KV than the whole pool
    async with sim.http.post(sim.url + "/generate", data=b"{not json") as resp:
        assert resp.status == 400
    zero = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}}
    status, body = await post(sim, "/generate", zero)
    assert status == 400 and "max_new_tokens" in body["error"]["message"]  # type: ignore[index]
    status, body = await post(sim, "/v1/completions", {"prompt": [1, 2], "max_tokens": 0})
    assert status == 400 and "max_tokens" in body["error"]["message"]  # type: ignore[index]
    status, body = await post(sim, "/v1/completions", {"prompt": ["one", "two"]})
    assert status == 400 and "prompt must be" in body["error"]["message"]  # type: ignore[index]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}
    status, body = await post(sim, "/v1/chat/completions", chat)
    assert status == 400 and "max_tokens" in body["error"]["message"]  # type: ignore[index]
    assert sim.engine.scheduler.stats.num_requests_total == 0  # nothing was queued


async def test_metrics_use_sglang_names(sim: Sim) -> None:
    await post(
        sim, "/generate", {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 3}}
    )
    async with sim.http.get(sim.url + "/metrics") as resp:
        text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for gauge in ("num_running_reqs", "num_queue_reqs", "num_used_tokens", "token_usage",
                  "cache_hit_rate", "gen_throughput"):  # fmt: skip
        assert families[f"sglang:{gauge}"].type == "gauge"
    for counter in ("prompt_tokens", "generation_tokens", "cached_tokens", "num_requests",
                    "evicted_tokens"):  # fmt: skip
        assert families[f"sglang:{counter}"].type == "counter"
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                 "queue_time_seconds", "inter_token_latency_seconds"):  # fmt: skip
        assert families[f"sglang:{hist}"].type == "histogram"
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    model = ("model_name", sim.engine.model_name)
    non_stream = (("is_streaming", "false"), model)
    # SGLang's label sets: `is_streaming` on token/request counters, `cache_source`.
    assert samples[("sglang:prompt_tokens_total", non_stream)] == 4
    assert samples[("sglang:prompt_tokens_total", (("is_streaming", "true"), model))] == 0
    assert samples[("sglang:generation_tokens_total", non_stream)] == 3
    assert samples[("sglang:num_requests_total", non_stream)] == 1
    assert samples[("sglang:cached_tokens_total", (("cache_source", "total"), model))] == 0
    assert samples[("sglang:time_to_first_token_seconds_count", non_stream)] == 1
    assert samples[("sglang:inter_token_latency_seconds_count", (model,))] == 2
    assert samples[("sglang:evicted_tokens_total", (model,))] == 0


async def test_info_and_health_endpoints(sim: Sim) -> None:
    for path in ("/health", "/ready", "/health_generate"):
        async with sim.http.get(sim.url + path) as resp:
            assert resp.status == 200
    for path in ("/model_info", "/get_model_info"):
        async with sim.http.get(sim.url + path) as resp:
            info = await resp.json()
        assert info["model_path"] == sim.engine.model_path and info["is_generation"] is True
    for path in ("/server_info", "/get_server_info"):
        async with sim.http.get(sim.url + path) as resp:
            info = await resp.json()
        assert info["max_total_num_tokens"] == sim.engine.profile.kv_capacity_tokens
        assert info["schedule_policy"] == "fcfs" and info["speed"] == SPEED


async def test_openai_endpoints_with_the_openai_client(sim: Sim, tokenizer: Tokenizer) -> None:
    client = openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused")
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == [sim.engine.model_name]

        prompt = [*range(4000, 4030), 9]
        done = await client.completions.create(model="m", prompt=prompt, max_tokens=4)
        assert done.object == "text_completion"
        assert done.choices[0].finish_reason == "length"
        assert done.usage is not None and done.usage.prompt_tokens == 31
        again = await client.completions.create(
            model="m", prompt=[*range(4000, 4030), 8], max_tokens=4
        )
        assert again.usage is not None and again.usage.prompt_tokens_details is not None
        assert again.usage.prompt_tokens_details.cached_tokens == 30

        pieces = []
        stream = await client.completions.create(
            model="m", prompt="Tell me", max_tokens=5, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        usage = None
        async for chunk in stream:
            pieces += [c.text for c in chunk.choices]
            usage = chunk.usage or usage
        assert usage is not None and usage.completion_tokens == 5
        assert "".join(pieces) == tokenizer.decode(sim.engine.scheduler.filler_ids[:5])

        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        chat = await client.chat.completions.create(model="m", messages=messages, max_tokens=3)  # type: ignore[arg-type]
        assert chat.object == "chat.completion"
        assert chat.choices[0].message.role == "assistant"
        expected_prompt = tokenizer.encode(tokenizer.render_chat(messages))
        assert chat.usage is not None and chat.usage.prompt_tokens == len(expected_prompt)

        deltas = []
        chat_stream = await client.chat.completions.create(
            model="m",
            messages=messages,
            max_tokens=3,
            stream=True,  # type: ignore[arg-type]
        )
        async for chunk in chat_stream:
            assert chunk.object == "chat.completion.chunk"
            deltas += [c.delta.content or "" for c in chunk.choices]
        assert "".join(deltas) == chat.choices[0].message.content
    finally:
        await client.close()


def test_cli_subprocess_serves_generate(tmp_path) -> None:
    args = ["--speed", "100", "--log-level", "warning", "--max-running-requests", "7",
            "--kv-capacity-tokens", "50000", "--schedule-policy", "lpm"]  # fmt: skip
    with run_server("prism_sim", args, log_dir=tmp_path) as server:
        info = httpx.get(server.url + "/server_info", timeout=10).json()
        assert info["max_running_requests"] == 7
        assert info["max_total_num_tokens"] == 50000
        assert info["schedule_policy"] == "lpm"
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
        out = httpx.post(server.url + "/generate", json=body, timeout=10).json()
        assert out["meta_info"]["completion_tokens"] == 2


async def wait_for(predicate, attempts: int = 400) -> None:
    for _ in range(attempts):
        if predicate():
            return
        await asyncio.sleep(0.025)
    raise AssertionError("condition not reached")


async def test_non_streaming_client_disconnect_aborts_too(sim: Sim) -> None:
    body = {"input_ids": [51, 52], "sampling_params": {"max_new_tokens": 100_000}}

    async def call() -> None:
        async with aiohttp.ClientSession() as own, own.post(sim.url + "/generate", json=body):
            pass

    task = asyncio.create_task(call())
    await wait_for(lambda: sim.engine.scheduler.num_running == 1)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await wait_for(lambda: sim.engine.scheduler.num_running == 0)
    assert sim.engine.scheduler.stats.num_aborted_total == 1


async def test_abort_all_aborts_every_request(sim: Sim) -> None:
    body = {"input_ids": [61, 62], "stream": True, "sampling_params": {"max_new_tokens": 100_000}}
    async with (
        sim.http.post(sim.url + "/generate", json=body) as first,
        sim.http.post(sim.url + "/generate", json=body) as second,
    ):
        await first.content.readline()
        await second.content.readline()
        status, _ = await post(sim, "/abort_request", {"abort_all": True})
        assert status == 200
        ends = [[e async for e in sse_events(r)] for r in (first, second)]
    for events in ends:
        assert events[-1] == "[DONE]"
        assert events[-2]["meta_info"]["finish_reason"]["type"] == "abort"  # type: ignore[index]


async def test_incremental_streaming_output(tokenizer: Tokenizer) -> None:
    config = SimConfig(speed=SPEED, incremental_streaming_output=True)
    runner = await start_site(create_app(config, SimEngine(config, tokenizer)), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    body = {"input_ids": [71, 72, 73], "stream": True, "sampling_params": {"max_new_tokens": 6}}
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"http://{host}:{port}/generate", json=body) as resp,
        ):
            chunks = [e async for e in sse_events(resp) if isinstance(e, dict)]
    finally:
        await runner.cleanup()
    ids = [t for c in chunks for t in c["output_ids"]]
    assert len(ids) == 6
    assert "".join(c["text"] for c in chunks) == tokenizer.decode(ids)


async def test_model_info_reports_the_tokenizer_directory(tmp_path) -> None:
    from prism_tokens.builtin import ensure_builtin

    model_dir = str(ensure_builtin(tmp_path))
    config = SimConfig(speed=SPEED, tokenizer=model_dir, served_model_name="my-model")
    runner = await start_site(create_app(config), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{host}:{port}/model_info") as resp:
                info = await resp.json()
            async with http.get(f"http://{host}:{port}/v1/models") as resp:
                models = await resp.json()
    finally:
        await runner.cleanup()
    assert info["model_path"] == model_dir
    assert models["data"][0]["id"] == "my-model" and models["data"][0]["root"] == model_dir


async def test_abort_matches_rid_prefixes_like_sglang(sim: Sim) -> None:
    def body(rid: str) -> dict[str, object]:
        return {"input_ids": [81, 82], "rid": rid, "stream": True,
                "sampling_params": {"max_new_tokens": 100_000}}  # fmt: skip

    async with (
        sim.http.post(sim.url + "/generate", json=body("job-1")) as one,
        sim.http.post(sim.url + "/generate", json=body("job-12")) as twelve,
        sim.http.post(sim.url + "/generate", json=body("other")) as other,
    ):
        for resp in (one, twelve, other):
            await resp.content.readline()
        await post(sim, "/abort_request", {"rid": "job"})  # no such rid: nothing happens
        assert sim.engine.scheduler.num_running == 3
        await post(sim, "/abort_request", {"rid": "job-1"})  # job-1 and job-12
        for resp in (one, twelve):
            events = [e async for e in sse_events(resp)]
            assert events[-2]["meta_info"]["finish_reason"]["type"] == "abort"  # type: ignore[index]
        assert sim.engine.scheduler.num_running == 1
        await post(sim, "/abort_request", {"rid": "other"})
        _ = [e async for e in sse_events(other)]


async def test_a_crashed_engine_loop_fails_requests_and_health(tokenizer: Tokenizer) -> None:
    config = SimConfig(speed=SPEED)
    engine = SimEngine(config, tokenizer)
    original = engine.scheduler.complete_batch

    def crash_on_decode(batch, now):  # type: ignore[no-untyped-def]
        if batch.kind == "decode":
            raise RuntimeError("boom")
        return original(batch, now)

    engine.scheduler.complete_batch = crash_on_decode  # type: ignore[method-assign]
    runner = await start_site(create_app(config, engine), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    body = {"input_ids": [91, 92], "sampling_params": {"max_new_tokens": 5}}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/generate", json=body) as resp:
                out = await resp.json()
            assert out["meta_info"]["finish_reason"]["type"] == "abort"
            assert "boom" in out["meta_info"]["finish_reason"]["message"]
            async with http.get(url + "/health") as resp:
                assert resp.status == 503
            async with http.post(url + "/generate", json=body) as resp:
                assert resp.status == 503
    finally:
        await runner.cleanup()


async def test_a_streamed_chats_first_line_comes_after_its_prefill(tokenizer: Tokenizer) -> None:
    """As SGLang's chat stream, the first chunk (the role) comes with the engine's first
    output, not when the stream opens: a proxy counts the request as pending prefill
    until its first line. Here the chat waits for the pool, which a running request's
    reservation fills, and nothing of it arrives until that one is aborted."""
    config = SimConfig(speed=1.0, kv_capacity_tokens=4096)
    engine = SimEngine(config, tokenizer=tokenizer)
    runner = await start_site(create_app(config, engine), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    hog = {"input_ids": [31, 32, 33], "rid": "hog", "stream": True,
           "sampling_params": {"max_new_tokens": 4000}}  # fmt: skip
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stream": True}  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            running = await http.post(url + "/generate", json=hog)
            await running.content.readline()  # decoding: its reservation holds the pool
            waiting = await http.post(url + "/v1/chat/completions", json=chat)
            assert waiting.status == 200
            await wait_for(lambda: len(engine.scheduler.waiting) == 1)
            async with http.get(url + "/health"):  # the server has had its turns
                pass
            assert waiting.content.total_bytes == 0  # not a line before its prefill
            async with http.post(url + "/abort_request", json={"rid": "hog"}) as aborted:
                assert aborted.status == 200
            events = [e async for e in sse_events(waiting)]
            running.close()
    finally:
        await runner.cleanup()
    first = events[0]
    assert isinstance(first, dict)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1] == "[DONE]" and len(events) > 2
