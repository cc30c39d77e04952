"""Scheduler of the simulated engine, driven step by step in modeled time (SPEC §7)."""

from __future__ import annotations

import pytest
from sim_support import profile

from prism_sim.offline import TraceRequest, replay
from prism_sim.radix_cache import RadixCache
from prism_sim.request import SimRequest, Status
from prism_sim.schedule_policy import order_waiting
from prism_sim.scheduler import Batch, Scheduler, SchedulerConfig

FILLER = [900, 901, 902]


def scheduler(policy: str = "fcfs", **overrides: object) -> Scheduler:
    p = profile(**overrides)
    config = SchedulerConfig.from_profile(p, policy)
    clock = iter(range(1, 10**9))
    return Scheduler(config, p, RadixCache("lru", clock=lambda: float(next(clock))), FILLER)


def req(rid: str, ids: list[int], max_new: int = 3, **kw: object) -> SimRequest:
    return SimRequest(rid, ids, max_new, 0.0, **kw)  # type: ignore[arg-type]


def run(s: Scheduler, now: float = 0.0, check=None) -> tuple[float, list[Batch]]:
    """Run batches until idle; `check(s)` after each one."""
    batches = []
    while (batch := s.next_batch(now)) is not None:
        now += batch.duration_s
        s.complete_batch(batch, now)
        batches.append(batch)
        if check:
            check(s)
    return now, batches


def test_single_request_timeline_matches_the_time_model() -> None:
    s = scheduler()
    r = req("a", list(range(1, 101)), max_new=3)
    s.add_request(r, 0.0)
    now, batches = run(s)
    assert [b.kind for b in batches] == ["prefill", "decode", "decode"]
    # prefill 0.01 + 100/1000 = 0.11 s; two decode steps of 0.005 + 0.001·1 = 0.006 s
    assert r.first_token_s == pytest.approx(0.11)
    assert r.finish_s == pytest.approx(0.122) == now
    assert r.output_ids == FILLER
    assert r.finish_reason == {"type": "length", "length": 3}
    # Prompt + the two outputs whose KV exists stay cached, unlocked, split at the
    # prompt's end (SGLang's split_prompt) so the outputs can go first.
    assert s.cache.total_size() == 102 and s.cache.protected_size() == 0
    assert sorted(len(n.key) for n in s.cache.nodes()) == [2, 100]
    assert s.held_tokens_total == 0


def test_live_requests_include_those_in_an_inflight_prefill() -> None:
    s = scheduler()
    a, b = req("a", [1] * 10), req("b", [2] * 10)
    s.add_request(a, 0.0)
    s.add_request(b, 0.0)
    batch = s.next_batch(0.0)
    assert batch is not None and batch.kind == "prefill"
    assert not s.waiting and not s.running and s.chunked is None  # neither list holds them
    assert {r.rid for r in s.live_requests()} == {"a", "b"}
    s.complete_batch(batch, batch.duration_s)
    run(s, batch.duration_s)
    assert s.live_requests() == [] and a.finished and b.finished


def test_cached_tokens_is_the_shared_prefix_and_full_repeat_keeps_one_token() -> None:
    s = scheduler()
    shared = list(range(1000, 1040))
    s.add_request(req("a", [*shared, 1, 2, 3]), 0.0)
    run(s)
    b = req("b", [*shared, 7, 8, 9])
    s.add_request(b, 1.0)
    c = req("c", [*shared, 1, 2, 3])
    s.add_request(c, 1.0)
    run(s, 1.0)
    assert b.cached_tokens == 40
    assert c.cached_tokens == 42  # SGLang matches input_ids[:-1]
    assert s.stats.cached_tokens_total == 82
    assert s.stats.prompt_tokens_total == 3 * 43


def test_prefill_batch_respects_max_running_requests() -> None:
    s = scheduler(max_running_requests=3)
    reqs = [req(f"r{i}", [i + 1] * 10, max_new=4) for i in range(7)]
    for r in reqs:
        s.add_request(r, 0.0)
    peak = 0

    def check(s: Scheduler) -> None:
        nonlocal peak
        peak = max(peak, s.num_running)
        assert s.num_running <= 3

    _, batches = run(s, check=check)
    assert peak == 3
    assert all(b.size <= 3 for b in batches)
    assert all(r.finished for r in reqs)


