"""The token path's prompt against the engine's own rendering of the same chat
(`prompts.conversation.RenderingCheck`), through real HTTP (the proxy in front of
prism-sim): the proxy counts how far its piece-by-piece prompt is from the whole
template tokenized at once, and `x-prism-extract: off` sends exactly the latter."""

from __future__ import annotations

import openai
import pytest
from proxy_support import ProxyFactory, proxy_factory_fixture, sim_server

from prism_proxy.edge.gateway import GATEWAY
from prism_tokens.tokenizer import load_tokenizer

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)

DOCS = [
    "The Pont Neuf, finished in 1607, is the oldest standing bridge across the Seine.",
    "The Millau Viaduct carries the A75 motorway 270 metres above the river Tarn.",
    "Tower Bridge in London opened in 1894 and has two bascules.",
]


def chat(order: list[str]) -> list[dict[str, str]]:
    context = "\n".join(f"[{i + 1}] {d}" for i, d in enumerate(order))
    return [
        {"role": "system", "content": "Answer from the numbered sources."},
        {"role": "user", "content": f"{context}\n\nWhich bridge is the oldest?"},
    ]


def whole_rendering(messages: list[dict[str, str]]) -> list[int]:
    tokenizer = load_tokenizer("builtin")
    return tokenizer.encode_chat(tokenizer.render_chat(messages))


async def test_every_sampled_chat_is_measured_against_the_engines_rendering(
    proxy_factory: ProxyFactory,
) -> None:
    proxy = await proxy_factory(rendering_check_every=1)
    registry = proxy.app[GATEWAY].metrics.registry
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused")
    drifts = []
    for order in (DOCS, DOCS[::-1], DOCS[1:]):
        messages = chat(order)
        answer = await client.chat.completions.create(model="m", messages=messages, max_tokens=2)
        drifts.append(abs(answer.usage.prompt_tokens - len(whole_rendering(messages))))
    exact = await client.chat.completions.create(
        model="m", messages=chat(DOCS), max_tokens=2, extra_headers={"x-prism-extract": "off"}
    )
    await client.close()
    # the client's way to SGLang's exact rendering: extraction off for the request
    assert exact.usage.prompt_tokens == len(whole_rendering(chat(DOCS)))
    checks = sum(
        registry.get_sample_value("prism:prompt_rendering_checks_total", {"outcome": o}) or 0.0
        for o in ("same", "differs")
    )
    assert checks == 4  # every chat, the one with extraction off included
    assert registry.get_sample_value("prism:prompt_rendering_drift_tokens_sum") == sum(drifts)


async def test_no_check_when_off(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(rendering_check_every=0)
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused")
    await client.chat.completions.create(model="m", messages=chat(DOCS), max_tokens=2)
    await client.close()
    registry = proxy.app[GATEWAY].metrics.registry
    assert registry.get_sample_value("prism:prompt_rendering_drift_tokens_count") == 0
