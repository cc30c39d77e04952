"""Grammars through the proxy to a real, unmodified SGLang 0.5.23 on this CPU: the
ambiguous grammar whose matching held each step of the engine (xgrammar's Earley
matcher; `bench/grammar_attack.py` measures it sent directly) never reaches the engine,
under the default policy (`off`) nor under `checked`; a deterministic grammar is served
under `checked` and constrains the real answer."""

from __future__ import annotations

import re

import httpx
import pytest
from live_support import LiveServer

from prism_proxy.edge.gateway import GATEWAY

pytestmark = pytest.mark.sglang

# Nested nullable alternatives: 17.5 s for one step at the tenth character (xgrammar
# 0.2.7 on this CPU; tests/test_grammars.py has the family).
AMBIGUOUS = "\n".join(
    ["root ::= r0 r0 r0"]
    + [f'r{k} ::= r{k + 1} r{k + 1} | r{k + 1} | ""' for k in range(8)]
    + ['r8 ::= [a-z] | ""']
)
FORCED = {"max_tokens": 14, "min_tokens": 14}


def engine_requests(server: LiveServer) -> float:
    return server.metric("sglang:num_requests_total")


@pytest.mark.parametrize("policy", ["off", "checked"])
async def test_the_ambiguous_grammar_never_reaches_the_engine(
    live, live_proxy_factory, policy: str
) -> None:
    server: LiveServer = live["hostile"]
    proxy = await live_proxy_factory(server, grammars=policy)
    before = engine_requests(server)
    bodies = [
        ("/v1/completions", {"model": "m", "prompt": "Say:", "ebnf": AMBIGUOUS, **FORCED}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}],
                                  "ebnf": AMBIGUOUS, **FORCED}),
        ("/generate", {"text": "Say:", "sampling_params": {"ebnf": AMBIGUOUS, "max_new_tokens": 14,
                                                           "min_new_tokens": 14}}),
        ("/v1/completions", {"model": "m", "prompt": "Say:", "regex": "((a?)*)*b", **FORCED}),
    ]  # fmt: skip
    async with httpx.AsyncClient(timeout=60.0) as client:
        for path, body in bodies:
            answer = await client.post(proxy.url + path, json=body)
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["param"].endswith(("ebnf", "regex"))
        # the engine serves the next client at once, and saw none of the above
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = await client.post(proxy.url + "/v1/chat/completions", json=chat)
        assert answer.status_code == 200, answer.text
    assert engine_requests(server) == before + 1
    assert proxy.app[GATEWAY].admission.inflight == 0


async def test_checked_serves_a_deterministic_grammar_that_the_engine_follows(
    live, live_proxy_factory
) -> None:
    server: LiveServer = live["hostile"]
    proxy = await live_proxy_factory(server, grammars="checked")
    grammar = 'root ::= ("yes" | "no") "-" [0-9]{3}'
    body = {"model": "m", "prompt": "Answer:", "ebnf": grammar, "max_tokens": 12,
            "temperature": 1.0}  # fmt: skip
    async with httpx.AsyncClient(timeout=120.0) as client:
        for _ in range(3):  # random weights, sampled: the grammar still decides the form
            answer = await client.post(proxy.url + "/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            text = answer.json()["choices"][0]["text"]
            assert re.fullmatch(r"(yes|no)-[0-9]{3}", text), text
