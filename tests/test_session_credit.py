"""Retention is earned (SPEC §3, issue 34): what a client's paused agent sessions may hold
in DART is bounded by the returns its sessions have shown, per client and agent type;
a pause that is not earned is ranked with private pieces, as LRU would order it.

The ledger and the session table are sans-IO (times passed in); DART's discarded set is
checked on its core; the last test runs a flood of tool-calling sessions that never
come back beside a steady victim through the real proxy, the real `openai`-shaped HTTP
requests from two loopback addresses, and prism-sim with DART and its control RPC.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from proxy_support import dart_sim, eventually, running_proxy, sim_metric

from backend_plugin.dart import DartCore, NodeMeta
from backend_plugin.dart.priority import PriorityUpdate
from loadgen.workloads.textgen import random_words
from prism_proxy.admission.credit import RetentionLedger
from prism_proxy.admission.sessions import QUEUED_SCORE, SessionParams, SessionTable
from prism_wire import MAX_RETAINED, AnchorKind, Retention


# ---- the ledger ---------------------------------------------------------------------------
def test_credit_is_returns_less_lapses_decaying_by_half_life() -> None:
    ledger = RetentionLedger(half_life_s=10.0)
    account = ("10.0.0.1", "head")
    assert ledger.credit(account, 0.0) == 0.0
    assert ledger.grant(account, "k0", 1, 5.0, 0.0) is None  # nothing came back yet
    ledger.came_back(account, 800, in_time=True, now=0.0)
    ledger.came_back(account, 5000, in_time=False, now=0.0)  # late: earns nothing
    assert ledger.credit(account, 10.0) == pytest.approx(400.0)  # one half-life
    grant = ledger.grant(account, "k1", 300, 5.0, 10.0)
    assert grant is not None and ledger.held(account) == 300
    assert ledger.grant(account, "k2", 150, 5.0, 10.0) is None  # 300 + 150 > 400
    # k1's TTL passes without a return: its 300 tokens are charged
    assert ledger.expire(14.0) == [] and [g.key for g in ledger.expire(15.0)] == ["k1"]
    assert ledger.held(account) == 0
    assert ledger.credit(account, 15.0) == pytest.approx(800 * 0.5**1.5 - 300)
    # a grant settled by a return is never charged
    ledger.came_back(account, 2000, in_time=True, now=15.0)
    grant = ledger.grant(account, "k3", 500, 5.0, 15.0)
    ledger.settle(grant)
    ledger.settle(grant)  # twice is once
    assert ledger.held(account) == 0 and ledger.expire(100.0) == []
    assert (ledger.granted, ledger.refused, ledger.live_grants) == (2, 2, 0)


def test_the_ledger_is_bounded() -> None:
    ledger = RetentionLedger(half_life_s=10.0, max_accounts=2)
    for n in range(3):
        ledger.came_back((f"c{n}", "h"), 100, True, float(n))
    # the least recently used account is forgotten: it starts again at 0
    assert ledger.credit(("c0", "h"), 3.0) == 0.0
    assert ledger.credit(("c2", "h"), 3.0) > 0.0
    ledger.came_back(("c2", "h"), 10**9, True, 3.0)
    for n in range(5000):  # grants settled at once do not pile up in the expiry heap
        ledger.settle(ledger.grant(("c2", "h"), f"k{n}", 1, 60.0, 3.0))
    assert len(ledger._expiries) <= 1024 + 2


# ---- the session table --------------------------------------------------------------------
PARAMS = SessionParams(min_tokens=0, default_ttl_s=10.0, credit_half_life_s=60.0)


def test_sessions_that_never_return_are_never_retained() -> None:
    """The issue's flood, event by event: 200 sessions of 1,200 tokens from one client,
    3 a second, each answer a tool call, none continued. Every pause is discarded (its
    last message ranks with private pieces), none retained, nothing held."""
    table = SessionTable(PARAMS)
    for n in range(200):
        now = n / 3
        arrival = table.arrive(f"f{n}", ["tools", f"f{n}"], "flood", 1200, now, "10.0.0.2")
        # discarded on arrival: never ranked as a segment, not even before its end
        assert arrival.retention == Retention(discard=(f"f{n}",))
        retention = table.finish(f"f{n}", tool_call=True, now=now + 0.2)
        assert not retention.retain and f"f{n}" in retention.discard, n
    assert table.ledger.held(("10.0.0.2", "flood")) == 0
    assert table.stats()["unearned"] == 200 and table.stats()["retained"] == 0


def test_returns_earn_retention_for_their_client_and_agent_type_only() -> None:
    table = SessionTable(PARAMS)
    # A's first pause: nothing came back yet
    assert table.arrive("a1", ["a1"], "h", 1000, 0.0, client="A").retention == Retention(
        discard=("a1",)
    )
    assert table.finish("a1", True, 1.0) == Retention(discard=("a1",))
    # it comes back 2 s later, within its 10 s TTL: A earns its 1,000 tokens; held while
    # queued; its own new piece is discarded at once (1,400 tokens > 1,000 earned)
    back = table.arrive("a2", ["a1", "a2"], "h", 1400, 3.0, client="A")
    assert back.continues
    assert back.retention == Retention({"a1": (QUEUED_SCORE, 60.0, 1000)}, discard=("a2",))
    table.started("a2", 3.1)
    assert table.finish("a2", False, 4.0) == Retention(discard=("a2",))  # ended: its own piece
    # A's next pauses are retained up to what came back (1,000 x 2^(-1/60) = 988.5)
    table.arrive("b1", ["b1"], "h", 600, 4.0, client="A")
    assert table.finish("b1", True, 4.0) == Retention({"b1": (4.0, 10.0, 600)})
    table.arrive("c1", ["c1"], "h", 600, 4.0, client="A")
    assert table.finish("c1", True, 4.0) == Retention(discard=("c1",))  # 600 + 600 > 988.5
    # another client on the same agent type, and A under another one, earned nothing
    table.arrive("d1", ["d1"], "h", 100, 4.0, client="B")
    assert table.finish("d1", True, 4.0) == Retention(discard=("d1",))
    table.arrive("e1", ["e1"], "h2", 100, 4.0, client="A")
    assert table.finish("e1", True, 4.0) == Retention(discard=("e1",))
    # b1 never comes back: DART forgets its retention at its TTL by itself, and A pays
    # its 600 tokens at the first event after that
    table.arrive("x", ["x"], "other", 10, 15.0, client="C")
    credit = table.ledger.credit(("A", "h"), 15.0)
    assert credit == pytest.approx(1000 * 0.5 ** (12 / 60) - 600)


def test_an_unearned_pause_never_takes_retention_from_an_earned_one() -> None:
    """Sessions of one task start alike: two clients' sessions pause on one key. The
    earned one keeps it retained whoever else pauses there; each continuation is its
    own client's; once only the unearned pause is left there, the key is discarded."""
    table = SessionTable(PARAMS)
    table.ledger.came_back(("A", "h"), 10_000, True, 0.0)
    table.arrive("a1", ["k"], "h", 700, 1.0, client="A")
    assert table.finish("a1", True, 1.0) == Retention({"k": (1.0, 10.0, 700)})
    # F's request is unearned: its pieces would be discarded, but k is A's retained key
    assert table.arrive("f1", ["k"], "h", 700, 2.0, client="F").retention == Retention(
        {"k": (1.0, 9.0, 700)}
    )
    assert table.finish("f1", True, 2.0) == Retention({"k": (1.0, 9.0, 700)})  # still A's
    back = table.arrive("a2", ["k", "a2"], "h", 900, 3.5, client="A")
    assert back.continues and back.program_start == 1.0  # A's own pause, not F's
    assert table.started("a2", 4.5) == Retention(discard=("k",))  # only F's is left there
    back = table.arrive("f2", ["k", "f2"], "h", 900, 5.5, client="F")
    assert back.continues and back.program_start == 2.0
    assert table.started("f2", 6.5) == Retention(release=("k",))
    # a client that paused nowhere continues nothing
    table.arrive("g1", ["k"], "h", 700, 7.0, client="G")
    table.finish("g1", True, 7.0)
    assert not table.arrive("z", ["k", "z"], "h", 900, 8.0, client="Z").continues


