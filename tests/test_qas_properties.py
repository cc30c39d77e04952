"""Invariants of every policy's waves, checked on generated rounds (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from prism_proxy.qas.counters import head_key
from prism_proxy.qas.params import QasParams
from prism_proxy.qas.policies import POLICIES, make_policy
from prism_proxy.qas.types import ActiveRequest, Lane, QueuedRequest

SEGMENTS = [f"d{i}" for i in range(12)]


@st.composite
def rounds(draw: st.DrawFn) -> tuple[list[QueuedRequest], list[ActiveRequest], int]:
    size = draw(st.integers(0, 25))
    arrivals = draw(st.lists(st.integers(0, 8), min_size=size, max_size=size))
    queue = [
        QueuedRequest(
            rid=f"q{i}",
            arrival=float(arrival),
            segments=tuple(draw(st.lists(st.sampled_from(SEGMENTS), max_size=5, unique=True))),
            reorder=draw(st.booleans()),
            prefix_key=draw(st.sampled_from(["sys-a", "sys-b"])),
            head_tokens=draw(st.integers(0, 50)),
        )
        for i, arrival in enumerate(arrivals)
    ]
    active = [
        ActiveRequest(f"a{i}", tuple(draw(st.lists(st.sampled_from(SEGMENTS), max_size=5))))
        for i in range(draw(st.integers(0, 4)))
    ]
    return queue, active, draw(st.integers(0, 12))


params_strategy = st.builds(
    QasParams,
    f_front=st.integers(0, 4),
    kappa=st.integers(0, 3),
    q_cold=st.integers(0, 4),
    k=st.integers(1, 4),
)


def fifo_rids(queue: list[QueuedRequest]) -> list[str]:
    return [r.rid for r in sorted(queue, key=lambda r: r.arrival)]


@settings(max_examples=150, deadline=None)
@given(rounds(), params_strategy, st.sampled_from(sorted(POLICIES)))
def test_wave_is_a_bounded_set_of_queued_requests(round_, params, name) -> None:
    queue, active, wave_size = round_
    plan = make_policy(name, params).plan_round(queue, active, wave_size)
    rids = [e.rid for e in plan.wave]
    assert len(rids) == len(set(rids))
    assert set(rids) <= {r.rid for r in queue}
    assert len(rids) == min(wave_size, len(queue))
    for request in queue:
        skeleton = plan.skeletons[request.rid]
        assert sorted(skeleton) == sorted(request.segments)
        if not request.reorder:
            assert skeleton == request.segments


@settings(max_examples=150, deadline=None)
@given(rounds(), params_strategy)
def test_cold_lane_holds_the_oldest_unchosen(round_, params) -> None:
    queue, active, wave_size = round_
    plan = make_policy("prism", params).plan_round(queue, active, wave_size)
    hot = {e.rid for e in plan.wave if e.lane is Lane.HOT}
    cold = [e.rid for e in plan.wave if e.lane is Lane.COLD]
    unchosen_in_order = [rid for rid in fifo_rids(queue) if rid not in hot]
    assert cold == unchosen_in_order[: len(cold)]
    assert len(hot) <= max(0, wave_size - params.q_cold)
    # release order: every hot request before every cold one
    lanes = [e.lane for e in plan.wave]
    assert lanes == sorted(lanes, key=lambda lane: lane is Lane.COLD)


@settings(max_examples=100, deadline=None)
@given(rounds())
def test_fifo_is_arrival_order(round_) -> None:
    queue, active, wave_size = round_
    plan = make_policy("fifo").plan_round(queue, active, wave_size)
    assert [e.rid for e in plan.wave] == fifo_rids(queue)[:wave_size]


@settings(max_examples=100, deadline=None)
@given(st.lists(rounds(), min_size=1, max_size=4))
def test_klpm_with_k1_equals_fifo(rounds_) -> None:
    klpm, fifo = make_policy("klpm", QasParams(k=1)), make_policy("fifo")
    for queue, active, wave_size in rounds_:
        assert [e.rid for e in klpm.plan_round(queue, active, wave_size).wave] == [
            e.rid for e in fifo.plan_round(queue, active, wave_size).wave
        ]


@settings(max_examples=100, deadline=None)
@given(st.lists(rounds(), min_size=1, max_size=3), st.sampled_from(sorted(POLICIES)))
def test_policies_are_deterministic(rounds_, name) -> None:
    first, second = make_policy(name), make_policy(name)
    for queue, active, wave_size in rounds_:
        assert first.plan_round(queue, active, wave_size) == second.plan_round(
            queue, active, wave_size
        )


@settings(max_examples=60, deadline=None)
@given(rounds(), st.integers(1, 4), st.integers(1, 6), st.data())
def test_oldest_request_is_dispatched_within_bounded_rounds(round_, q_cold, wave_size, data):
    """With q_cold ≥ 1 the oldest request leaves in the first round with a free slot.

    New requests keep arriving (always younger) and hot buckets keep forming, yet the
    cold lane takes the oldest unchosen request every round, so it cannot starve.
    """
    queue, active, _ = round_
    if not queue:
        return
    policy = make_policy("prism", QasParams(q_cold=q_cold))
    oldest = fifo_rids(queue)[0]
    pending = list(queue)
    latest = max(r.arrival for r in queue)
    for round_index in range(3):
        plan = policy.plan_round(pending, active, wave_size)
        released = {e.rid for e in plan.wave}
        if oldest in released:
            assert round_index == 0
            return
        pending = [r for r in pending if r.rid not in released]
        hot_segments = tuple(
            data.draw(st.lists(st.sampled_from(SEGMENTS), max_size=3, unique=True))
        )
        pending.append(QueuedRequest(f"new{round_index}", latest + 1 + round_index, hot_segments))
    raise AssertionError(f"{oldest} not dispatched within 3 rounds")


def reference_klpm(view, queue: list[QueuedRequest], wave_size: int, k: int) -> list[str]:
    """k-LPM written the obvious way: rescan every match before every pick."""
    remaining = sorted(queue, key=lambda r: r.arrival)
    wave: list[str] = []
    while remaining and len(wave) < wave_size:
        picked = remaining.pop(0)
        view.insert(picked, picked.segments)
        wave.append(picked.rid)
        for _ in range(k - 1):
            if not remaining or len(wave) >= wave_size:
                break
            best = max(
                range(len(remaining)),
                key=lambda i: (view.match_tokens(remaining[i], remaining[i].segments), -i),
            )
            picked = remaining.pop(best)
            view.insert(picked, picked.segments)
            wave.append(picked.rid)
    return wave


@settings(max_examples=100, deadline=None)
@given(st.lists(rounds(), min_size=1, max_size=4), st.integers(1, 4), st.integers(20, 2000))
def test_klpm_incremental_matches_equal_a_full_rescan(rounds_, k, capacity) -> None:
    from prism_proxy.qas.residency import CacheView

    policy = make_policy("klpm", QasParams(k=k, cache_view_tokens=capacity))
    reference_view = CacheView(capacity)
    for queue, active, wave_size in rounds_:
        expected = reference_klpm(reference_view, queue, wave_size, k)
        assert [e.rid for e in policy.plan_round(queue, active, wave_size).wave] == expected


def _without_heads(request: QueuedRequest) -> QueuedRequest:
    return replace(request, prefix_key="", head_tokens=0)


@settings(max_examples=100, deadline=None)
@given(rounds(), st.lists(st.sampled_from(["sys-a", "sys-b", None]), max_size=4), st.booleans())
def test_system_heads_only_add_their_own_table_entries(round_, active_heads, canonical) -> None:
    """Heads are counted like segments for DART's table and nowhere else. A
    prism round (residency off, so `prefix_key` is not otherwise read) plans exactly the
    same with or without them; every policy's table gains one entry per head,
    w_a·a_t(h) + w_n·n_t(h; B) + w_g·g_t(h) under `head_key(h)`."""
    queue, active, wave_size = round_
    active = [
        ActiveRequest(a.rid, a.segments, head)
        for a, head in zip(active, active_heads + [None] * len(active), strict=False)
    ]
    params = QasParams(canonical_ties=canonical)
    plan = make_policy("prism", params).plan_round(queue, active, wave_size)
    bare = make_policy("prism", params).plan_round(
        [_without_heads(q) for q in queue],
        [ActiveRequest(a.rid, a.segments) for a in active],
        wave_size,
    )
    table = plan.dispatch_priorities
    heads = {k for k in table if k.startswith("\x00")}
    assert replace(plan, dispatch_priorities={}) == replace(bare, dispatch_priorities={})
    assert {k: v for k, v in table.items() if k not in heads} == bare.dispatch_priorities
    by_rid = {q.rid: q for q in queue}
    for name in sorted(POLICIES):
        plan = make_policy(name, params).plan_round(queue, active, wave_size)
        wave_heads = [by_rid[e.rid].head for e in plan.wave]
        expected = {
            head_key(head): params.w_a * sum(a.head == head for a in active)
            + params.w_n * wave_heads.count(head)
            + params.w_g * sum(q.head == head for q in queue)
            for head in {q.head for q in queue} | {a.head for a in active}
            if head is not None
        }
        table = plan.dispatch_priorities
        assert {k: v for k, v in table.items() if k.startswith("\x00")} == expected
