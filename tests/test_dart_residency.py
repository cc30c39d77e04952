"""DART's residency summaries (SPEC §2 c_t, §4): the change log driven through the
simulator's radix tree with the DART extension, `GET /prism/residency` over real HTTP,
and the proxy's `ControlClient.fetch_residency` + `ResidencyPoller` against a real
`prism-sim --eviction dart` subprocess under memory pressure.

Requests are S + one segment + a private suffix (S = 8 tokens, segments 6, suffix 4),
anchored as the proxy anchors them. Each segment entering or leaving the tree is one
version step; the system prompt S is never reported.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from proxy_support import eventually, loopback_app

from backend_plugin.config import ControlConfig
from backend_plugin.control_rpc import start_control_site
from backend_plugin.dart import DartCore, NodeMeta
from backend_plugin.dart.residency import ResidencyLog
from backend_plugin.sim_extension import DartSimExtension
from loadgen.stack.processes import free_port, run_server
from prism_proxy.backend.control import ControlClient
from prism_proxy.backend.residency_poller import ResidencyPoller
from prism_proxy.metrics import ProxyMetrics
from prism_proxy.qas.residency import ResidentSegments
from prism_sim.radix_cache import RadixCache
from prism_sim.request import SimRequest
from prism_wire import AnchorKind, make_kv_hints, system_owner

TOKEN = "residency-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SYSTEM = list(range(1000, 1008))
SEGMENTS = {name: list(range(2000 + 10 * i, 2006 + 10 * i)) for i, name in enumerate("ABCDE")}


def anchors(segment: str, private_len: int = 4) -> list[dict]:
    return [
        {"kind": "system", "segment_id": "h", "offset": 8},
        {"kind": "segment", "segment_id": segment, "offset": 14},
        {"kind": "private", "segment_id": None, "offset": 14 + private_len},
    ]


def prompt(segment: str, number: int) -> list[int]:
    return SYSTEM + SEGMENTS[segment] + [3000 + 10 * number + k for k in range(4)]


class Tree:
    """The simulator's radix cache with DART attached, fed as the engine feeds it."""

    def __init__(self, max_entries: int = 1 << 17) -> None:
        self.core = DartCore(protect=2, residency=ResidencyLog(max_entries))
        self.ext = DartSimExtension(self.core)
        self.cache = RadixCache(self.ext.strategy)
        self.ext.attach(self.cache)
        self.count = 0

    def insert(self, segment: str | None) -> None:
        self.count += 1
        if segment is None:  # a private prompt, no hints
            tokens, hints = [9000 + self.count * 50 + k for k in range(5)], None
        else:
            tokens = prompt(segment, self.count)
            hints = make_kv_hints(anchors(segment), message_id=f"r{self.count}")
        req = SimRequest(
            rid=f"r{self.count}", input_ids=tokens, max_new_tokens=1, arrival_s=0.0, kv_hints=hints
        )
        self.cache.insert(tokens)
        self.ext.on_insert(req, self.cache, tokens)

    def evict_all(self) -> None:
        self.cache.evict(self.cache.total_size())

    def summary(self, generation: str | None = None, since: int | None = None) -> Any:
        return self.core.residency_summary(generation, since)

    @property
    def generation(self) -> str:
        return self.core.residency.generation


# ---- the change log on the simulator's tree ------------------------------------------


def test_full_then_deltas_follow_the_tree() -> None:
    tree = Tree()
    first = tree.summary()
    assert (first.full, first.resident, first.gone, first.version) == (True, (), (), 0)
    tree.insert("A")
    tree.insert("B")
    tree.insert("A")  # already resident: no transition
    full = tree.summary()
    assert full.full and sorted(full.resident) == ["A", "B"] and full.version == 2
    assert full.generation == tree.generation and len(tree.generation) == 16
    tree.insert("C")
    delta = tree.summary(tree.generation, full.version)
    assert (delta.full, delta.resident, delta.gone, delta.version) == (False, ("C",), (), 3)
    steady = tree.summary(tree.generation, delta.version)
    assert (steady.full, steady.resident, steady.gone) == (False, (), ())
    stats = tree.core.stats().as_dict()
    assert stats["segments_resident"] == 3 and stats["residency_version"] == 3


