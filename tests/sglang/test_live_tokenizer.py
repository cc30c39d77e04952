"""The proxy's tokenizer against a real, unmodified SGLang 0.5.23 on this CPU (the tiny
model's `stock` server; docs/proxy.md, "The tokenizer").

Whether the proxy's ids reach the engine is read from SGLang itself: its
`sglang:http_requests_total{endpoint}` counts every request its HTTP server got, by
route (`tokenizer_support.http_requests`); the token path is the only way the proxy's
ids reach it, always as a `/generate`. The tests run one at a time on a server no other
test touches meanwhile, so a count's change is this test's doing.

The tiny model's tokenizer is the builtin one (sglang_cpu/model.py), so a wrong one here
is another vocabulary (tests/tokenizer_dirs.py) or the tiny vocabulary with another
chat template; test_live_tokenizer_smollm2.py has a real model, where `builtin` is wrong.
Last, prism-sim's `/v1/tokenize` and `/v1/detokenize` against SGLang's, body by body.
"""

from __future__ import annotations

import os

import httpx
import openai
import pytest
from live_support import LiveServer
from tokenizer_dirs import write_bpe_dir
from tokenizer_support import CHAT, http_requests, plain_proxy, prompt_tokens, template_variant

from prism_proxy.backend.tokenizer_choice import TokenizerMismatch, TokenizerState
from prism_proxy.edge.gateway import GATEWAY
from prism_sim.engine import SimConfig, SimEngine
from prism_sim.server import create_app, start_site
from prism_tokens.builtin import CHATML_TEMPLATE
from prism_tokens.verify import PROBE_TEXTS
from sglang_cpu.model import ensure_tiny_model

pytestmark = pytest.mark.sglang

# ChatML with a default system prompt when the chat has none (as Qwen2.5's template).
DEFAULT_SYSTEM_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
) + CHATML_TEMPLATE


@pytest.fixture
def stock(live: dict[str, LiveServer]) -> LiveServer:
    return live["stock"]


@pytest.fixture(scope="module")
def wrong(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("wrong-tokenizers")
    model = ensure_tiny_model()
    return {
        "other-vocabulary": str(write_bpe_dir(root / "bpe")),
        "other-template": str(template_variant(model, root / "variant", DEFAULT_SYSTEM_TEMPLATE)),
    }


async def test_without_a_tokenizer_the_proxy_sends_sglangs_own_prompt(stock: LiveServer) -> None:
    proxy = await plain_proxy(stock.url)
    try:
        assert os.path.samefile(proxy.app[GATEWAY].tokenizer.name, ensure_tiny_model())
        assert proxy.app[GATEWAY].tokenizer_guard.check.state is TokenizerState.MATCH
        generates = http_requests(stock.url, "/generate")
        through = await prompt_tokens(proxy.url)
        assert http_requests(stock.url, "/generate") == generates + 1  # the token path
        assert through == await prompt_tokens(stock.url)
    finally:
        await proxy.stop()


@pytest.mark.parametrize("kind", ["other-vocabulary", "other-template"])
async def test_a_wrong_tokenizer_is_refused_before_any_generate(
    stock: LiveServer, wrong: dict[str, str], kind: str
) -> None:
    generates = http_requests(stock.url, "/generate")
    asked = http_requests(stock.url, "/v1/tokenize")
    with pytest.raises(TokenizerMismatch) as caught:
        await plain_proxy(stock.url, tokenizer=wrong[kind])
    assert f"tokenizer {wrong[kind]!r} does not match" in str(caught.value)
    probe = "text probe" if kind == "other-vocabulary" else "chat probe"
    assert probe in str(caught.value)
    assert http_requests(stock.url, "/v1/tokenize") > asked  # the engine was asked
    assert http_requests(stock.url, "/generate") == generates


async def test_forward_mode_gets_sglangs_own_answers_and_no_generate(
    stock: LiveServer, wrong: dict[str, str]
) -> None:
    proxy = await plain_proxy(
        stock.url, tokenizer=wrong["other-vocabulary"], tokenizer_mismatch="forward"
    )
    try:
        assert proxy.app[GATEWAY].tokenizer_guard.check.state is TokenizerState.MISMATCH
        generates = http_requests(stock.url, "/generate")
        chats = http_requests(stock.url, "/v1/chat/completions")
        clients = [
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            for url in (proxy.url, stock.url)
        ]
        answers = []
        for client in clients:
            async with client:
                answers.append(await client.chat.completions.create(**CHAT))
        through, direct = answers
        assert through.usage is not None and direct.usage is not None
        assert through.usage.prompt_tokens == direct.usage.prompt_tokens
        assert through.usage.completion_tokens == direct.usage.completion_tokens
        assert http_requests(stock.url, "/v1/chat/completions") == chats + 2
        # a streamed chat and a completion, forwarded as well
        async with httpx.AsyncClient(timeout=120.0) as http:
            stream = await http.post(
                proxy.url + "/v1/chat/completions", json={**CHAT, "stream": True}
            )
            assert stream.status_code == 200 and stream.text.rstrip().endswith("[DONE]")
            body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 2}
            completion = await http.post(proxy.url + "/v1/completions", json=body)
            assert completion.status_code == 200, completion.text
        assert http_requests(stock.url, "/generate") == generates
    finally:
        await proxy.stop()


