"""Each input-edge defect once found, reproduced against the real servers on loopback
(proxy in front of prism-sim, prism-sim alone, the DART control RPC): a clear 4xx, never
a 5xx, and the one-line configuration errors."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from hostile_bodies import ENGINE_KILLERS
from proxy_support import eventually, loopback_app, recording_generate, running_proxy

from backend_plugin.config import ControlConfig, ControlConfigError
from backend_plugin.control_rpc import create_control_app
from backend_plugin.dart.core import DartCore
from backend_plugin.dart.priority import MAX_EPOCH
from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.prompts.sharing import tenant_key
from prism_sim.engine import SimConfig, SimEngine
from prism_sim.server import create_app
from prism_tokens.tokenizer import load_tokenizer
from prism_wire import CUSTOM_PARAMS_KEY

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


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


BAD_PROXY_BODIES += [(path, _json(body), param) for path, body, param in ENGINE_KILLERS]


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
        admission = proxy.app[GATEWAY].admission
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
        # Forwarded bodies too (n > 1, tools, batches), and tools count with the prompt.
        tool = {"type": "function", "function": {"name": "f", "description": "d" * 600}}
        for path, body in [
            ("/v1/chat/completions", {**big, "n": 2}),
            ("/v1/chat/completions", {**ok, "tools": [tool]}),
            ("/v1/completions", {"prompt": ["x" * 600, "y" * 600], "max_tokens": 2}),
            ("/generate", {"input_ids": [[1] * 600, [2] * 600]}),
            ("/v1/responses", {"model": "m", "input": "x" * 1001, "stream": True}),
        ]:
            async with http.post(proxy.url + path, json=body) as response:
                assert response.status == 413, (path, await response.text())
                assert (await response.json())["error"]["param"] == "prompt"
        assert proxy.app[GATEWAY].admission.inflight == 0


async def test_backend_errors_do_not_name_the_backend() -> None:
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    async with (
        running_proxy(dead, tokenizer="builtin") as proxy,
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
        async with (
            running_proxy(url, tokenizer="builtin") as proxy,
            aiohttp.ClientSession() as http,
        ):
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
        caplog.set_level(logging.WARNING, logger="prism_proxy.backend.control")
        async with running_proxy(
            sim_url, control_url=control_url, control_token=TOKEN, policy="prism"
        ) as proxy:
            body = {**CHAT, "prism": {"segments": [{"id": "d1", "text": "A document."}]}}
            async with http.post(proxy.url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
            registry = proxy.app[GATEWAY].metrics.registry
            # the push runs in the background
            await eventually(lambda: registry.get_sample_value("prism:control_rpc_pushes_total"))
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
        tokenizer = proxy.app[GATEWAY].tokenizer
        pieces = tokenizer.chat_pieces
        encode_cut = pieces.encode_cut  # what a rendered chat is tokenized with
        threads: list[tuple[int, int]] = []  # (characters, thread)

        def recording_encode(text: str, cuts: list[int]) -> tuple[list[int], list]:
            threads.append((len(text), threading.get_ident()))
            return encode_cut(text, cuts)

        monkeypatch.setattr(pieces, "encode_cut", recording_encode)
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


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "q"}]}),
        ("/v1/completions", {"model": "m", "prompt": "q"}),
        ("/generate", {"text": "q"}),
    ],
)
async def test_a_hint_is_checked_on_the_loop_and_serialized_off_it_when_large(
    sim_url, monkeypatch, path, fields
) -> None:
    """Issue 36's stall: 1 MB hinted prompts, each refused with a 400. A hint's checks
    (lengths, ids: O(segments)) run on the event loop, so a refused one never takes a
    worker thread's hop; an accepted large one is serialized (tokenized) in a worker
    thread. `python -m bench.loop_stall --hinted-seconds 30` measures /health meanwhile."""
    from prism_proxy.prompts import plan

    checked: list[int] = []  # threads that checked a hint
    serialized: list[int] = []  # threads that serialized one
    hinted_prompt, segmented_job = plan.hinted_prompt, plan.segmented_job

    def recording_check(*args, **kwargs):
        checked.append(threading.get_ident())
        return hinted_prompt(*args, **kwargs)

    def recording_serialize(*args, **kwargs):
        serialized.append(threading.get_ident())
        return segmented_job(*args, **kwargs)

    monkeypatch.setattr(plan, "hinted_prompt", recording_check)
    monkeypatch.setattr(plan, "segmented_job", recording_serialize)
    loop_thread = threading.get_ident()
    too_long = {"id": "d0", "text": "w" * 256_001}  # over max_piece_chars (256,000)
    large = [{"id": f"d{i}", "text": "word " * 10_000} for i in range(4)]  # 200k characters
    async with running_proxy(sim_url) as proxy, aiohttp.ClientSession() as http:
        refused = {**fields, "prism": {"segments": [too_long]}}
        async with http.post(proxy.url + path, json=refused) as response:
            error = (await response.json())["error"]
        assert response.status == 400 and error["param"] == "prism.segments[0].text"
        assert "too long: 256001 characters > limit 256000" in error["message"]
        assert checked == [loop_thread] and serialized == []
        short = {"sampling_params": {"max_new_tokens": 1}}
        one = short if path == "/generate" else {"max_tokens": 1}
        accepted = {**fields, **one, "prism": {"segments": large}}
        async with http.post(proxy.url + path, json=accepted) as response:
            assert response.status == 200, await response.text()
        assert checked == [loop_thread, loop_thread]
        assert len(serialized) == 1 and serialized[0] != loop_thread


async def test_forwarded_bodies_hold_only_checked_served_fields() -> None:
    """What reaches the backend: the fields the proxy checked and serves, never the
    client's rid or priority, its hints, fields SGLang does not know, or message fields
    it does not render; the token path's /generate carries the cache partition."""
    seen: dict[str, dict] = {}

    async def chat(request: web.Request) -> web.Response:
        seen["chat"] = await request.json()
        return web.json_response({"choices": [], "usage": None})

    backend = web.Application()
    backend.router.add_post("/v1/chat/completions", chat)
    record = recording_generate(lambda body: seen.update(generate=body))
    backend.router.add_post("/generate", record)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi", "audio": None, "weird": 1}],
        "tools": [tool],
        "rid": "client-rid",
        "priority": 5,
        "store": True,
        "metadata": {"k": "v"},
        "extra_key": "tenant-a",
        "prompt_cache_key": "tenant-a-agents",  # QAS's grouping hint, never sent on
    }
    async with (
        loopback_app(backend) as url,
        running_proxy(url, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as http,
    ):
        async with http.post(proxy.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200, await response.text()
        async with http.post(
            proxy.url + "/v1/chat/completions", json={**body, "tools": None}
        ) as response:
            assert response.status == 200, await response.text()
    forwarded = seen["chat"]
    # custom_params: the proxy's own, the anchors of the turns it found (the client's
    # would have been refused); stream and stream_options: the proxy's own too, which
    # streams every request from the engine to see its first token
    proxy_owned = {"custom_params", "stream", "stream_options"}
    assert set(forwarded) == {"model", "messages", "tools", "rid", "extra_key", *proxy_owned}
    assert forwarded["stream"] is True and forwarded["stream_options"] == {"include_usage": True}
    assert set(forwarded["custom_params"]) == {CUSTOM_PARAMS_KEY}
    assert forwarded["rid"].startswith("prism-") and forwarded["tools"] == [tool]
    assert forwarded["messages"] == [{"role": "user", "content": "hi"}]
    token_path = seen["generate"]
    # a cache partition the client chose is kept, inside its own (`prompts.sharing`)
    partition = tenant_key("127.0.0.1", "tenant-a")
    assert forwarded["extra_key"] == token_path["extra_key"] == partition
    assert token_path["rid"].startswith("prism-")
    assert not {"priority", "store", "metadata", "model", "messages"} & set(token_path)
    assert "prompt_cache_key" not in token_path


async def test_costly_bodies_are_judged_off_the_loop_and_refused_before_validation(
    sim_url,
) -> None:
    """The issue's 240,000 empty messages (7.9 MB), 1.6 M empty arrays, and 5,000
    segments or 5,000 messages (under the container limit, over the caps): each is
    refused (413 or 400 naming the field) without pydantic validating its items, the
    first two after a worker process counted their JSON containers (orjson and pydantic
    hold the GIL: a thread would not free the loop), and `/health` answers meanwhile.
    How long the loop waits is measured by `python -m bench.loop_stall`, not here."""
    messages = json.dumps({"messages": [{"role": "user", "content": ""}] * 240_000}).encode()
    arrays = b"[" + b",".join([b"[]"] * 1_600_000) + b"]"
    segments = [{"id": f"d{i}", "text": "t"} for i in range(5_000)]
    hint = _json({"messages": [{"role": "user", "content": "q"}], "prism": {"segments": segments}})
    chat = _json({"messages": [{"role": "user", "content": "q"}] * 5_000})
    expected = [
        (messages, 413, "body"),
        (arrays, 413, "body"),
        (hint, 400, "prism.segments"),
        (chat, 413, "messages"),
    ]
    async with running_proxy(sim_url) as proxy, aiohttp.ClientSession() as http:
        parser = proxy.app[GATEWAY].parser
        for data, status, param in expected:
            post = http.post(
                proxy.url + "/v1/chat/completions",
                data=io.BytesIO(data),
                headers={"Content-Type": "application/json"},
            )
            health = http.get(proxy.url + "/health")
            async with post as answer, health as probe:
                assert probe.status == 200
                body = await answer.json()
                assert answer.status == status and body["error"]["param"] == param, body
        assert parser.checked_in_worker == 2


async def test_info_answers_pass_only_allow_listed_fields_of_safe_shape() -> None:
    """A backend whose info answers carry secrets, addresses and paths under every kind
    of name (SGLang's own, unknown ones, nested, and allow-listed names with a value of
    the wrong shape): the proxy's answers keep the safe fields and none of those."""
    secrets = ["sk-live-123", "adm-456", "10.9.8.7", "31999", "/srv/models/qwen3-4b", "/dl"]
    path, address = "/srv/models/qwen3-4b", "http://10.9.8.7:31999"
    anywhere = {
        "api_key": "sk-live-123",
        "notes": "adm-456",
        "launch_command": f"--api-key sk-live-123 --model-path {path} --port 31999",
        "download_dir": "/dl",
        "upstream": address,
        "nested": {"admin_api_key": "adm-456", "max_total_num_tokens": 5},
    }
    info = {
        **anywhere,
        "model_path": path,
        "served_model_name": path,
        "version": address,  # an allow-listed name with a URL in it
        "schedule_policy": "fcfs",
        "max_total_num_tokens": 1000,
        "chunked_prefill_size": "sk-live-123",  # a number field holding a string
        "is_embedding": False,
        "internal_states": [{**anywhere, "effective_max_running_requests_per_dp": 7}],
    }
    answers = {
        "/server_info": info,
        "/model_info": {**anywhere, "model_path": path, "served_model_name": path,
                        "architectures": ["Qwen3ForCausalLM", path], "is_generation": True},
        "/v1/models": {"object": "list", "data": [{**anywhere, "id": path, "root": path,
                                                   "owned_by": "sglang"}]},
        "/v1/loads": {**anywhere, "timestamp": "2026-01-01T00:00:00+00:00", "loads": [
            {**anywhere, "dp_rank": 0, "num_waiting_reqs": 2, "queues": {**anywhere, "waiting": 2}}
        ]},
    }  # fmt: skip

    def answering(body: dict) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            if "format" in request.query:  # SGLang's /v1/loads?format=prometheus: text
                return web.Response(text="sglang_num_running_reqs 0\n")
            return web.json_response(body)

        return handler

    answers["/get_server_info"] = info
    answers["/get_model_info"] = answers["/model_info"]
    backend = web.Application()
    for route, body in answers.items():
        backend.router.add_get(route, answering(body))
    proxied = {}
    async with (
        loopback_app(backend) as url,
        running_proxy(url, tokenizer="builtin") as proxy,
        aiohttp.ClientSession() as http,
    ):
        for route in (*answers, "/loads"):
            async with http.get(proxy.url + route + "?format=prometheus") as response:
                assert response.status == 200, route
                text = await response.text()
                proxied[route] = json.loads(text)
            leaked = [secret for secret in secrets if secret in text]
            assert not leaked, (route, leaked, text)
    server = proxied["/server_info"]
    assert server["max_total_num_tokens"] == 1000 and server["schedule_policy"] == "fcfs"
    assert server["served_model_name"] == "qwen3-4b" and server["is_embedding"] is False
    assert server["internal_states"] == [{"effective_max_running_requests_per_dp": 7}]
    assert set(server) == {
        "max_total_num_tokens", "schedule_policy", "served_model_name", "is_embedding",
        "internal_states", "prism",
    }  # fmt: skip
    assert proxied["/get_server_info"] == {**server, "prism": proxied["/get_server_info"]["prism"]}
    assert proxied["/model_info"] == proxied["/get_model_info"] == {
        "served_model_name": "qwen3-4b", "architectures": ["Qwen3ForCausalLM"],
        "is_generation": True,
    }  # fmt: skip
    assert proxied["/v1/models"] == {
        "object": "list", "data": [{"id": "qwen3-4b", "owned_by": "sglang"}]
    }  # fmt: skip
    loads = proxied["/v1/loads"]
    assert loads["timestamp"] == "2026-01-01T00:00:00+00:00" and loads["loads"][0] == {
        "dp_rank": 0, "num_waiting_reqs": 2, "queues": {"waiting": 2}
    }  # fmt: skip
    assert set(loads) == {"timestamp", "loads", "prism"}
