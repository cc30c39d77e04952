"""Each input-edge defect of issue 12, reproduced against the real servers on loopback
(proxy in front of prism-sim, prism-sim alone, the DART control RPC): a clear 4xx, never
a 5xx, and the one-line configuration errors."""

from __future__ import annotations

import asyncio
import json
import logging
import threading

import aiohttp
import pytest
from aiohttp import web
from proxy_support import loopback_app, running_proxy

from backend_plugin.config import ControlConfig, ControlConfigError
from backend_plugin.control_rpc import create_control_app
from backend_plugin.dart.core import DartCore
from backend_plugin.dart.priority import MAX_EPOCH
from prism_proxy import state
from prism_proxy.tokenizer import load_tokenizer
from prism_sim.engine import SimConfig, SimEngine
from prism_sim.server import create_app

TOKEN = "edge-token"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
SURROGATE = b'"\\ud800"'  # a lone UTF-16 surrogate, as JSON text


def chat_with(extra: bytes) -> bytes:
    """A valid chat body (raw JSON) with `extra` fields appended."""
    return b'{"model":"m","messages":[{"role":"user","content":"x"}],' + extra + b"}"


CHAT_PATH, COMPLETIONS, GENERATE = "/v1/chat/completions", "/v1/completions", "/generate"
# (path, raw body, the `param` the proxy's 400 names)
BAD_PROXY_BODIES = [
    (CHAT_PATH, b'{"messages":[{"role":"user","content":' + SURROGATE + b"}]}", "body"),
    (CHAT_PATH, b"[" * 100_000, "body"),
    (COMPLETIONS, b'{"model":"m","prompt":' + SURROGATE + b"}", "body"),
    (GENERATE, b'{"text":' + SURROGATE + b"}", "body"),
    (GENERATE, b"[" * 100_000, "body"),
    (CHAT_PATH, chat_with(b'"temperature":Infinity'), "body"),
    (CHAT_PATH, chat_with(b'"temperature":1e999'), "body"),
    (CHAT_PATH, chat_with(b'"stream":"yes"'), "stream"),
    (CHAT_PATH, chat_with(b'"top_k":0'), "top_k"),
    (CHAT_PATH, chat_with(b'"top_p":-5'), "top_p"),
    (CHAT_PATH, chat_with(b'"min_tokens":9,"max_tokens":2'), "body"),
    (GENERATE, b'{"text":"a","input_ids":[1,2]}', "body"),
    (GENERATE, b'{"input_ids":[-1,5]}', "input_ids.0"),
    (GENERATE, b'{"input_ids":[5,99999999]}', "input_ids.1"),
    (COMPLETIONS, b'{"model":"m","prompt":[1,99999999]}', "prompt.1"),
    (GENERATE, b'{"input_ids":[1,2],"sampling_params":{"top_p":-5}}', "sampling_params.top_p"),
]


@pytest.fixture
async def sim_url():
    config = SimConfig(speed=50.0)
    app = create_app(config, SimEngine(config, tokenizer=load_tokenizer("builtin")))
    async with loopback_app(app) as url:
        yield url


@pytest.mark.parametrize(("path", "data", "param"), BAD_PROXY_BODIES)
async def test_proxy_answers_bad_input_with_a_named_400(sim_url, path, data, param) -> None:
    async with running_proxy(sim_url) as proxy, aiohttp.ClientSession() as http:
        async with http.post(
            proxy.url + path, data=data, headers={"Content-Type": "application/json"}
        ) as response:
            body = await response.json()
            assert response.status == 400, body
            assert body["error"]["param"] == param, body
        admission = proxy.app[state.ADMISSION]
        assert admission.queue_depth == 0 and admission.inflight == 0


async def test_prompt_over_the_limit_is_413_and_nothing_is_queued(sim_url) -> None:
    async with (
        running_proxy(sim_url, max_prompt_chars=1000) as proxy,
        aiohttp.ClientSession() as http,
    ):
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 1001}]}
        async with http.post(proxy.url + "/v1/chat/completions", json=big) as response:
            assert response.status == 413
            assert (await response.json())["error"]["param"] == "prompt"
        ok = {**CHAT, "messages": [{"role": "user", "content": "x" * 900}]}
        async with http.post(proxy.url + "/v1/chat/completions", json=ok) as response:
            assert response.status == 200


async def test_backend_errors_do_not_name_the_backend() -> None:
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    async with (
        running_proxy(dead) as proxy,
        aiohttp.ClientSession() as http,
        http.post(proxy.url + "/v1/chat/completions", json=CHAT) as response,
    ):
        message = (await response.json())["error"]["message"]
        assert response.status == 502 and message == "backend unreachable"


