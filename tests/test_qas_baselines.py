"""Baseline policies and the proxy's approximate cache view (SPEC §5)."""

from __future__ import annotations

import tracemalloc

import pytest

from prism_proxy.qas.params import QasParams
from prism_proxy.qas.policies import make_policy
from prism_proxy.qas.residency import CacheView
from prism_proxy.qas.types import Lane, QueuedRequest


def q(rid: str, arrival: float, *segments: str, head: str = "sys") -> QueuedRequest:
    return QueuedRequest(
        rid,
        arrival,
        tuple(segments),
        prefix_key=head,
        head_tokens=10,
        segment_tokens=tuple(100 for _ in segments),
    )


def test_cache_view_matches_whole_pieces_weighted_by_tokens() -> None:
    view = CacheView(capacity_tokens=10_000)
    view.insert(q("a", 0, "d1", "d2"), ("d1", "d2"))
    # head 10 + d1 100 + d2 100
    assert view.match_tokens(q("b", 0, "d1", "d2", "d3"), ("d1", "d2", "d3")) == 210
    assert view.match_tokens(q("b", 0, "d1", "d3"), ("d1", "d3")) == 110
    # the order matters: (d2, d1) shares only the head
    assert view.match_tokens(q("b", 0, "d2", "d1"), ("d2", "d1")) == 10
    # another system prompt shares nothing
    assert view.match_tokens(q("b", 0, "d1", head="other"), ("d1",)) == 0


def test_cache_view_prunes_least_recently_used_leaves() -> None:
    view = CacheView(capacity_tokens=320)
    view.insert(q("a", 0, "d1", "d2"), ("d1", "d2"))  # 210 tokens
    view.insert(q("b", 0, "d1", "d3"), ("d1", "d3"))  # +100 = 310
    view.insert(q("c", 0, "d1", "d4"), ("d1", "d4"))  # +100 = 410 > 320: drop d2 (oldest leaf)
    assert view.total_tokens == 310
    assert view.match_tokens(q("x", 0, "d1", "d2"), ("d1", "d2")) == 110
    assert view.match_tokens(q("x", 0, "d1", "d3"), ("d1", "d3")) == 210
    # touching d3 again makes d4 the oldest leaf
    view.insert(q("d", 0, "d1", "d3"), ("d1", "d3"))
    view.insert(q("e", 0, "d1", "d5"), ("d1", "d5"))
    assert view.match_tokens(q("x", 0, "d1", "d4"), ("d1", "d4")) == 110
    assert view.match_tokens(q("x", 0, "d1", "d3"), ("d1", "d3")) == 210


def test_cache_view_is_bounded_in_bytes_by_what_it_really_holds() -> None:
    """Many one-token segments with long ids: the token budget would hold 400,000 nodes;
    the byte budget stops the view at its capacity, and the bytes it counts are what
    tracemalloc sees it keep (within 25 %)."""
    capacity = 1024 * 1024
    view = CacheView(capacity_tokens=400_000, capacity_bytes=capacity)
    ids = [f"{n:06d}-" + "x" * 120 for n in range(12_000)]
    requests = [
        QueuedRequest(f"r{n}", 0, tuple(ids[n * 4 : n * 4 + 4]), prefix_key="h", head_tokens=1)
        for n in range(3_000)
    ]
    view.insert(requests[0], requests[0].segments)
    tracemalloc.start()
    try:
        before, counted = tracemalloc.get_traced_memory()[0], view.total_bytes
        for request in requests[1:]:
            view.insert(request, request.segments)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert view.total_bytes <= capacity < 3_000 * 4 * 120  # pruned by bytes, not tokens
    assert view.total_tokens < 400_000
    assert abs(held - (view.total_bytes - counted)) <= 0.25 * view.total_bytes, held


def test_cache_view_forgets_stale_entries_of_paths_inserted_again() -> None:
    """A hot path dispatched over and over, far below capacity: the view's memory stays
    that of its nodes (its LRU heap once grew by an entry per insert)."""
    view = CacheView(capacity_tokens=10_000)
    hot = [q(f"r{n}", 0, "d1", f"d{2 + n % 3}") for n in range(30)]
    for n in range(20_000):
        view.insert(hot[n % 30], hot[n % 30].segments)
    assert view.nodes == 5  # head, d1, d2, d3, d4
    assert len(view._lru) <= 2 * view.nodes + 64
    assert view.match_tokens(q("x", 0, "d1", "d3"), ("d1", "d3")) == 210


def test_klpm_pairs_the_oldest_with_its_longest_match() -> None:
    policy = make_policy("klpm", QasParams(k=2))
    queue = [
        q("old", 0.0, "d1", "d2"),
        q("other", 1.0, "d9", "d8"),
        q("near", 2.0, "d1", "d2", "d3"),  # matches head + d1 + d2 of "old"
        q("half", 3.0, "d1", "d7"),
    ]
    plan = policy.plan_round(queue, [], wave_size=4)
    # oldest "old", then the longest match "near" (210 tokens); then the oldest left,
    # "other", and the only request still queued, "half"
    assert [(e.rid, e.lane) for e in plan.wave] == [
        ("old", Lane.COLD),
        ("near", Lane.HOT),
        ("other", Lane.COLD),
        ("half", Lane.HOT),
    ]
    # no reordering in k-LPM
    assert plan.skeletons["near"] == ("d1", "d2", "d3")


def test_klpm_remembers_earlier_waves() -> None:
    policy = make_policy("klpm", QasParams(k=2))
    policy.plan_round([q("first", 0.0, "d5", "d6")], [], wave_size=1)
    queue = [q("a", 1.0, "d1"), q("b", 2.0, "d2"), q("c", 3.0, "d5", "d6", "d7")]
    plan = policy.plan_round(queue, [], wave_size=2)
    assert [e.rid for e in plan.wave] == ["a", "c"]


def test_contextpilot_style_puts_cached_segments_first_and_groups() -> None:
    policy = make_policy("contextpilot-style")
    policy.plan_round([q("warm", 0.0, "d1", "d2")], [], wave_size=1)
    queue = [
        q("x", 1.0, "d3", "d2", "d1"),  # cached path d1 → d2 first, then d3
        q("y", 2.0, "d4", "d1"),  # d1 cached, d4 after
        q("z", 3.0, "d5"),
    ]
    plan = policy.plan_round(queue, [], wave_size=2)
    assert plan.skeletons["x"] == ("d1", "d2", "d3")
    assert plan.skeletons["y"] == ("d1", "d4")
    assert plan.skeletons["z"] == ("d5",)
    # group (d1) has two requests, (d5) one: the larger group goes first
    assert [e.rid for e in plan.wave] == ["x", "y"]
    assert plan.buckets[0].rids == ("x", "y")


def test_contextpilot_style_keeps_order_sensitive_requests() -> None:
    policy = make_policy("contextpilot-style")
    policy.plan_round([q("warm", 0.0, "d1")], [], wave_size=1)
    fixed = QueuedRequest("f", 1.0, ("d2", "d1"), reorder=False, prefix_key="sys")
    plan = policy.plan_round([fixed], [], wave_size=1)
    assert plan.skeletons["f"] == ("d2", "d1")


def test_unknown_policy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"'lifo'.*prism"):
        make_policy("lifo")