# ---- DART's discarded set -------------------------------------------------------------------
def test_discarded_owners_rank_with_private_pieces_until_they_leave_the_tree() -> None:
    core = DartCore(capacity_tokens=1000)
    core.inbox.submit(PriorityUpdate(1, {"other": 1.0}, protect=0))  # a table: segments rank 1
    seg, later = NodeMeta(AnchorKind.SEGMENT, "S"), NodeMeta(AnchorKind.SEGMENT, "L")
    core.on_assign(None, seg, 100)
    # "L" is discarded before its request reaches the tree (the proxy says so early)
    core.inbox.submit_retain(Retention({}, (), ("S", "L")))
    core.begin_eviction()
    assert core.stats().discarded == 2 and core.stats().discards == 2
    assert core.key(seg, 5.0) == (0, 0.0, 5.0) == core.key(None, 5.0)
    core.on_assign(None, later, 100)
    assert core.key(later, 6.0) == (0, 0.0, 6.0)
    # they stay discarded while resident (no expiry) ...
    core.clock = lambda: 1e9
    core.begin_eviction()
    assert core.key(seg, 5.0) == (0, 0.0, 5.0)
    # ... and are forgotten when they leave: content that comes back later starts afresh
    core.on_evicted(seg, 100)
    assert core.stats().discarded == 1
    core.inbox.submit_retain(Retention({}, (), ("S",)))
    # retaining an owner takes it out of the discarded set
    core.inbox.submit_retain(Retention({"S": (1.0, 60.0, 100)}))
    core.on_assign(None, seg, 100)
    core.begin_eviction()
    assert core.stats().discarded == 1 and core.key(seg, 5.0) == (2, 1.0, 5.0)
    # the set is bounded, the oldest word dropped first
    core.inbox.submit_retain(Retention({}, (), tuple(f"x{n}" for n in range(MAX_RETAINED))))
    core.begin_eviction()
    assert core.stats().discarded == MAX_RETAINED and core.key(later, 6.0) == (1, 0.0, 6.0)


