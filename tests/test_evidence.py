"""Blank-line blocks that are documents on their own, decided from evidence across
requests (prism_proxy.prompts.evidence)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from prism_proxy.prompts.evidence import BlockEvidence, BlockRecord, block_key, is_unit, seen_with

A, B, C = (bytes([i]) * 16 for i in (1, 2, 3))


# --- the rule alone ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "before", "after", "unit"),
    [
        (None, None, None, False),  # never seen
        (BlockRecord(A, C, False, False), None, None, False),  # seen, never moved
        (BlockRecord(A, C, True, False), None, None, False),  # only its predecessor varied
        (BlockRecord(A, C, False, True), None, None, False),  # only its successor varied
        (BlockRecord(A, C, True, True), None, None, True),  # both sides varied
        # a neighbour that has always been followed by B glues itself to B
        (BlockRecord(A, C, True, True), BlockRecord(None, B, False, False), None, False),
        # ... unless it has since been followed by another block
        (BlockRecord(A, C, True, True), BlockRecord(None, B, False, True), None, True),
        # a neighbour always preceded by B, after it
        (BlockRecord(A, C, True, True), None, BlockRecord(B, None, False, False), False),
        # a neighbour whose first successor was another block says nothing about B
        (BlockRecord(A, C, True, True), BlockRecord(None, C, False, False), None, True),
    ],
)
def test_is_unit(record, before, after, unit) -> None:
    assert is_unit(record, B, before, after) is unit


def test_seen_with() -> None:
    first = seen_with(None, A, C)
    assert first == BlockRecord(A, C, False, False)
    assert seen_with(first, A, C) == first
    assert seen_with(first, None, C) == BlockRecord(A, C, True, False)  # first neighbours kept
    varied = seen_with(seen_with(first, B, C), A, B)
    assert varied == BlockRecord(A, C, True, True)
    assert seen_with(varied, A, C) == varied  # variation is never forgotten


# --- across requests -------------------------------------------------------------------


def test_documents_in_varying_orders_become_units() -> None:
    evidence = BlockEvidence(1 << 20)
    assert evidence.observe(["A", "B", "C"]) == (False, False, False)  # nothing seen before
    assert evidence.observe(["C", "A", "B"]) == (False, False, False)  # seen once each
    # Now A: predecessors None, C; successors B, B -> its successor never varied.
    # B: predecessors A, A -> never varied. C: predecessors B, None; successors None, A.
    assert evidence.observe(["B", "C", "A"]) == (False, True, False)
    # A: successors B, B, None; predecessors None, C, C. B: predecessors A, A, None.
    assert evidence.observe(["A", "C", "B"]) == (True, True, True)


def test_two_documents_swapping_become_units() -> None:
    evidence = BlockEvidence(1 << 20)
    evidence.observe(["doc one", "doc two"])
    evidence.observe(["doc two", "doc one"])
    assert evidence.observe(["doc one", "doc two"]) == (True, True)


def test_counting_this_request_makes_a_swap_units_at_once() -> None:
    evidence = BlockEvidence(1 << 20)
    assert evidence.observe(["doc one", "doc two"], count_this_request=True) == (False, False)
    assert evidence.observe(["doc two", "doc one"], count_this_request=True) == (True, True)
    # two paragraphs seen twice in one order, in different places, still are not
    evidence.observe(["p1", "p2", "x"], count_this_request=True)
    assert evidence.observe(["y", "p1", "p2"], count_this_request=True) == (False,) * 3


def test_a_neighbour_seen_for_the_first_time_glues_nothing() -> None:
    evidence = BlockEvidence(1 << 20)
    for order in (["H", "a"], ["b", "H"], ["H", "c"]):  # H moves on both sides
        evidence.observe(order)
    assert evidence.observe(["new", "H", "newer"]) == (False, True, False)
    # counting this request: the new neighbours' only sighting is next to H, still no glue
    assert evidence.observe(["x", "H", "y"], count_this_request=True) == (False, True, False)


def test_paragraphs_that_always_travel_together_never_become_units() -> None:
    evidence = BlockEvidence(1 << 20)
    rng = random.Random(7)
    others = [f"other document {i}" for i in range(6)]
    seen = []
    for _ in range(50):
        blocks = rng.sample(others, 3)
        at = rng.randrange(len(blocks) + 1)
        blocks[at:at] = ["paragraph one of D", "paragraph two of D"]
        units = evidence.observe(blocks)
        seen.append(dict(zip(blocks, units, strict=True)))
    assert not any(units["paragraph one of D"] or units["paragraph two of D"] for units in seen)
    assert all(units[o] for units in seen[-10:] for o in others if o in units)


def test_a_shared_footer_stays_with_the_document_it_always_follows() -> None:
    # Documents A and B both end with the same footer paragraph F; C has none.
    evidence = BlockEvidence(1 << 20)
    with_footer = {"A": ["A", "F"], "B": ["B", "F"], "C": ["C"]}
    orders = ["ABC", "CBA", "BCA", "ACB", "BAC", "CAB", "ABC", "CBA"]
    for order in orders:
        blocks = [block for doc in order for block in with_footer[doc]]
        units = dict(zip(blocks, evidence.observe(blocks), strict=False))
    # F has moved on both sides, but A and B have only ever been followed by it, and
    # A and B themselves never before another block: none of them is a unit.
    assert not units["F"] and not units["A"] and not units["B"]
    assert units["C"]


def test_a_block_seen_once_is_not_a_unit() -> None:
    evidence = BlockEvidence(1 << 20)
    assert evidence.observe(["lonely"]) == (False,)
    assert evidence.observe(["x", "lonely", "y"]) == (False, False, False)


def test_a_separator_is_not_part_of_a_blocks_identity() -> None:
    assert block_key("node three\n") == block_key("node three\n\n") == block_key("node three")
    assert block_key("\ud800 lone surrogate") != block_key("")


def test_the_capacity_in_bytes_is_respected() -> None:
    capacity = 20_000
    evidence = BlockEvidence(capacity)
    for i in range(2_000):
        evidence.observe([f"block {i}", f"block {i + 1}", f"block {i + 2}"])
    stats = evidence.stats()
    assert 0 < stats["bytes"] <= capacity
    assert stats["entries"] < 2_000  # the oldest were forgotten
    assert stats["requests"] == 2_000 and stats["blocks"] == 6_000
    # a forgotten block starts over: seen once, not a unit
    assert evidence.observe(["block 0", "block 5"]) == (False, False)


def test_concurrent_observers_lose_no_request() -> None:
    evidence = BlockEvidence(1 << 22)
    docs = [f"document {i}" for i in range(8)]

    def run(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            evidence.observe(rng.sample(docs, 4))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(run, range(8)))
    stats = evidence.stats()
    assert stats["requests"] == 8 * 300 and stats["blocks"] == 8 * 300 * 4
    assert stats["entries"] == len(docs)
    assert all(evidence.observe(docs[:3] + docs[5:6])[1:3])  # shuffled documents are units


def test_judge_tells_known_blocks_from_new_ones() -> None:
    """A block an earlier request showed, that never moved, is known (it may stay in
    front: an instruction); a new block is not."""
    evidence = BlockEvidence(1 << 20)
    first = evidence.judge(["Given the following.", "Context:", "D1", "D2"])
    assert first.known == (False, False, False, False)
    second = evidence.judge(["Given the following.", "Context:", "D2", "D1", "D9"])
    assert second.known == (True, True, True, True, False)
    assert second.units[:2] == (False, False)
