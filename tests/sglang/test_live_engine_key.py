"""A real, unmodified SGLang 0.5.23 on this CPU started with `--api-key` and
`--admin-api-key` (the `hostile` server of `live_support`, as docker-compose.yml starts
SGLang: both keys from the environment, through `backend_plugin.launch`), behind the
proxy holding the engine's key (`engine_api_key`).

The engine refuses every call without its key (so the key is really checked), and
the keys are on no process's command line; through the proxy, a client holding only
its own key gets a chat, a stream, a tool chat and `/generate` answered."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from live_support import LiveServer

from prism_proxy.edge.gateway import GATEWAY

pytestmark = pytest.mark.sglang

CLIENT_KEY = "the-clients-own-key"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_the_engine_refuses_every_call_without_its_key(live) -> None:
    server: LiveServer = live["hostile"]
    assert server.api_key and server.admin_api_key
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    chat = {"model": "m", "messages": MESSAGES, "max_tokens": 1}
    wrong = {"Authorization": f"Bearer {CLIENT_KEY}"}
    with httpx.Client(base_url=server.url, timeout=60.0) as http:
        for headers in ({}, wrong):
            assert http.post("/generate", json=body, headers=headers).status_code == 401
            assert http.post("/v1/chat/completions", json=chat, headers=headers).status_code == 401
            assert http.get("/server_info", headers=headers).status_code == 401
        # An admin call wants the admin key: the API key does not open it.
        assert http.post("/flush_cache", headers=server.headers).status_code == 401
        # With the key it serves, and probes stay open (SGLang's own rule).
        assert http.post("/generate", json=body, headers=server.headers).status_code == 200
        assert http.get("/health").status_code == 200


def test_no_key_is_on_a_command_line(live) -> None:
    """Every local user can read /proc/<pid>/cmdline: neither key, nor the control token,
    is on any process's (the launcher added the keys to SGLang's argv inside its process,
    `backend_plugin.launch`)."""
    server: LiveServer = live["hostile"]
    secrets = [server.api_key, server.admin_api_key, server.token]
    assert all(secrets)
    seen = 0
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().decode("utf-8", "replace")
        except OSError:  # a process that ended meanwhile
            continue
        seen += 1
        assert not any(secret in text for secret in secrets if secret), cmdline
    assert seen > 1


async def test_chat_stream_tool_chat_and_generate_through_the_proxy(
    live, live_proxy_factory
) -> None:
    server: LiveServer = live["hostile"]
    proxy = await live_proxy_factory(server)
    async with openai.AsyncOpenAI(
        base_url=proxy.url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=120.0
    ) as client:
        chat = await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=6)
        assert chat.choices[0].message.content
        assert chat.usage is not None and chat.usage.completion_tokens > 0

        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=6, stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
        assert "".join(p for p in pieces if p)

        # A tool chat goes to the engine's own chat endpoint (the forwarded path). The
        # tiny model's random weights never close a call's JSON within the tokens given
        # (test_live_tools.py), so the answer ends by length, whatever it holds.
        before = server.metric("sglang:num_requests_total")
        tool_chat = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=16, tools=[WEATHER]
        )
        assert tool_chat.choices[0].finish_reason in ("length", "tool_calls", "stop")
        assert tool_chat.usage is not None and tool_chat.usage.completion_tokens > 0
        assert server.metric("sglang:num_requests_total") == before + 1

    async with httpx.AsyncClient(timeout=120.0) as http:
        body = {"text": "Say:", "sampling_params": {"max_new_tokens": 4}}
        headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
        generated = await http.post(proxy.url + "/generate", json=body, headers=headers)
        assert generated.status_code == 200, generated.text
        assert generated.json()["meta_info"]["completion_tokens"] == 4
    assert proxy.app[GATEWAY].admission.inflight == 0
