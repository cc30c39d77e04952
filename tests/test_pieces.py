"""Long prefills in pieces (`admission.pieces`, `edge.pieces`): the rules alone, then
through a real proxy in front of prism-sim (real HTTP, the real `openai` client)."""

from __future__ import annotations

import asyncio
import itertools
import random

import openai
import pytest

from loadgen.stack.processes import ServerProcess, run_server
from prism_proxy.admission.core import AdmissionCore, PrefillPacing
from prism_proxy.admission.driver import AdmissionController
from prism_proxy.admission.pieces import (
    MIN_PIECE_TOKENS,
    PIECE_ALIGN,
    PrefillTurns,
    piece_ends,
    piece_size,
)
from prism_proxy.app import RunningProxy
from prism_proxy.backend.client import BackendClient
from prism_proxy.edge.gateway import GATEWAY
from prism_proxy.edge.pieces import PieceSender, piece_body
from prism_proxy.metrics import ProxyMetrics
from prism_proxy.qas.policies import make_policy
from prism_proxy.qas.types import QueuedRequest
from prism_wire import make_kv_hints, parse_kv_hints
from tests.proxy_support import eventually, running_proxy, sim_metric

# --- the rules ---------------------------------------------------------------------


def test_piece_ends_leave_the_request_one_to_two_pieces_uncached() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        length = rng.randrange(0, 40_000)
        known = rng.randrange(0, length + 1000)
        setting = rng.choice([rng.randrange(MIN_PIECE_TOKENS, 5000), 256, 512, 8192])
        ends = piece_ends(length, known, setting)
        step = -(-setting // PIECE_ALIGN) * PIECE_ALIGN
        start = min(known, length) // PIECE_ALIGN * PIECE_ALIGN
        if not ends:
            assert length - start < 2 * step
            continue
        assert all(end % PIECE_ALIGN == 0 for end in ends)
        assert ends[0] == start + step
        assert all(b - a == step for a, b in itertools.pairwise(ends))
        assert step <= length - ends[-1] < 2 * step  # what the request itself prefills


def test_piece_ends_off_and_piece_size_auto() -> None:
    assert piece_ends(100_000, 0, 0) == []
    assert piece_ends(0, 0, 512) == []
    assert piece_size(None, 4096) == 4096  # auto: the engine's step
    assert piece_size(None, None) > 0
    assert piece_size(256, 4096) == 256


async def test_a_cancelled_waiter_leaves_the_line() -> None:
    turns = PrefillTurns(capacity=1)
    order: list[str] = []
    await turns.acquire()

    async def take(name: str) -> None:
        await turns.acquire()
        order.append(name)

    gone = asyncio.create_task(take("second"))
    await eventually(lambda: turns.waiting == 1)
    late = asyncio.create_task(take("third"))
    await eventually(lambda: turns.waiting == 2)
    gone.cancel()
    await eventually(lambda: turns.waiting == 1)
    turns.release()
    await late
    assert order == ["third"] and turns.held == 1
    turns.release()
    assert turns.held == 0
    with pytest.raises(RuntimeError):
        turns.release()


async def test_turns_go_first_come_first_served() -> None:
    turns = PrefillTurns(capacity=2)
    await turns.acquire()
    await turns.acquire()
    got: list[str] = []

    async def take(name: str) -> None:
        await turns.acquire()
        got.append(name)

    tasks = [asyncio.create_task(take("earlier"))]
    await eventually(lambda: turns.waiting == 1)
    tasks.append(asyncio.create_task(take("later")))
    await eventually(lambda: turns.waiting == 2)
    turns.release()
    await eventually(lambda: len(got) == 1)
    assert got == ["earlier"]
    turns.release()
    await asyncio.gather(*tasks)
    assert got == ["earlier", "later"] and turns.held == 2


async def test_what_is_cached_is_asked_only_of_a_prompt_longer_than_one_piece() -> None:
    # `known` walks the prompt (the client's own prefixes): a short prompt never asks it
    metrics = ProxyMetrics.create()
    core = AdmissionCore(make_policy("fifo"), PrefillPacing(), window_s=0.0, max_queue=10)
    session = BackendClient.create_session()
    backend = BackendClient(
        session, "http://127.0.0.1:9", metrics=metrics, timeout_s=1.0, connect_timeout_s=1.0
    )
    sender = PieceSender(AdmissionController(core, metrics=metrics), backend, metrics, 512)
    asked: list[int] = []

    def known(tokens: int):
        def ask() -> int:
            asked.append(tokens)
            return tokens

        return ask

    try:
        short = {"input_ids": list(range(512))}
        assert await sender.send(short, "short", known(0), None) is None
        assert asked == []
        # longer than a piece, but all cached but one piece: asked, then sent whole
        long = {"input_ids": list(range(2048))}
        assert await sender.send(long, "long", known(2048 - 512), None) is None
        assert asked == [2048 - 512]
    finally:
        await session.close()


def test_a_parked_request_frees_its_place_in_b_until_unparked() -> None:
    core = AdmissionCore(make_policy("fifo"), PrefillPacing(prefill_batch=1), window_s=0.0,
                         max_queue=10)  # fmt: skip
    for rid in ("long", "short"):
        core.arrive(QueuedRequest(rid=rid, arrival=0.0, segments=()), 0.0)
    wave = core.run_round(0.0)
    assert wave is not None and [r.rid for r in wave.released] == ["long"]
    assert core.run_round(0.1) is None  # B = 1 is taken
    core.park("long")
    assert core.pending_prefill == 0 and core.inflight == 1
    wave = core.run_round(0.2)
    assert wave is not None and [r.rid for r in wave.released] == ["short"]
    core.unpark("long")
    assert core.pending_prefill == 2
    core.first_token("long", 100, 0.5)
    assert core.prefill_s == pytest.approx(0.5)  # from its release, parked time included
    core.park("short")
    assert core.finish("short") and core.pending_prefill == 0 and core.inflight == 1


def test_a_piece_carries_the_cache_key_and_nothing_the_client_asked_for() -> None:
    anchors = [
        {"kind": "segment", "segment_id": f"s{i}", "offset": 100 * (i + 1)} for i in range(5)
    ]
    payload = {
        "input_ids": list(range(600)),
        "rid": "r1",
        "sampling_params": {"max_new_tokens": 500, "temperature": 0.7, "json_schema": "{}"},
        "return_logprob": True,
        "top_logprobs_num": 5,
        "extra_key": "tenant-a",
        "kv_hints": make_kv_hints(anchors, {"s0": 2.0}, message_id="r1"),
    }
    body = piece_body(payload, 256, "r1-piece0")
    assert body["input_ids"] == list(range(256))
    assert body["extra_key"] == "tenant-a"
    assert body["sampling_params"] == {"max_new_tokens": 1, "temperature": 0.0}
    assert "return_logprob" not in body and "top_logprobs_num" not in body
    hints = parse_kv_hints(body["kv_hints"])
    assert hints is not None
    assert [a.offset for a in hints.anchors] == [100, 200]
    assert dict(hints.priorities) == {"s0": 2.0}
    plain = piece_body({"input_ids": [1, 2, 3], "rid": "r"}, 2, "r-piece0")
    assert set(plain) == {"input_ids", "rid", "sampling_params"}


# --- through the proxy ---------------------------------------------------------------

# prism-sim in real time with its GPU model (a long prompt's prefill takes a visible
# while), answering each prompt with the same text.
SIM_ARGS = ["--speed", "1", "--log-level", "warning", "--answer-text", "the same answer"]
WORDS = ("river", "delta", "basin", "bank", "ford", "weir", "lock", "estuary")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    with run_server("prism_sim", SIM_ARGS, log_dir=tmp_path_factory.mktemp("sim")) as server:
        yield server


def long_text(seed: int, words: int = 1500) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(10**6)) for _ in range(words))


