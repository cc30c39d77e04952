"""DART's eviction order in a real SGLang server under memory pressure (SPEC §3).

Two live servers with 2,048 KV tokens, one under DART and one under the plugin's `lru`
order, get the same requests: S+R+p1, then S+U+p2 (system head S = 20 tokens, documents
R and U = 100 each, private suffixes 10), anchors in `kv_hints` as the proxy sends them
(the head named by an id, its own DART owner), the table {R: 100} (U and S unranked)
pushed through the control RPC, then one private filler request that needs ~100 tokens
more than are free. DART evicts the private suffixes, then the unranked U, and keeps R
(S has no entry, so no protection, but it is the parent of every other node); LRU
evicts the oldest path, p1 then R, and keeps U. The plugin's eviction counters and the
`cached_tokens` of two probes show it, and its stats the protection cap it derived from
the real server's KV pool (a quarter of 2,048 tokens).

The test sends `/generate` itself, as the proxy would (same `make_kv_hints`), so that it
controls the table exactly; the proxy's own pushes are covered by test_live_proxy.py.
The last test kills the LRU server while the proxy streams from it.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from live_support import LiveServer, eventually

from prism_proxy.edge.gateway import GATEWAY
from prism_wire import make_kv_hints

pytestmark = pytest.mark.sglang

SYSTEM = list(range(100, 120))
DOCS = {"R": list(range(200, 300)), "U": list(range(400, 500))}
PRIVATE_TOKENS = 10  # the tests' eviction counts assume 10
TREE_TOKENS = len(SYSTEM) + 2 * (100 + PRIVATE_TOKENS)  # after the two requests


def private(number: int) -> list[int]:
    return list(range(1000 + 20 * number, 1000 + 20 * number + PRIVATE_TOKENS))


def request(doc: str, number: int) -> tuple[list[int], dict]:
    """The ids of S + doc + private suffix and their anchors (SPEC §1)."""
    ids = SYSTEM + DOCS[doc] + private(number)
    anchors = [
        {"kind": "system", "segment_id": "head-s", "offset": len(SYSTEM)},
        {"kind": "segment", "segment_id": doc, "offset": len(SYSTEM) + len(DOCS[doc])},
        {"kind": "private", "segment_id": None, "offset": len(ids)},
    ]
    return ids, make_kv_hints(anchors, {}, message_id=f"{doc}{number}")


def evicted(live: LiveServer) -> dict[str, int]:
    return live.stats()["evicted_tokens"]


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {kind: after[kind] - before[kind] for kind in after}


@pytest.mark.parametrize(
    ("server", "kept", "lost", "classes"),
    [
        # DART: both private suffixes (20), then the unranked document U.
        ("tight_dart", "R", "U", {"private": 20, "segment": 100, "protected": 0, "retained": 0}),
        # LRU: the oldest path: p1, then R (a leaf once p1 is gone), which DART's
        # counters class as protected: F_t = {R} for the table {R: 100}, f = 2 (S has
        # no entry: a head earns protection by demand only).
        ("tight_lru", "U", "R", {"private": 10, "segment": 0, "protected": 100, "retained": 0}),
    ],
)
def test_ranked_document_survives_pressure_and_lru_flips_it(
    live: dict[str, LiveServer], server: str, kept: str, lost: str, classes: dict[str, int]
) -> None:
    live_server = live[server]
    live_server.fresh()
    for number, doc in enumerate(("R", "U"), start=1):
        ids, hints = request(doc, number)
        assert live_server.generate(ids, kv_hints=hints)["meta_info"]["cached_tokens"] == (
            0 if doc == "R" else len(SYSTEM)
        )
    table = {"epoch": 1, "table": {"R": 100.0}, "protect": 2}
    assert live_server.control("POST", "/prism/priorities", json=table).status_code == 200
    stats = live_server.stats()
    assert stats["anchors_resident"] == 5  # S, R, p1, U, p2: anchors came through kv_hints
    # the pool's size as the scheduler's real KV allocator reports it, and a quarter of it
    assert stats["capacity_tokens"] == live_server.max_total_tokens
    assert stats["protect_cap_tokens"] == live_server.max_total_tokens // 4
    before = evicted(live_server)

    # A private filler ~100 tokens larger than the free pool forces one eviction pass.
    free = live_server.max_total_tokens - TREE_TOKENS
    filler = list(range(3000, 3000 + free + 98))
    assert live_server.generate(filler)["meta_info"]["cached_tokens"] == 0
    moved = delta(evicted(live_server), before)
    assert moved == classes
    if kept == "R":  # the table was applied at that pass: R, not the unranked head
        stats = live_server.stats()
        assert stats["protected_segments"] == ["R"] and stats["protected_tokens"] == 100

    # Probe the survivor first: the other probe needs ~100 tokens and evicts in its turn.
    ids, _ = request(kept, 3)
    assert live_server.generate(ids)["meta_info"]["cached_tokens"] == len(SYSTEM) + 100
    assert delta(evicted(live_server), before) == moved  # that probe fit without evicting
    ids, _ = request(lost, 4)
    assert live_server.generate(ids)["meta_info"]["cached_tokens"] == len(SYSTEM)


HISTORY = {"A": list(range(1500, 1800)), "B": list(range(1800, 2100))}


def session_call(name: str) -> tuple[list[int], dict]:
    """An agent session's call as the proxy with `sessions` on sends it: the system head,
    the history up to its last message as one segment (the session's key), and the
    generation prompt private."""
    ids = SYSTEM + HISTORY[name] + private(10 + len(name))
    anchors = [
        {"kind": "system", "segment_id": "head-s", "offset": len(SYSTEM)},
        {"kind": "segment", "segment_id": f"key-{name}", "offset": len(SYSTEM) + 300},
        {"kind": "private", "segment_id": None, "offset": len(ids)},
    ]
    return ids, make_kv_hints(anchors, {}, message_id=f"call-{name}")


@pytest.mark.parametrize(("server", "survivor"), [("tight_dart", "A"), ("tight_lru", "B")])
def test_a_paused_sessions_history_survives_where_lru_drops_it(
    live: dict[str, LiveServer], server: str, survivor: str
) -> None:
    """Session A's call ends in a tool call and the proxy asks DART to retain its path
    (`POST /prism/retain`); session B runs after it and finishes. A filler needs room for
    about one history: under DART, B (finished, unretained) goes and A's history is
    still cached when A comes back; under the plugin's LRU order the older path, A's, goes
    (it accepts the retention but its order ignores it)."""
    live_server = live[server]
    live_server.fresh()
    for name in ("A", "B"):
        ids, hints = session_call(name)
        live_server.generate(ids, kv_hints=hints)
        if name == "A":
            body = {"retain": {"key-A": [1.0, 600.0]}}
            assert live_server.control("POST", "/prism/retain", json=body).status_code == 200
    assert live_server.stats()["retained"] == 1
    used = len(SYSTEM) + 2 * (300 + PRIVATE_TOKENS + 1)
    filler = list(range(3000, 3000 + live_server.max_total_tokens - used + 150))
    assert live_server.generate(filler)["meta_info"]["cached_tokens"] == 0
    ids, _ = session_call(survivor)
    assert live_server.generate(ids)["meta_info"]["cached_tokens"] >= len(SYSTEM) + 300
    ids, _ = session_call("B" if survivor == "A" else "A")
    assert live_server.generate(ids)["meta_info"]["cached_tokens"] <= len(SYSTEM)
    if server == "tight_dart":
        live_server.control("POST", "/prism/retain", json={"release": ["key-A"]})
        live_server.generate(private(30))  # the scheduler applies it at its next tree step
        assert live_server.stats()["retained"] == 0


async def test_backend_killed_mid_stream_ends_the_stream_and_leaks_nothing(
    live: dict[str, LiveServer], live_proxy_factory
) -> None:
    """SGLang dies while the proxy streams from it: the client gets an error event and
    `[DONE]`, and the proxy's queue, in-flight and pending counts return to 0. (Runs
    last in this module: it stops `tight_lru` for good.)"""
    live_server = live["tight_lru"]
    live_server.fresh()
    # a long stream on a 2,048-token pool: above the default bound on one request's
    # decode (a quarter of the pool, edge.limits), which this test does not test
    proxy = await live_proxy_factory(live_server, max_decode_tokens=2048)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 1800,
        "ignore_eos": True,
        "stream": True,
    }
    events: list[object] = []
    async with (
        aiohttp.ClientSession() as http,
        http.post(proxy.url + "/v1/chat/completions", json=body) as response,
    ):
        assert response.status == 200
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
            if len(events) == 3:  # streaming for real: kill the server now
                await asyncio.to_thread(live_server.server.stop, 30.0)
    assert events[-1] == "[DONE]"
    error = events[-2]
    assert isinstance(error, dict) and error["error"]["code"] == 502, error
    admission = proxy.app[GATEWAY].admission
    await eventually(lambda: admission.inflight == 0)
    assert admission.queue_depth == 0
    assert admission.inflight == 0 and admission.pending_prefill == 0