# ---- through the proxy ----------------------------------------------------------------------
TOKEN = "credit-test-token"
POOL = 4000
FLOOD = "127.0.0.2"
VICTIM = "127.0.0.3"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "track",
            "parameters": {
                "type": "object",
                "properties": {"region": {"type": "string", "enum": ["north", "south"]}},
                "required": ["region"],
            },
        },
    }
]


def _words(n: int, seed: int) -> str:
    return " ".join(random_words(np.random.default_rng(seed), n))


async def test_a_flood_that_never_returns_leaves_the_victims_prompt_cached(tmp_path) -> None:
    """A client opens tool-calling sessions (~800 tokens each, answers forced to a tool
    call) one after another and never continues them; between two of them another client
    re-sends one chat, its whole prompt a private piece (the most fragile shape). The
    pool (4,000 tokens) overflows many times over. Before this rule the flood's pieces
    were retained or ranked as segments, above the victim's private prompt, which went
    first at every pass; now the flood earns nothing and its pieces go with private ones
    by last access, as under LRU: the victim's prompt stays cached at every re-send."""
    sim_args = ["--kv-capacity-tokens", str(POOL), "--speed", "50", "--log-level", "warning"]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    victim_body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Rules: " + _words(450, 1) + " Which rule?"}],
        "max_tokens": 4,
    }
    with dart_sim(tmp_path, TOKEN, sim_args) as (sim, control_url):

        def stats() -> dict:
            return httpx.get(control_url + "/prism/stats", headers=auth, timeout=10.0).json()

        async with running_proxy(
            sim.url, control_url=control_url, control_token=TOKEN, sessions=True
        ) as proxy:
            flood = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(local_address=FLOOD), timeout=60.0
            )
            victim = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(local_address=VICTIM), timeout=60.0
            )
            url = proxy.url + "/v1/chat/completions"
            shares: list[tuple[int, int]] = []
            try:
                first = await victim.post(url, json=victim_body)
                assert first.status_code == 200, first.text
                for n in range(24):
                    body = {
                        "model": "m",
                        "messages": [
                            {"role": "system", "content": "You track parcels. Use the tool."},
                            {"role": "user", "content": f"Case {n}. " + _words(620, n + 2)},
                        ],
                        "tools": TOOLS,
                        "tool_choice": "required",
                        "max_tokens": 32,
                    }
                    answer = await flood.post(url, json=body)
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["choices"][0]["finish_reason"] == "tool_calls"
                    # the proxy's word about this pause reached DART (pushed in the
                    # background): each unearned pause discards its resident last piece
                    await eventually(lambda n=n: stats()["discards"] >= n + 1, timeout_s=30.0)
                    again = await victim.post(url, json=victim_body)
                    assert again.status_code == 200, again.text
                    usage = again.json()["usage"]
                    shares.append(
                        (usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"])
                    )
            finally:
                await flood.aclose()
                await victim.aclose()
            final = stats()
        evicted = sim_metric(sim, "sglang:evicted_tokens_total")
    # the flood did overflow the pool, and earned no retention
    assert evicted > 3 * POOL
    assert final["retain_entries"] == 0 and final["discards"] >= 24
    # the victim's prompt (all but the token the engine always recomputes) stayed cached
    assert all(cached >= prompt - 1 for cached, prompt in shares), shares
    await asyncio.sleep(0)
