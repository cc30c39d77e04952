"""What a client may learn of the shared prefix cache (`prism_proxy.prompts.sharing`):
the rule on its own, the property that makes it safe (a client's view does not depend
on what another single client sent), and the rule through real HTTP with clients on
distinct loopback addresses, the proxy in front of prism-sim."""

from __future__ import annotations

import random

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proxy_support import ProxyFactory, proxy_factory_fixture, sim_server
from sim_support import common_prefix as token_prefix

from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.prompts.sharing import (
    BLOCK_TOKENS,
    RECORD_BYTES,
    OwnPrefixes,
    SharedPrefixes,
    common_prefix,
    pack,
    prefix_digests,
    tenant_key,
)

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)


def test_digests_name_equal_prefixes_alike_at_anchors_and_blocks() -> None:
    ids = list(range(3 * BLOCK_TOKENS + 7))
    here = prefix_digests(ids, [10, 50])
    assert [end for end, _ in here] == [10, 50, *(BLOCK_TOKENS * k for k in (1, 2, 3))]
    other = prefix_digests([*ids[:50], 999, *ids[51:]], [10, 50])
    assert here[:2] == other[:2] and here[2][1] != other[2][1]  # diverges after 50


def test_own_prefixes_are_visible_others_only_once_several_clients_sent_them() -> None:
    table = SharedPrefixes(min_clients=2)
    prompt = prefix_digests(list(range(40)), [20, 40])
    assert table.see("a", prompt) == 0  # nothing before
    assert table.see("a", prompt) == 40  # its own
    assert table.see("b", prompt) == 0  # only "a" sent it before
    assert table.see("c", prompt) == 40  # "a" and "b" did: shared
    assert table.see("b", prompt) == 40
    # a longer prompt over the shared one: the shared part only
    longer = prefix_digests([*range(40), 7, 8, 9], [20, 40, 43])
    assert table.see("d", longer) == 40
    assert SharedPrefixes(min_clients=1).see("z", prompt) == 40  # one tenant: all


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 4))
def test_a_correct_guess_looks_like_a_wrong_one(seed: int, min_clients: int) -> None:
    """Non-interference: whatever one other client sent (the secret, or another), the
    attacker is told the same for every probe it sends, in the same order."""
    rng = random.Random(seed)
    head = [rng.randrange(50) for _ in range(rng.randrange(1, 200))]
    secret = [rng.randrange(50, 60) for _ in range(6)]
    probes = [[*head, *[rng.randrange(50, 60) for _ in range(rng.randrange(1, 7))]]
              for _ in range(30)]  # fmt: skip
    probes[rng.randrange(30)] = [*head, *secret]  # the right guess among them

    def attacker_view(victim_sent: list[int]) -> list[int]:
        table = SharedPrefixes(min_clients=min_clients)
        table.see("victim", prefix_digests(victim_sent, [len(head), len(victim_sent)]))
        return [table.see("attacker", prefix_digests(p, [len(head), len(p)])) for p in probes]

    assert attacker_view([*head, *secret]) == attacker_view([*head, *(s ^ 1 for s in secret)])


def test_the_record_is_bounded_in_bytes() -> None:
    table = SharedPrefixes(min_clients=2, capacity_bytes=100 * RECORD_BYTES)
    for i in range(1000):
        table.see("a", prefix_digests([i, i + 1, i + 2], [3]))
    assert len(table) == 100 and table.stats()["bytes"] <= 100 * RECORD_BYTES
    assert tenant_key("a") != tenant_key("b") and tenant_key("a", "x").startswith(tenant_key("a"))


# ---- through real HTTP: three clients on their own loopback addresses ----------------------
SYSTEM = "You answer from the documents below, quoting them exactly. " * 4
DOCS = "\n".join(
    f"<document>\nThe {name} bridge was finished in {year} and spans the river at {town}.\n"
    "</document>"
    for name, year, town in [("Old", 1607, "Paris"), ("Iron", 1779, "Coalbrookdale")]
)


def rag(question: str) -> dict:
    return {
        "model": "m", "max_tokens": 2,
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": f"{DOCS}\n\n{question}"}],
    }  # fmt: skip


async def told_cached(url: str, address: str, body: dict) -> int:
    connector = aiohttp.TCPConnector(local_addr=(address, 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(url + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status == 200, await response.text()
        answer = await response.json()
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


async def test_a_prefix_is_reported_to_others_once_several_clients_sent_it(
    proxy_factory: ProxyFactory,
) -> None:
    proxy = await proxy_factory()
    metrics = proxy.app[GATEWAY].metrics.registry
    assert await told_cached(proxy.url, "127.0.0.2", rag("Which bridge is older?")) == 0

    def engine_cached() -> float:
        return metrics.get_sample_value("prism:cached_tokens_total", {"lane": "hot"}) or 0.0

    before = engine_cached()
    # a second client, same documents: the engine reuses them, the client is not told
    told_b = await told_cached(proxy.url, "127.0.0.3", rag("Where is the Iron bridge?"))
    reused_b = engine_cached() - before
    assert reused_b > 40 and told_b < reused_b
    # its own repeat is its own
    assert await told_cached(proxy.url, "127.0.0.3", rag("Where is the Iron bridge?")) > 40
    # a third client: two others sent the system prompt and documents, so they are shared
    before = engine_cached()
    told_c = await told_cached(proxy.url, "127.0.0.4", rag("When was the Old bridge built?"))
    reused_c = engine_cached() - before
    # told through the documents; not the first words of another client's question,
    # which the engine matched too ("Wh...")
    assert 100 < told_c <= reused_c and reused_c - told_c < 8


async def test_one_tenant_deployments_report_everything(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(share_min_clients=1)
    await told_cached(proxy.url, "127.0.0.5", rag("Which bridge is older?"))
    assert await told_cached(proxy.url, "127.0.0.6", rag("Which is newer?")) > 40


def test_a_clients_own_reuse_is_found_to_the_token() -> None:
    """Its prompts with what was generated for them: a multi-turn chat re-sends the
    answer the engine cached, and the client is told all of it."""
    own = OwnPrefixes(capacity_bytes=1 << 20)
    first = list(range(100))
    own.record("a", first)  # as it is sent
    assert own.own_prefix("a", [*first, 500, 501, 9]) == 100
    own.record("a", [*first, 500, 501, 502])  # with what was generated for it
    assert own.own_prefix("a", [*first, 500, 501, 9]) == 102
    assert own.own_prefix("a", first[:50]) == 50
    assert own.own_prefix("b", [*first, 500]) == 0  # not b's
    assert common_prefix(pack([1, 2, 3]), pack([1, 2, 4])) == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), max_size=30), max_size=25),
       st.lists(st.integers(0, 5), max_size=30))  # fmt: skip
def test_the_own_tree_answers_as_the_longest_common_start_with_any_prompt_sent(
    sent: list[list[int]], probe: list[int]
) -> None:
    own = OwnPrefixes(capacity_bytes=1 << 24)
    for ids in sent:
        own.record("a", ids)

    expected = max((token_prefix(probe, ids) for ids in sent), default=0)
    assert own.own_prefix("a", probe) == expected


def test_the_own_tree_is_bounded_and_forgets_the_oldest_first() -> None:
    own = OwnPrefixes(capacity_bytes=20_000)
    for i in range(200):
        own.record(f"c{i % 3}", [i, *range(1000, 1040)])
    assert own.size_bytes <= 20_000
    assert own.own_prefix("c1", [199, *range(1000, 1040)]) == 41  # the newest is kept
    assert own.own_prefix("c0", [0, 1000]) == 0  # the oldest went
