"""Prefill pacing through real HTTP (SPEC §2): the proxy always streams from the
backend, assembles answers for non-streaming clients, and holds requests back while
`B` of them wait for their first token."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from aiohttp import web
from proxy_support import eventually, loopback_app, running_proxy

from prism_proxy.app import RunningProxy
from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.edge.openai_format import TokenUsage
from prism_sim.engine import SimConfig, SimEngine
from prism_sim.server import create_app, start_site
from prism_tokens.tokenizer import load_tokenizer

PROMPT = "Summarise the report on the northern river crossings."


@contextlib.asynccontextmanager
async def _sim(incremental: bool) -> AsyncIterator[str]:
    config = SimConfig(speed=50.0, incremental_streaming_output=incremental)
    runner = await start_site(create_app(config, SimEngine(config)), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
async def test_non_streaming_answers_are_assembled_from_the_backend_stream(
    incremental: bool,
) -> None:
    """Whatever the backend's stream mode, a non-streaming client gets what the backend
    answers a non-streaming `/generate` with: the same text, ids and token counts."""
    ids = load_tokenizer("builtin").encode(PROMPT)
    sampling = {"max_new_tokens": 9}
    async with (
        _sim(incremental) as sim_url,
        running_proxy(sim_url) as proxy,
        aiohttp.ClientSession() as http,
    ):
        async with http.post(
            sim_url + "/generate", json={"input_ids": ids, "sampling_params": sampling}
        ) as response:
            direct = await response.json()
        async with http.post(
            proxy.url + "/generate",
            json={"input_ids": ids, "sampling_params": sampling, "rid": "mine"},
        ) as response:
            assert response.status == 200
            via_proxy = await response.json()
        assert via_proxy["text"] == direct["text"] and via_proxy["text"]
        assert via_proxy["output_ids"] == direct["output_ids"]
        assert len(via_proxy["output_ids"]) == 9
        meta, expected = via_proxy["meta_info"], direct["meta_info"]
        assert meta["id"] == "mine"
        assert meta["finish_reason"] == expected["finish_reason"] == {"type": "length", "length": 9}
        for key in ("prompt_tokens", "completion_tokens"):
            assert meta[key] == expected[key]
        # the direct call cached the prompt, but that was no client of the proxy's: the
        # proxy's client is not told (`prompts.sharing`) until the prompt is its own
        assert meta["cached_tokens"] == 0
        body = {"input_ids": ids, "sampling_params": sampling}
        async with http.post(proxy.url + "/generate", json=body) as response:
            assert (await response.json())["meta_info"]["cached_tokens"] == len(ids) - 1

        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused")
        chat = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": PROMPT}], max_tokens=9
        )
        completion = await client.completions.create(model="m", prompt=PROMPT, max_tokens=9)
        await client.close()
        # The simulated engine answers with the same filler tokens for every prompt.
        assert chat.choices[0].message.content == direct["text"]
        assert completion.choices[0].text == direct["text"]
        assert chat.choices[0].finish_reason == completion.choices[0].finish_reason == "length"
        assert chat.usage.completion_tokens == completion.usage.completion_tokens == 9


class HeldBackend:
    """A `/generate` stub that answers every stream's first chunk only when told, then
    decodes until told to finish: it shows what the proxy releases when."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.first = asyncio.Event()
        self.finish = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/abort_request", self.abort)
        return app

    async def abort(self, request: web.Request) -> web.Response:
        return web.Response()

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await self.first.wait()
        meta = {"prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": 1}
        chunk = {"text": "a", "output_ids": [1], "meta_info": meta}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await self.finish.wait()
        meta = {**meta, "completion_tokens": 2, "finish_reason": {"type": "length"}}
        chunk = {"text": "ab", "output_ids": [1, 2], "meta_info": meta}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
        return response


HELD_BODY = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}


