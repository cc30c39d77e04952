"""The benchmark's stub backend speaks SGLang's shapes, and the proxy relays its fast
streams exactly: many chunks arrive in one socket read, and every one of
them reaches the client, in order, once."""

from __future__ import annotations

import httpx
import openai
from proxy_support import loopback_app, running_proxy

from bench.stub_backend import TOKEN_TEXT, create_app
from prism_proxy.backend.client import parse_sse_line


def _events(text: str) -> list[dict]:
    return [e for e in map(parse_sse_line, text.encode().split(b"\n")) if e is not None]


async def test_stub_streams_cumulative_or_incremental_generate() -> None:
    for incremental in (False, True):
        async with loopback_app(create_app(incremental)) as url, httpx.AsyncClient() as http:
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 5}}
            answer = await http.post(url + "/generate", json={**body, "stream": True})
            events = _events(answer.text)
            assert len(events) == 5 and answer.text.endswith("data: [DONE]\n\n")
            texts = [e["text"] for e in events]
            if incremental:
                assert texts == [TOKEN_TEXT] * 5
            else:
                assert texts == [TOKEN_TEXT * n for n in range(1, 6)]
            assert events[-1]["meta_info"]["completion_tokens"] == 5
            assert events[-1]["meta_info"]["prompt_tokens"] == 3
            assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
            whole = (await http.post(url + "/generate", json=body)).json()
            assert whole["text"] == TOKEN_TEXT * 5


async def test_proxy_relays_every_chunk_of_a_fast_stream() -> None:
    async with (
        loopback_app(create_app()) as backend,
        running_proxy(backend, policy="fifo", window_ms=0, tokenizer="builtin") as proxy,
        openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client,
    ):
        stream = await client.chat.completions.create(
            model="stub-model",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=300,
            stream=True,
            stream_options={"include_usage": True},
        )
        deltas, usage = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                deltas.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        whole = await client.chat.completions.create(
            model="stub-model", messages=[{"role": "user", "content": "hi"}], max_tokens=300
        )
    assert deltas == [TOKEN_TEXT] * 300  # one delta per backend chunk, none lost or merged
    assert usage is not None and usage.completion_tokens == 300
    assert whole.choices[0].message.content == TOKEN_TEXT * 300
