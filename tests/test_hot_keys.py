"""Bounded load for hot routing keys: smg's ring, the bound, key stability."""

from __future__ import annotations

import math
from collections import Counter, deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.clients.hot_keys import BoundedKeys, spread_keys
from loadgen.clients.routing import ROUTING_KEY_HEADER
from loadgen.clients.smg_ring import SmgRing, ring_position

RING = SmgRing([f"http://10.0.0.{i}:30000" for i in range(1, 4)])
ANCHORS = st.lists(st.sampled_from([f"p{i:05d}" for i in range(12)]), max_size=300)


def test_ring_positions_are_blake3_prefixes_little_endian() -> None:
    # the value smg's HashRing computes for this key (blake3 digest, first 8 bytes LE)
    assert ring_position("p00433") == int.from_bytes(bytes.fromhex("ed6c8a16031edfe0"), "little")


def test_the_ring_places_every_key_on_one_of_its_workers() -> None:
    keys = [f"key-{i}" for i in range(3000)]
    counts = Counter(RING.place(k) for k in keys)
    assert set(counts) == set(RING.urls) and len(RING.urls) == 3
    assert min(counts.values()) > 600  # 150 points per worker: no worker starves
    assert [RING.place(k) for k in keys[:50]] == [RING.place(k) for k in keys[:50]]


def test_a_hot_key_has_one_sub_key_per_replica() -> None:
    keys = spread_keys("p00433", RING.place, 3)
    assert keys[0] == "p00433" and all(k.startswith("p00433#") for k in keys[1:])
    assert len({RING.place(k) for k in keys}) == len(keys) == 3


def replay_counts(anchors: list[str], keys: list[str], window: int) -> list[tuple[int, int]]:
    """For each request: (its anchor's count, its replica's count) among the `window` - 1
    requests before it, recomputed independently of BoundedKeys."""
    recent: deque[tuple[str, str]] = deque(maxlen=window - 1)
    out = []
    for anchor, key in zip(anchors, keys, strict=True):
        replica = RING.place(key)
        out.append((sum(a == anchor for a, _ in recent), sum(r == replica for _, r in recent)))
        recent.append((anchor, replica))
    return out


@settings(max_examples=60, deadline=None)
@given(anchors=ANCHORS, max_share=st.floats(1 / 3, 1.0), window=st.integers(4, 64))
def test_cold_keys_never_move_and_hot_keys_only_go_under_the_cap(
    anchors: list[str], max_share: float, window: int
) -> None:
    policy = BoundedKeys(RING.place, 3, max_share, window=window)
    keys = [policy.key_for(a) for a in anchors]
    cap = math.ceil(max_share * window)
    for anchor, key, (anchor_count, replica_count) in zip(
        anchors, keys, replay_counts(anchors, keys, window), strict=True
    ):
        if anchor_count + 1 <= policy.hot_share * window:  # cold: the key is the anchor
            assert key == anchor
        else:  # hot: one of its sub-keys, on a replica it keeps within the cap
            assert key in spread_keys(anchor, RING.place, 3)
            assert replica_count + 1 <= cap


@settings(max_examples=60, deadline=None)
@given(anchors=ANCHORS, max_share=st.floats(1 / 3, 1.0), window=st.integers(4, 64))
def test_a_replica_passes_the_cap_only_by_cold_requests_after_its_last_hot_one(
    anchors: list[str], max_share: float, window: int
) -> None:
    policy = BoundedKeys(RING.place, 3, max_share, window=window)
    sent = []  # (replica, hot)
    for anchor in anchors:
        hot = policy.is_hot(anchor)
        sent.append((RING.place(policy.key_for(anchor)), hot))
    for end in range(1, len(sent) + 1):
        span = sent[max(0, end - window) : end]
        for replica in RING.urls:
            mine = [hot for r, hot in span if r == replica]
            last_hot = max((i for i, hot in enumerate(mine) if hot), default=-1)
            assert len(mine) <= policy.cap + len(mine) - 1 - last_hot


@settings(max_examples=60, deadline=None)
@given(anchors=ANCHORS, max_share=st.floats(1 / 3, 1.0), window=st.integers(4, 64))
def test_with_every_key_movable_no_replica_passes_the_cap(
    anchors: list[str], max_share: float, window: int
) -> None:
    policy = BoundedKeys(RING.place, 3, max_share, hot_share=0.0, window=window)
    replicas = [RING.place(policy.key_for(a)) for a in anchors]
    cap = math.ceil(max_share * window)
    for end in range(1, len(replicas) + 1):
        busiest = Counter(replicas[max(0, end - window) : end]).most_common(1)[0][1]
        assert busiest <= cap
    assert BoundedKeys(RING.place, 3, max_share, 0.0, window).replica_counts() == {}


def test_one_hot_key_spills_to_a_second_replica_then_a_third() -> None:
    window = 100
    half = BoundedKeys(RING.place, 3, 0.5, window=window)
    keys = [half.key_for("hot") for _ in range(1000)]
    order = spread_keys("hot", RING.place, 3)
    assert keys[:50] == ["hot"] * 50  # under the cap: its own key
    assert set(keys[-window:]) == set(order[:2])  # 1/2 per replica: two replicas
    assert max(half.replica_counts().values()) == 50  # of the last 99
    third = BoundedKeys(RING.place, 3, 0.4, window=window)
    keys = [third.key_for("hot") for _ in range(1000)]
    assert set(keys[-window:]) == set(order)  # 0.4 per replica: all three
    assert max(third.replica_counts().values()) <= 40


def test_headers_carry_the_bounded_key_and_nothing_without_segments() -> None:
    policy = BoundedKeys(RING.place, 3, 0.5, window=10)
    assert policy.headers([]) == {}
    sent = [policy.headers(["doc-2", "doc-1"], {"doc-1": 1.0})[ROUTING_KEY_HEADER]]
    sent += [policy.headers(["doc-1"])[ROUTING_KEY_HEADER] for _ in range(20)]
    assert sent[0] == "doc-1" and len(set(sent)) == 2
    with pytest.raises(ValueError):
        BoundedKeys(RING.place, 3, 0.3)  # three replicas cannot all stay under 0.3