async def first_token_s(
    client: openai.AsyncOpenAI, text: str, started: float
) -> tuple[float, int, int]:
    """A streamed chat: when its first content came (from `started`), its prompt
    tokens and the cached tokens it was told of."""
    stream = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": text}],
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    seen: float | None = None
    usage = None
    async for chunk in stream:
        if seen is None and chunk.choices and chunk.choices[0].delta.content:
            seen = asyncio.get_running_loop().time() - started
        usage = chunk.usage or usage
    assert seen is not None and usage is not None
    details = usage.prompt_tokens_details
    return seen, usage.prompt_tokens, (details.cached_tokens or 0) if details else 0


async def test_a_short_chat_goes_between_the_pieces_of_long_prompts(sim: ServerProcess) -> None:
    """Four long new prompts at once, pieces of 256 tokens: a short chat sent once
    pieces are under way has its first token before the last long prompt's; each long
    prompt is told only the reuse it found, not the pieces sent for it."""
    async with running_proxy(sim.url, prefill_piece_tokens=256) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="none", max_retries=0)
        began = asyncio.get_running_loop().time()
        longs = [asyncio.create_task(first_token_s(client, long_text(i), began)) for i in range(4)]
        await eventually(lambda: proxy_pieces(proxy) >= 1, timeout_s=60.0)
        short, _, _ = await first_token_s(client, "One short question?", began)
        answers = await asyncio.gather(*longs)
        assert short < max(seen for seen, _, _ in answers)
        for _, prompt_tokens, cached in answers:
            assert prompt_tokens > 4 * 256 and cached < 256
        assert proxy_pieces(proxy) >= 4
        admission = proxy.app[GATEWAY].admission
        await eventually(lambda: admission.inflight == 0)  # nothing leaks
        assert admission.turns.held == 0 and admission.pending_prefill == 0
        # The same prompt again is cached whole: the pieces cached what the request needs.
        _, prompt_tokens, cached = await first_token_s(client, long_text(0), began)
        assert prompt_tokens == answers[0][1] and cached > prompt_tokens - 256