@contextlib.asynccontextmanager
async def _held_proxy(
    prefill_batch: int,
) -> AsyncIterator[tuple[HeldBackend, RunningProxy, aiohttp.ClientSession]]:
    """A proxy with a fixed `B` in front of a `HeldBackend`, and a client session."""
    backend = HeldBackend()
    async with (
        loopback_app(backend.app()) as url,
        running_proxy(url, prefill_batch=prefill_batch, window_ms=0, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as http,
    ):
        yield backend, proxy, http


async def test_pending_prefill_holds_releases_until_first_tokens() -> None:
    async with _held_proxy(prefill_batch=2) as (backend, proxy, http):
        admission = proxy.app[GATEWAY].admission

        async def call() -> dict:
            async with http.post(proxy.url + "/generate", json=HELD_BODY) as response:
                return await response.json()

        calls = [asyncio.create_task(call()) for _ in range(5)]
        await eventually(lambda: len(backend.received) == 2 and admission.queue_depth == 3)
        await asyncio.sleep(0.05)  # give a wrong release the chance to happen
        assert len(backend.received) == 2 and admission.pending_prefill == 2
        assert all(b["stream"] is True for b in backend.received)  # always streamed

        backend.first.set()  # every request decodes from now on: none counts against B
        await eventually(lambda: len(backend.received) == 5)
        await eventually(lambda: admission.pending_prefill == 0 and admission.inflight == 5)
        assert admission.pacing.uncached_tokens < 1024  # 6 uncached tokens were reported
        backend.finish.set()
        answers = await asyncio.gather(*calls)
        assert [a["text"] for a in answers] == ["ab"] * 5
        assert admission.inflight == 0 and admission.queue_depth == 0


async def test_a_client_leaving_while_pending_frees_its_place_at_once() -> None:
    async with _held_proxy(prefill_batch=1) as (backend, proxy, http):
        admission = proxy.app[GATEWAY].admission

        async def call() -> int:
            async with http.post(proxy.url + "/generate", json=HELD_BODY) as response:
                await response.read()
                return response.status

        leaver = asyncio.create_task(call())
        await eventually(lambda: len(backend.received) == 1)
        stayer = asyncio.create_task(call())
        await eventually(lambda: admission.queue_depth == 1)
        leaver.cancel()  # pending prefill, not one token yet
        with contextlib.suppress(asyncio.CancelledError):
            await leaver
        await eventually(lambda: len(backend.received) == 2)
        assert admission.pending_prefill == 1 and admission.inflight == 1
        backend.first.set()
        backend.finish.set()
        assert await stayer == 200
        await eventually(lambda: admission.inflight == 0 and admission.pending_prefill == 0)


class HeldChatBackend(HeldBackend):
    """The same for SGLang's `/v1/chat/completions`: OpenAI chunks when streamed, one
    answer (only when told to finish) when not."""

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        usage = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11,
                 "prompt_tokens_details": {"cached_tokens": 3}}  # fmt: skip
        if not body.get("stream"):
            await self.finish.wait()
            message = {"role": "assistant", "content": "ab"}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response({"id": "x", "choices": [choice], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(chunk: dict) -> None:
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        def chunk(delta: dict, finish: str | None = None) -> dict:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return {"id": "x", "created": 1, "model": "m", "choices": [choice]}

        await self.first.wait()
        await send(chunk({"role": "assistant", "content": ""}))
        await send(chunk({"content": "a"}))
        await self.finish.wait()
        await send(chunk({"content": "b"}, "stop"))
        await send({"id": "x", "created": 1, "model": "m", "choices": [], "usage": usage})
        await response.write(b"data: [DONE]\n\n")
        return response


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CHAT_WITH_TOOLS = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "tools": [TOOL], "max_tokens": 2}  # fmt: skip


async def test_a_non_streamed_passthrough_leaves_pending_prefill_at_its_first_token() -> None:
    """The pacing squat: a client that did not ask to stream (here a chat with tools,
    which the engine's own endpoint serves) used to count as pending prefill until its
    whole answer came back, holding `B` for everyone. The proxy streams it from the
    engine anyway, frees its place at the first chunk and assembles the answer."""
    backend = HeldChatBackend()
    async with (
        loopback_app(backend.app()) as url,
        running_proxy(url, prefill_batch=1, window_ms=0, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as http,
    ):
        admission = proxy.app[GATEWAY].admission

        async def call(body: dict) -> dict:
            async with http.post(proxy.url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200, await response.text()
                return await response.json()

        squatter = asyncio.create_task(call(CHAT_WITH_TOOLS))
        await eventually(lambda: len(backend.received) == 1)
        assert backend.received[0]["stream"] is True
        assert backend.received[0]["stream_options"] == {"include_usage": True}
        other = asyncio.create_task(call(CHAT_WITH_TOOLS))
        await eventually(lambda: admission.queue_depth == 1)  # B = 1: held back
        backend.first.set()  # the squatter decodes now: the other goes through
        await eventually(lambda: len(backend.received) == 2)
        await eventually(lambda: admission.pending_prefill == 0 and admission.inflight == 2)
        assert not squatter.done()
        backend.finish.set()
        for answer in await asyncio.gather(squatter, other):
            assert answer["object"] == "chat.completion"
            assert answer["choices"][0]["message"]["content"] == "ab"
            assert answer["choices"][0]["finish_reason"] == "stop"
            assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}


async def test_a_request_the_engine_cannot_stream_takes_no_place_in_pacing() -> None:
    """SGLang refuses to stream `return_meta_info` (and prompt or output token ids):
    such a request is forwarded as asked, and since its first token cannot be seen it
    never counts against `B`."""
    backend = HeldChatBackend()
    async with (
        loopback_app(backend.app()) as url,
        running_proxy(url, prefill_batch=1, window_ms=0, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as http,
    ):
        admission = proxy.app[GATEWAY].admission
        body = {**CHAT_WITH_TOOLS, "return_meta_info": True}
        blind = asyncio.create_task(http.post(proxy.url + "/v1/chat/completions", json=body))
        await eventually(lambda: len(backend.received) == 1)
        assert "stream" not in backend.received[0]
        await eventually(lambda: admission.pending_prefill == 0 and admission.inflight == 1)
        backend.first.set()
        backend.finish.set()
        response = await blind
        assert response.status == 200
        assert (await response.json())["choices"][0]["message"]["content"] == "ab"
        response.release()


@pytest.mark.parametrize(
    "stream, client_usage",
    [(True, True), (True, False), (False, False)],
    ids=["streamed-with-usage", "streamed-without-usage", "whole"],
)
async def test_an_engine_served_answer_feeds_the_b_rule_with_its_usage(
    stream: bool, client_usage: bool
) -> None:
    """A chat the engine's own endpoint serves (here one with tools) says nothing of its
    cache at its first chunk; its usage at the end holds the prompt and cached tokens,
    and those uncached tokens feed `B` as a token-path first token's do. A client that
    streams without asking for usage is not sent it, but the proxy asks the engine for
    it all the same and learns as much."""
    long_chat = {**CHAT_WITH_TOOLS, "messages": [{"role": "user", "content": PROMPT * 60}]}
    async with (
        _sim(False) as sim_url,
        running_proxy(sim_url, window_ms=0, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as http,
    ):
        pacing = proxy.app[GATEWAY].admission.core.pacing
        before = pacing.uncached_tokens
        body = {**long_chat, "stream": stream}
        if client_usage:
            body["stream_options"] = {"include_usage": True}
        async with http.post(proxy.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
            text = await response.text()
        # the same chat straight from the engine (its prompt is cached by now)
        direct = {**long_chat, "stream": False}
        async with http.post(sim_url + "/v1/chat/completions", json=direct) as response:
            prompt_tokens = (await response.json())["usage"]["prompt_tokens"]
        if stream:
            events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
            chunks = [json.loads(event) for event in events if event != "[DONE]"]
            assert events[-1] == "[DONE]" and chunks[0]["choices"]
            relayed = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
            assert len(relayed) == (1 if client_usage else 0)
            assert all(chunk["choices"] for chunk in chunks[: len(chunks) - len(relayed)])
            usages = relayed
        else:
            usages = [json.loads(text)["usage"]]
        for usage in usages:
            assert usage["prompt_tokens"] == prompt_tokens
            assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        uncached = prompt_tokens  # the proxy's chat came first: nothing of it was cached
        assert uncached > before  # a long prompt
        # learnt at the answer's end, which the client may see first
        admission = proxy.app[GATEWAY].admission
        await eventually(lambda: admission.inflight == 0)
        assert pacing.uncached_tokens == pytest.approx(before + (uncached - before) / 16)


def test_usage_without_cached_tokens_says_nothing_of_the_cache() -> None:
    """SGLang's OpenAI usage holds `prompt_tokens_details` only with
    `--enable-cache-report`; without it the cached count is unknown, not 0."""
    known = TokenUsage.from_openai(
        {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}
    )
    unknown = TokenUsage.from_openai({"prompt_tokens": 9, "completion_tokens": 1})
    assert known is not None and known.cached_known and known.cached_tokens == 0
    assert unknown is not None and not unknown.cached_known
    assert unknown.told(3).cached_known is False


async def test_a_generate_batch_is_served_whole_or_streamed() -> None:
    """A batch on `/generate` goes to the engine's own endpoint, which the proxy asks
    to stream: a client that did not ask to stream gets the list of answers, one per
    prompt in order; one that did gets each answer's chunks with its `index`."""
    body = {"text": ["The sea", "The sky is"], "sampling_params": {"max_new_tokens": 3}}
    async with (
        _sim(False) as sim_url,
        running_proxy(sim_url, window_ms=0, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as http,
    ):
        async with http.post(sim_url + "/generate", json=body) as response:
            direct = await response.json()
        async with http.post(proxy.url + "/generate", json=body) as response:
            assert response.status == 200
            whole = await response.json()
        assert [a["text"] for a in whole] == [a["text"] for a in direct]
        assert [a["meta_info"]["prompt_tokens"] for a in whole] == [2, 3]
        async with http.post(proxy.url + "/generate", json={**body, "stream": True}) as response:
            assert response.status == 200
            lines = [line async for line in response.content if line.startswith(b"data:")]
        assert lines[-1].strip() == b"data: [DONE]"
        last = {}
        for line in lines[:-1]:
            chunk = json.loads(line[5:])
            last[chunk["index"]] = chunk
        assert [last[i]["text"] for i in (0, 1)] == [a["text"] for a in direct]