def test_evicted_segments_are_gone_and_the_delta_is_net() -> None:
    tree = Tree()
    for segment in "ABC":
        tree.insert(segment)
    held = tree.summary().version  # 3
    tree.evict_all()  # A, B, C leave: versions 4-6
    tree.insert("B")  # B comes back: version 7
    delta = tree.summary(tree.generation, held)
    assert not delta.full and delta.version == 7
    # Net state of each changed segment, whatever the order of its transitions.
    assert delta.resident == ("B",) and sorted(delta.gone) == ["A", "C"]
    assert tree.core.stats().segments_resident == 1


def test_system_prompt_is_never_reported() -> None:
    tree = Tree()
    tree.insert("A")
    tree.evict_all()
    tree.insert("B")
    assert tree.core.stats().annotated_tokens_resident > 6  # S is annotated and resident
    full = tree.summary()
    assert full.resident == ("B",) and system_owner("h") not in full.resident
    assert full.version == 3  # A in, A out, B in: S's own comings and goings are not steps
    assert system_owner("h") not in tree.summary(tree.generation, 0).gone


@pytest.mark.parametrize(
    ("generation", "since"),
    [
        ("another-dart", 1),  # a restarted server: another generation
        (None, 1),  # no generation held
        ("<own>", None),  # no version held
        ("<own>", 3),  # ahead of the server's version
    ],
)
def test_unanswerable_requests_get_the_full_set(generation: str | None, since: int | None) -> None:
    tree = Tree()
    tree.insert("A")
    tree.insert("B")
    own = tree.generation if generation == "<own>" else generation
    answer = tree.summary(own, since)
    assert answer.full and sorted(answer.resident) == ["A", "B"] and answer.gone == ()
    assert answer.version == 2 and answer.generation == tree.generation


def test_pruned_changes_move_the_horizon() -> None:
    """max_entries 2: A(1), B(2), C(3) push A out, so the horizon is 1; since 0 would
    miss A and gets the full set; since 1 is answered by B and C."""
    tree = Tree(max_entries=2)
    for segment in "ABC":
        tree.insert(segment)
    assert tree.core.residency.horizon == 1
    assert tree.summary(tree.generation, 0).full
    delta = tree.summary(tree.generation, 1)
    assert not delta.full and sorted(delta.resident) == ["B", "C"]
    full = tree.summary()
    assert sorted(full.resident) == ["A", "B", "C"]  # pruned changes, not residents


def test_a_flush_clears_residency_in_one_step() -> None:
    tree = Tree()
    tree.insert("A")
    tree.insert("B")
    held = tree.summary().version  # 2
    tree.cache.reset()  # what /flush_cache does
    tree.insert(None)  # the extension notices the new root at its next insertion
    after = tree.summary(tree.generation, held)
    assert after.full and after.resident == () and after.version == 3
    tree.insert("C")
    delta = tree.summary(tree.generation, 3)
    assert (delta.full, delta.resident, delta.gone) == (False, ("C",), ())


def test_a_reader_thread_following_deltas_ends_with_the_owners_set() -> None:
    """The RPC thread polls deltas while the tree's owner makes transitions (thread
    switches forced every microsecond): the set rebuilt from full + deltas always ends
    equal to the owner's, and versions never go back."""
    import random
    import sys
    import threading

    core = DartCore()
    metas = {f"s{i}": NodeMeta(AnchorKind.SEGMENT, f"s{i}", True) for i in range(200)}
    tokens: dict[str, int] = {}
    done = threading.Event()
    seen: list[int] = []
    copy: set[str] = set()

    def owner() -> None:
        rng = random.Random(7)
        for _ in range(20_000):
            name = rng.choice(list(metas))
            if tokens.get(name) and rng.random() < 0.5:
                core.on_evicted(metas[name], tokens.pop(name))
            else:
                tokens[name] = tokens.get(name, 0) + 3
                core.on_assign(None, metas[name], 3)
        done.set()

    def reader() -> None:
        generation, version = None, None
        while True:
            finished = done.is_set()
            answer = core.residency_summary(generation, version)
            if answer.full:
                copy.clear()
            copy.difference_update(answer.gone)
            copy.update(answer.resident)
            generation, version = answer.generation, answer.version
            seen.append(version)
            if finished:
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=owner), threading.Thread(target=reader)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert copy == {name for name, n in tokens.items() if n > 0}
    assert seen == sorted(seen) and len(seen) > 1
    assert core.stats().segments_resident == len(copy)