async def test_backend_error_messages_never_name_its_model_path_or_address() -> None:
    """A backend whose errors quote its model path and address (4xx answers, errors in
    a stream): the client reads neither."""
    model_path = "/srv/secret-models/qwen3-4b"
    box: dict[str, str] = {}

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": model_path, "served_model_name": model_path})

    async def generate(request: web.Request) -> web.StreamResponse:
        quoted = f"{model_path} at {box['url']} cannot serve this"
        if (await request.json())["sampling_params"].get("max_new_tokens") == 1:
            return web.json_response({"error": {"message": quoted}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + json.dumps({"error": quoted}).encode() + b"\n\n")
        return response

    backend = web.Application()
    backend.router.add_get("/server_info", server_info)
    backend.router.add_post("/generate", generate)
    async with loopback_app(backend) as url:
        box["url"] = url
        async with running_proxy(url) as proxy, aiohttp.ClientSession() as http:
            for max_tokens, stream in ((1, False), (2, False), (2, True)):
                body = {**CHAT, "max_tokens": max_tokens, "stream": stream}
                async with http.post(proxy.url + "/v1/chat/completions", json=body) as response:
                    text = await response.text()
                assert response.status in (400, 200, 502), text
                assert "cannot serve this" in text
                assert model_path not in text and url.split("://")[1] not in text, text


@pytest.mark.parametrize(
    "data",
    [
        b'{"text":' + SURROGATE + b"}",
        b"[" * 100_000,
        b'{"input_ids":[-1]}',
        b'{"input_ids":[99999999]}',
    ],
)
async def test_prism_sim_answers_bad_input_with_400(sim_url, data) -> None:
    async with aiohttp.ClientSession() as http, http.post(sim_url + "/generate", data=data) as r:
        assert r.status == 400, await r.text()


async def test_prism_sim_checks_chat_roles(sim_url) -> None:
    body = {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as http,
        http.post(sim_url + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status == 400


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"[" * 100_000, 400),
        (b'{"epoch": 1000000000000000000000000000000, "table": {}}', 400),
        (b'{"epoch": ' + str(MAX_EPOCH + 1).encode() + b', "table": {}}', 400),
        (b'{"epoch": 1, "table": {"a": ' + SURROGATE + b"}}", 400),
    ],
)
async def test_control_rpc_refuses_bad_updates(data, status) -> None:
    app = create_control_app(DartCore("dart"), TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        loopback_app(app) as url,
        aiohttp.ClientSession() as http,
        http.post(url + "/prism/priorities", data=data, headers=headers) as response,
    ):
        assert response.status == status, await response.text()


async def test_a_409_is_a_failure_and_the_proxy_resynchronises(sim_url, caplog) -> None:
    """Someone pushed the largest epoch there is: every later push of the proxy would be
    stale. The proxy counts and logs the 409, resets the table and carries on."""
    core = DartCore("dart")
    app = create_control_app(core, TOKEN, apply_inline=True)
    async with loopback_app(app) as control_url, aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        hijack = {"epoch": MAX_EPOCH, "table": {"x": 1.0}}
        async with http.post(control_url + "/prism/priorities", json=hijack, headers=headers) as r:
            assert r.status == 200
        caplog.set_level(logging.WARNING, logger="prism_proxy.control_client")
        async with running_proxy(
            sim_url, control_url=control_url, control_token=TOKEN, policy="prism"
        ) as proxy:
            body = {**CHAT, "prism": {"segments": [{"id": "d1", "text": "A document."}]}}
            async with http.post(proxy.url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
            registry = proxy.app[state.METRICS].registry
            for _ in range(200):  # the push runs in the background
                if registry.get_sample_value("prism:control_rpc_pushes_total"):
                    break
                await asyncio.sleep(0.02)
            assert registry.get_sample_value("prism:control_rpc_failures_total") >= 1
            assert registry.get_sample_value("prism:control_rpc_pushes_total") >= 1
            assert registry.get_sample_value("prism:control_rpc_up") == 1
            assert core.inbox.accepted_epoch < MAX_EPOCH  # the proxy's own epochs again
            assert core.table is not None and "d1" in core.table
        assert any("stale" in r.getMessage() for r in caplog.records)


def test_control_rpc_binds_to_loopback_unless_told_otherwise() -> None:
    ControlConfig(port=1, host="127.0.0.1", token="t").check_auth()
    ControlConfig(port=1, host="::1", token="t").check_auth()
    with pytest.raises(ControlConfigError, match="PRISM_CONTROL_ALLOW_REMOTE"):
        ControlConfig(port=1, host="0.0.0.0", token="t").check_auth()
    with pytest.raises(ControlConfigError, match="PRISM_CONTROL_ALLOW_REMOTE"):
        ControlConfig(port=1, host="sglang-control", token="t").check_auth()
    ControlConfig(port=1, host="0.0.0.0", token="t", allow_remote=True).check_auth()
    with pytest.raises(ControlConfigError, match="needs a token"):  # open only on loopback
        ControlConfig(port=1, host="0.0.0.0", allow_remote=True, allow_open=True).check_auth()
    ControlConfig(port=1, host="127.0.0.1", allow_open=True).check_auth()


async def test_a_large_prompt_is_tokenized_off_the_event_loop(sim_url, monkeypatch) -> None:
    """The structure behind the bound `bench.large_prompt` measures (/health waited at
    most ~50 ms during 1 MB prompts): a prompt of 32k characters or more is tokenized in
    a worker thread, a small one on the loop, and /health answers meanwhile."""
    async with running_proxy(sim_url) as proxy, aiohttp.ClientSession() as http:
        tokenizer = proxy.app[state.TOKENIZER]
        encode_chat = tokenizer.encode_chat  # what a rendered chat is tokenized with
        threads: list[tuple[int, int]] = []  # (characters, thread)

        def recording_encode(text: str) -> list[int]:
            threads.append((len(text), threading.get_ident()))
            return encode_chat(text)

        monkeypatch.setattr(tokenizer, "encode_chat", recording_encode)
        loop_thread = threading.get_ident()
        for chars in (100, 200_000):
            body = {**CHAT, "messages": [{"role": "user", "content": "word " * (chars // 5)}]}
            big = asyncio.create_task(http.post(proxy.url + "/v1/chat/completions", json=body))
            async with http.get(proxy.url + "/health") as health:
                assert health.status == 200
            async with await big as response:
                assert response.status == 200
        small, large = threads
        assert small[0] < 1000 and small[1] == loop_thread
        assert large[0] > 200_000 and large[1] != loop_thread