# --- prism-sim's tokenize endpoints against SGLang's ---------------------------------------
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
MESSAGES = CHAT["messages"]
TOKENIZE_BODIES = [
    {"prompt": "Hello, world!"},
    {"prompt": [text for _, text in PROBE_TEXTS], "add_special_tokens": False},
    {"prompt": ["<|im_start|>user\nhi<|im_end|>", ""], "add_special_tokens": True},
    {"messages": MESSAGES},
    {"messages": MESSAGES, "add_generation_prompt": False},
    {"messages": MESSAGES, "add_generation_prompt": True, "add_special_tokens": True},
    {"messages": MESSAGES, "tools": [WEATHER]},
    {"messages": [*MESSAGES, {"role": "assistant", "content": "Calder."}]},
    {},
    {"prompt": "x", "messages": MESSAGES},
    {"prompt": 5},
]
DETOKENIZE_BODIES = [
    {"tokens": [1, 74, 75, 2, 201]},
    {"tokens": [1, 74, 75, 2, 201], "skip_special_tokens": False},
    {"tokens": [[74, 75], [201]]},
    {"tokens": []},
    {"tokens": "x"},
]


async def test_prism_sim_tokenizes_as_sglang(stock: LiveServer) -> None:
    model = str(ensure_tiny_model())
    config = SimConfig(tokenizer=model, speed=1000.0)
    runner = await start_site(create_app(config, SimEngine(config)), "127.0.0.1", 0)
    host, port = runner.addresses[0][:2]
    sim = f"http://{host}:{port}"
    try:
        async with httpx.AsyncClient(timeout=60.0) as http:
            cases = [(p, b) for p in ("/v1/tokenize", "/tokenize") for b in TOKENIZE_BODIES]
            cases += [(p, b) for p in ("/v1/detokenize", "/detokenize") for b in DETOKENIZE_BODIES]
            for path, body in cases:
                theirs = await http.post(stock.url + path, json=body)
                ours = await http.post(sim + path, json=body)
                assert ours.status_code == theirs.status_code, (path, body, theirs.text)
                if theirs.status_code != 200:
                    continue
                expected, got = theirs.json(), ours.json()
                if "tokens" in expected:
                    assert (got["tokens"], got["count"]) == (expected["tokens"], expected["count"])
                    assert isinstance(got["max_model_len"], int)
                else:
                    assert got == expected, (path, body)
    finally:
        await runner.cleanup()