def test_chunked_prefill_splits_long_prompts_and_keeps_cached_tokens() -> None:
    s = scheduler(chunked_prefill_size=64)
    long = req("long", list(range(1, 201)), max_new=2)
    s.add_request(long, 0.0)
    first = s.next_batch(0.0)
    assert first is not None and [p.extend_tokens for p in first.parts] == [64]
    s.complete_batch(first, first.duration_s)
    assert long.status is Status.PREFILLING and long.fill_len == 64
    assert s.cache.protected_size() == 64  # the chunk is in the tree, locked
    _, batches = run(s, first.duration_s)
    assert [p.extend_tokens for b in batches if b.kind == "prefill" for p in b.parts] == [
        64,
        64,
        8,
    ]
    assert long.finished and long.cached_tokens == 0


def test_kv_capacity_is_never_exceeded_and_requests_wait_for_room() -> None:
    # Each request needs 50 prompt + 9 decode tokens = 59; capacity 150 fits two at once.
    s = scheduler(kv_capacity_tokens=150)
    reqs = [req(f"r{i}", [100 + i] * 50, max_new=10) for i in range(5)]
    for r in reqs:
        s.add_request(r, 0.0)
    peak = 0

    def check(s: Scheduler) -> None:
        nonlocal peak
        assert s.used_tokens <= 150
        peak = max(peak, s.num_running)

    run(s, check=check)
    assert peak == 2
    assert all(r.finished for r in reqs)
    assert s.stats.kv_overcommit_tokens == 0
    assert s.cache.evicted_tokens_total > 0  # finished requests' tokens made room


def test_request_larger_than_the_pool_is_refused() -> None:
    s = scheduler(kv_capacity_tokens=100)
    with pytest.raises(ValueError):
        s.add_request(req("big", [1] * 95, max_new=10), 0.0)


def test_decode_runs_only_when_no_prefill_is_possible() -> None:
    s = scheduler()
    s.add_request(req("a", [1] * 10, max_new=5), 0.0)
    b1 = s.next_batch(0.0)
    assert b1 is not None and b1.kind == "prefill"
    s.add_request(req("b", [2] * 10, max_new=5), 0.005)  # arrives during the prefill
    s.complete_batch(b1, b1.duration_s)
    b2 = s.next_batch(b1.duration_s)
    assert b2 is not None and b2.kind == "prefill"  # waiting work beats decoding
    s.complete_batch(b2, b1.duration_s + b2.duration_s)
    b3 = s.next_batch(b1.duration_s + b2.duration_s)
    assert b3 is not None and b3.kind == "decode" and b3.size == 2


def test_requests_not_yet_arrived_are_not_admitted() -> None:
    s = scheduler()
    s.add_request(req("later", [1] * 10), 5.0)
    assert s.next_batch(1.0) is None
    assert s.next_arrival_after(1.0) == 5.0


def test_abort_waiting_and_running_requests_release_everything() -> None:
    s = scheduler()
    running = req("run", [1] * 20, max_new=50)
    waiting = req("wait", [2] * 20, max_new=5)
    s.add_request(running, 0.0)
    batch = s.next_batch(0.0)
    assert batch is not None
    s.complete_batch(batch, batch.duration_s)
    s.add_request(waiting, batch.duration_s)
    assert s.abort("wait", 1.0)
    assert waiting.finish_reason is not None and waiting.finish_reason["type"] == "abort"
    decode = s.next_batch(1.0)
    assert decode is not None and decode.kind == "decode"
    assert s.abort("run", 1.001)  # in flight: released when the step completes
    assert not running.finished
    s.complete_batch(decode, 1.006)
    assert running.finished and running.finish_reason["type"] == "abort"  # type: ignore[index]
    assert s.cache.protected_size() == 0 and s.held_tokens_total == 0
    assert s.next_batch(2.0) is None
    assert not s.abort("run", 2.0)
    assert s.stats.num_aborted_total == 2


def test_flush_is_refused_while_busy() -> None:
    s = scheduler()
    s.add_request(req("a", [1] * 10), 0.0)
    assert not s.flush_cache()
    run(s)
    assert s.cache.total_size() > 0
    assert s.flush_cache()
    assert s.cache.total_size() == 0


def test_insert_hook_sees_kv_hints_and_the_inserted_key() -> None:
    seen: list[tuple[str, int, object]] = []
    s = scheduler(chunked_prefill_size=8)
    s.insert_hook = lambda r, cache, key: seen.append((r.rid, len(key), r.kv_hints))
    hints = {"prism": {"anchors": [{"kind": "system", "segment_id": None, "offset": 4}]}}
    s.add_request(req("h", list(range(1, 13)), max_new=3, kv_hints=hints), 0.0)
    run(s)
    # chunks of 8 and 4, then on finish the prompt + 2 outputs with KV
    assert seen == [("h", 8, hints), ("h", 12, hints), ("h", 14, hints)]