# ---- GET /prism/residency ------------------------------------------------------------


@pytest.fixture
async def rpc() -> AsyncIterator[tuple[Tree, httpx.AsyncClient]]:
    tree = Tree()
    runner, port = await start_control_site(
        tree.core, ControlConfig(port=0, token=TOKEN), apply_inline=True
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        yield tree, client
    await runner.cleanup()


async def test_route_needs_the_token_and_answers_json(rpc) -> None:
    tree, client = rpc
    assert (await client.get("/prism/residency")).status_code == 401
    tree.insert("A")
    tree.insert("B")
    r = await client.get("/prism/residency", headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"generation", "version", "full", "resident", "gone"}
    assert body["full"] and sorted(body["resident"]) == ["A", "B"] and body["version"] == 2
    tree.evict_all()
    params = {"generation": body["generation"], "since": str(body["version"])}
    delta = (await client.get("/prism/residency", params=params, headers=AUTH)).json()
    assert delta["full"] is False and delta["resident"] == []
    assert sorted(delta["gone"]) == ["A", "B"] and delta["version"] == 4
    metrics = (await client.get("/prism/metrics", headers=AUTH)).text
    samples = {s.name: s.value for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert samples["prism:dart_segments_resident"] == 0
    assert samples["prism:dart_residency_version"] == 4


async def test_the_poller_task_follows_the_tree(rpc) -> None:
    tree, client = rpc
    target = ResidentSegments()
    async with aiohttp.ClientSession() as session:
        poller = ResidencyPoller(_client(session, str(client.base_url)), target, 0.01)
        task = asyncio.create_task(poller.run())
        try:
            tree.insert("A")
            await eventually(lambda: target.resident() == {"A"})
            tree.insert("B")
            tree.evict_all()
            tree.insert("C")  # versions: A 1, B 2, both out 3-4, C 5
            await eventually(lambda: target.resident() == {"C"} and target.version == 5)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.mark.parametrize("since", ["-1", "abc", "", "1.5", "1e3", " 3", "+3", "٣", "9" * 20])
async def test_a_bad_since_is_400(rpc, since: str) -> None:
    _, client = rpc
    r = await client.get("/prism/residency", params={"since": since}, headers=AUTH)
    assert r.status_code == 400
    assert r.json()["error"] == "since must be a non-negative integer"


# ---- the proxy's poller ---------------------------------------------------------------


def _client(session: aiohttp.ClientSession, url: str, token: str | None = TOKEN) -> ControlClient:
    return ControlClient(session, url, token=token, protect=2, metrics=ProxyMetrics.create())


def _generate(client: httpx.Client, rid: str, ids: list[int], kv_hints: Any = None) -> None:
    body: dict[str, Any] = {"rid": rid, "input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
    if kv_hints is not None:
        body["kv_hints"] = kv_hints
    assert client.post("/generate", json=body).status_code == 200


@pytest.mark.slow
async def test_poller_follows_the_simulators_cache_under_pressure(tmp_path) -> None:
    """Capacity 64 (the scenario of test_dart_sim.py): S+A+pA ... S+D+pD fill 52; with
    {A: 40, B: 10, C: 30, D: 20}, f = 2, a fresh 40-token prompt makes DART drop the
    private suffixes, then B and D; A and C stay."""
    control_port = free_port()
    args = ["--eviction", "dart", "--kv-capacity-tokens", "64", "--max-running-requests", "1"]
    args += ["--speed", "50", "--control-port", str(control_port)]
    target = ResidentSegments()
    with (
        run_server(
            "prism_sim",
            args,
            log_dir=tmp_path,
            name="sim-residency",
            env={"PRISM_CONTROL_TOKEN": TOKEN},
        ) as server,
        httpx.Client(base_url=server.url, timeout=30) as engine,
    ):
        async with aiohttp.ClientSession() as session:
            control = _client(session, f"http://127.0.0.1:{control_port}")
            poller = ResidencyPoller(control, target)
            assert await poller.poll_once() and target.resident() == frozenset()
            for i, segment in enumerate("ABCD"):
                hints = make_kv_hints(anchors(segment), message_id=segment)
                _generate(engine, f"r{segment}", prompt(segment, i), hints)
            assert await poller.poll_once()
            assert target.resident() == {"A", "B", "C", "D"} and target.version == 4
            held = target.version

            table = {"epoch": 1, "table": {"A": 40, "B": 10, "C": 30, "D": 20}, "protect": 2}
            async with session.post(
                control.url + "/prism/priorities", json=table, headers=AUTH
            ) as response:
                assert response.status == 200
            _generate(engine, "fresh", [5000 + k for k in range(40)])
            delta = await control.fetch_residency(target.generation, held)
            assert delta is not None and not delta.full
            assert delta.resident == () and set(delta.gone) == {"B", "D"}
            assert await poller.poll_once()
            assert target.resident() == {"A", "C"} and target.version == 6
            full = await control.fetch_residency(None, None)
            assert full is not None and full.full and set(full.resident) == {"A", "C"}
            unauthorized = await _client(session, control.url, token=None).fetch_residency(
                None, None
            )
            assert unauthorized is None
    # The server is gone: residency is unknown, the copy is cleared, the poller backs off.
    async with aiohttp.ClientSession() as session:
        poller = ResidencyPoller(_client(session, f"http://127.0.0.1:{control_port}"), target)
        assert not await poller.poll_once()
        assert target.resident() == frozenset() and target.generation is None
        assert poller.backoff_s == 0.5
        assert not await poller.poll_once() and poller.backoff_s == 1.0


def _scripted_rpc(answers: list[dict], queries: list[dict[str, str]]) -> web.Application:
    """A loopback RPC answering `answers` in turn (what a racing or broken server may
    send), recording each query."""

    async def residency(request: web.Request) -> web.Response:
        queries.append(dict(request.query))
        return web.json_response(answers[min(len(queries), len(answers)) - 1])

    app = web.Application()
    app.router.add_get("/prism/residency", residency)
    return app


async def test_a_delta_of_another_generation_makes_the_poller_ask_for_everything() -> None:
    answers = [
        {"generation": "g1", "version": 5, "full": True, "resident": ["A"], "gone": []},
        {"generation": "g2", "version": 9, "full": False, "resident": ["B"], "gone": []},
        {"generation": "g2", "version": 9, "full": True, "resident": ["B"], "gone": []},
    ]
    queries: list[dict[str, str]] = []
    target = ResidentSegments()
    async with loopback_app(_scripted_rpc(answers, queries)) as url, aiohttp.ClientSession() as s:
        poller = ResidencyPoller(_client(s, url), target)
        assert await poller.poll_once() and target.resident() == {"A"}
        assert not await poller.poll_once()  # g2's delta does not apply to g1's copy
        assert target.resident() == {"A"} and target.generation == "g1"
        assert await poller.poll_once() and target.resident() == {"B"}
    assert queries == [{}, {"generation": "g1", "since": "5"}, {}]


@pytest.mark.parametrize(
    "answer",
    [
        {"generation": "g", "version": -1, "full": True, "resident": [], "gone": []},
        {"generation": "g", "version": True, "full": True, "resident": [], "gone": []},
        {"generation": "g", "version": 1, "full": True, "resident": [], "gone": ["A"]},
        {"generation": "g", "version": 1, "full": False, "resident": ["A"], "gone": ["A"]},
        {"generation": "g", "version": 1, "full": "yes", "resident": [], "gone": []},
        {"generation": "g", "version": 1, "full": True, "resident": [1], "gone": []},
        {"generation": "g", "version": 1, "full": True, "resident": []},
        {"generation": "", "version": 1, "full": True, "resident": [], "gone": []},
        {"generation": "g", "version": 1, "full": True, "resident": [], "gone": [], "x": 1},
    ],
)
async def test_a_malformed_answer_is_a_failed_poll(answer: dict) -> None:
    target = ResidentSegments()
    async with loopback_app(_scripted_rpc([answer], [])) as url, aiohttp.ClientSession() as s:
        client = _client(s, url)
        assert await client.fetch_residency(None, None) is None
        assert not await ResidencyPoller(client, target).poll_once()
    registry = client.metrics.registry  # polls leave the push metrics alone
    assert registry.get_sample_value("prism:control_rpc_failures_total") == 0