async def test_long_prompts_under_two_pieces_take_turns_uncut(sim: ServerProcess) -> None:
    """Prompts of 1-2 pieces uncached are not cut but go to the engine one at a time,
    parked meanwhile: a short chat sent while they wait their turns goes to the engine
    at once (B = 8 is not used up by them) and comes before the last of them (the
    engine serves first come, first served: released together, it would come last)."""
    async with running_proxy(sim.url, prefill_piece_tokens=4096, prefill_batch=8) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="none", max_retries=0)
        admission = proxy.app[GATEWAY].admission
        began = asyncio.get_running_loop().time()
        longs = [
            asyncio.create_task(first_token_s(client, long_text(200 + i), began)) for i in range(4)
        ]
        await eventually(lambda: admission.turns.waiting >= 1, timeout_s=60.0)
        short, _, _ = await first_token_s(client, "One short question?", began)
        answers = await asyncio.gather(*longs)
        assert all(4096 < prompt < 2 * 4096 for _, prompt, _ in answers)
        assert proxy_pieces(proxy) == 0
        assert short < max(seen for seen, _, _ in answers)
        await eventually(lambda: admission.inflight == 0)
        assert admission.turns.held == 0


async def test_a_client_gone_during_the_pieces_leaves_nothing(sim: ServerProcess) -> None:
    async with running_proxy(sim.url, prefill_piece_tokens=256) as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="none", max_retries=0)
        began = asyncio.get_running_loop().time()
        # Two, so that the pieces go on (a prompt alone goes whole after its first).
        longs = [
            asyncio.create_task(first_token_s(client, long_text(100 + i), began)) for i in range(2)
        ]
        await eventually(lambda: proxy_pieces(proxy) >= 2, timeout_s=60.0)
        for task in longs:
            task.cancel()
        await asyncio.gather(*longs, return_exceptions=True)
        admission = proxy.app[GATEWAY].admission
        await eventually(lambda: admission.inflight == 0, timeout_s=30.0)
        assert admission.turns.held == 0 and admission.turns.waiting == 0
        # The proxy still serves, and the engine runs nothing of theirs.
        _, prompt_tokens, _ = await first_token_s(client, "Still there?", began)
        assert prompt_tokens > 0
        await eventually(lambda: sim_metric(sim, "sglang:num_running_reqs") == 0, timeout_s=30.0)


def proxy_pieces(proxy: RunningProxy) -> float:
    registry = proxy.app[GATEWAY].metrics.registry
    return registry.get_sample_value("prism:prefill_pieces_total") or 0.0