def test_lpm_orders_by_cached_prefix_and_falls_back_to_fcfs_on_long_queues() -> None:
    s = scheduler("lpm")
    s.cache.insert(list(range(100, 150)))
    cold = req("cold", [1] * 60)
    warm = req("warm", [*range(100, 150), 5])
    assert [r.rid for r in order_waiting("lpm", [cold, warm], s.cache, 0)] == ["warm", "cold"]
    many = [req(f"q{i}", [1000 + i] * 5) for i in range(129)]
    long_queue = [cold, *many, warm]
    assert order_waiting("lpm", long_queue, s.cache, 0) == long_queue


def test_lpm_deprioritizes_requests_sharing_an_uncached_prefix() -> None:
    s = scheduler("lpm")
    shared = list(range(500, 540))
    a, b, c = req("a", [*shared, 1]), req("b", [*shared, 2]), req("c", [7] * 10)
    # b shares 40 uncached tokens with a: it waits so that a warms the cache first.
    assert [r.rid for r in order_waiting("lpm", [a, b, c], s.cache, 0)] == ["a", "c", "b"]


def test_hrrn_prefers_requests_that_waited_longest_per_uncached_token() -> None:
    s = scheduler("hrrn")
    old_long = req("old_long", [1] * 400)
    old_long.arrival_processed_tokens = 0
    new_short = req("new_short", [2] * 10)
    new_short.arrival_processed_tokens = 900
    # waited tokens / uncached: 1000/400 = 2.5 vs 100/10 = 10
    order = order_waiting("hrrn", [old_long, new_short], s.cache, 1000)
    assert [r.rid for r in order] == ["new_short", "old_long"]


def test_offline_replay_is_deterministic_and_completes_everything() -> None:
    # Arrivals 0.2 s apart; each request takes 0.05 s prefill + 3 × 0.006 s decode, so
    # it is finished (and cached) before the next one arrives.
    trace = [
        TraceRequest(f"t{i}", i * 0.2, [1 + i % 3] * 30 + [100 + i] * 10, 4) for i in range(40)
    ]
    first = replay(scheduler(), trace)
    second = replay(scheduler(), trace)
    assert first == second
    assert all(r.completion_tokens == 4 for r in first)
    assert all(r.ttft_s == pytest.approx(0.01 + (40 - r.cached_tokens) / 1000) for r in first)
    # The first request of each of the 3 prefixes misses; the other 37 hit 30 tokens.
    assert [r.cached_tokens for r in first] == [0, 0, 0] + [30] * 37


def test_chunked_requests_reserve_their_whole_prompt() -> None:
    # Each request needs 200 prompt + 9 decode = 209 tokens; capacity 300 holds one at a
    # time even though a first chunk (64) alone would fit beside a running request.
    s = scheduler(kv_capacity_tokens=300, chunked_prefill_size=64)
    reqs = [req(f"c{i}", [500 + i] * 200, max_new=10) for i in range(3)]
    for r in reqs:
        s.add_request(r, 0.0)
    peak = 0

    def check(s: Scheduler) -> None:
        nonlocal peak
        assert s.used_tokens <= 300
        peak = max(peak, s.num_running)

    run(s, check=check)
    assert all(r.finished for r in reqs)
    assert peak == 1
    assert s.stats.kv_overcommit_tokens == 0


@pytest.mark.parametrize("refresh", [True, False])
def test_waiting_prefix_refresh_touches_requests_not_admitted(refresh: bool) -> None:
    p = profile(chunked_prefill_size=10)
    config = SchedulerConfig(
        kv_capacity_tokens=10_000,
        max_running_requests=8,
        chunked_prefill_size=10,
        waiting_prefix_refresh=refresh,
    )
    clock = iter(range(1, 10**9))
    s = Scheduler(config, p, RadixCache("lru", clock=lambda: float(next(clock))), FILLER)
    s.cache.insert([1] * 5)
    s.cache.insert([2] * 5)
    second_prefix = s.cache.match_prefix([2] * 5).last_node
    before = second_prefix.last_access_time
    # The first request is cut at the 10-token budget, which ends the batch, so the
    # second is not admitted (nor matched by admission) in this round.
    s.add_request(req("first", [1] * 5 + [7] * 20), 0.0)
    s.add_request(req("second", [2] * 5 + [8] * 20), 0.0)
    batch = s.next_batch(0.0)
    assert batch is not None and [p.req.rid for p in batch.parts] == ["first"]
    assert (second_prefix.last_access_time > before) is refresh
