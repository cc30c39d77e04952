"""Where blank-line blocks may be cut apart, decided from evidence across one client's
requests (prism_proxy.prompts.evidence)."""

from __future__ import annotations

import itertools
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from prism_proxy.prompts.evidence import (
    BlockEvidence,
    BlockRecord,
    block_key,
    is_cut,
    is_heading,
    seen_with,
)

A, B, C = (bytes([i]) * 16 for i in (1, 2, 3))


def units(evidence: BlockEvidence, blocks: list[str]) -> list[list[str]]:
    """The request's units, as the blocks' texts."""
    judged = evidence.judge(blocks)
    return [[blocks[i] for i in unit] for unit in judged.units()]


# --- the rule alone ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "heading", "cut"),
    [
        (None, None, False, False),  # two new blocks: nothing says they are two
        # the block before was followed by B so far, whatever the other side says: glued
        (BlockRecord(None, B, False, False), BlockRecord(C, None, True, True), False, False),
        # the block after was preceded by A so far: glued (a header it always had)
        (BlockRecord(None, C, False, True), BlockRecord(A, None, False, False), False, False),
        # both seen next to others: cut
        (BlockRecord(None, C, False, False), BlockRecord(C, None, False, False), False, True),
        # the block before varied, the one after is new: cut ...
        (BlockRecord(None, C, False, True), None, False, True),
        # ... unless the one before is a heading, which keeps its new text
        (BlockRecord(None, C, False, True), None, True, False),
        # the block before is new, the one after was preceded by another: cut
        (None, BlockRecord(C, None, False, False), False, True),
        (None, BlockRecord(C, None, False, False), True, True),
    ],
)
def test_is_cut(before, after, heading, cut) -> None:
    assert is_cut(before, A, after, B, heading) is cut


@pytest.mark.parametrize(
    ("block", "heading"),
    [
        ("file_path: data/bridges.txt", True),
        ("The Pont Neuf", True),
        ("title: Bridges\nauthor: someone", True),
        ("Context:", False),
        ("The Pont Neuf is the oldest standing bridge.", False),
        ("x" * 300, False),
        ("a\nb\nc\nd", False),
        ("", False),
    ],
)
def test_is_heading(block: str, heading: bool) -> None:
    assert is_heading(block) is heading


def test_seen_with() -> None:
    first = seen_with(None, A, C)
    assert first == BlockRecord(A, C, False, False)
    assert seen_with(first, A, C) == first
    assert seen_with(first, None, C) == BlockRecord(A, C, True, False)  # first neighbours kept
    varied = seen_with(seen_with(first, B, C), A, B)
    assert varied == BlockRecord(A, C, True, True)
    assert seen_with(varied, A, C) == varied  # variation is never forgotten


# --- across requests -------------------------------------------------------------------


def test_a_first_request_is_one_unit() -> None:
    assert units(BlockEvidence(1 << 20), ["A", "B", "C"]) == [["A", "B", "C"]]


@pytest.mark.parametrize("second", list(itertools.permutations("ABCD"))[1:])
def test_a_second_order_is_made_of_runs_of_the_first(second: tuple[str, ...]) -> None:
    """Whatever the second order, its units are runs of the first arrangement, so the
    policy can serve them as the first request was served."""
    evidence = BlockEvidence(1 << 20)
    evidence.judge(list("ABCD"))
    found = units(evidence, list(second))
    assert sorted(x for unit in found for x in unit) == list("ABCD")
    first = "ABCD"
    for unit in found:
        assert "".join(unit) in first  # a run of the first arrangement
    assert len(found) > 1  # another order is never one unit


def test_a_new_document_between_known_ones_is_a_unit_of_its_own() -> None:
    i, a, b, c, d = (f"Text of {name}, a sentence." for name in "IABCD")
    evidence = BlockEvidence(1 << 20)
    evidence.judge([i, a, b, c])
    evidence.judge([i, c, a, b])
    assert units(evidence, [i, b, d, a, c]) == [[i], [b], [d], [a], [c]]
    # a heading before it (a title seen with other text) keeps it
    evidence.judge(["A title", a])
    e = "Text of E, a sentence."
    assert units(evidence, [b, "A title", e]) == [[b], ["A title", e]]


def test_paragraphs_that_always_travel_together_are_never_cut() -> None:
    evidence = BlockEvidence(1 << 20)
    rng = random.Random(7)
    others = [f"other document {i}" for i in range(6)]
    for _ in range(50):
        blocks = rng.sample(others, 3)
        at = rng.randrange(len(blocks) + 1)
        blocks[at:at] = ["paragraph one of D", "paragraph two of D"]
        found = units(evidence, blocks)
        assert any(
            unit[-2:] == ["paragraph one of D", "paragraph two of D"] for unit in found
        ) or any(unit[:2] == ["paragraph one of D", "paragraph two of D"] for unit in found), found
    # the other documents, seen in many orders, end up units of their own
    last = units(evidence, ["other document 0", "other document 1", "other document 2"])
    assert last == [["other document 0"], ["other document 1"], ["other document 2"]]


def test_a_known_heading_keeps_its_new_text() -> None:
    """A metadata line seen with other text before stays with the new text after it."""
    evidence = BlockEvidence(1 << 20)
    evidence.judge(["file_path: a.txt", "chunk one of a", "file_path: b.txt", "chunk of b"])
    found = units(evidence, ["file_path: b.txt", "chunk of b", "file_path: a.txt", "chunk two"])
    assert ["file_path: a.txt", "chunk two"] in found
    assert ["file_path: b.txt", "chunk of b"] in found


def test_opens_and_closes() -> None:
    """A block that only ever opened the list (an instruction) opens it; one that only
    ever closed it closes it; a new block does neither."""
    evidence = BlockEvidence(1 << 20)
    first = evidence.judge(["Given the following.", "D1", "D2", "Answer briefly"])
    assert first.known == first.opens == first.closes == (False,) * 4
    second = evidence.judge(["Given the following.", "D2", "D1", "D9", "Answer briefly"])
    assert second.known == (True, True, True, False, True)
    assert second.opens == (True, False, False, False, False)
    assert second.closes == (False, False, False, False, True)


def test_one_clients_orders_never_cut_anothers_documents() -> None:
    evidence = BlockEvidence(1 << 20)
    alice, mallory = evidence.scoped("10.0.0.1"), evidence.scoped("10.0.0.2")
    document = ["paragraph one", "paragraph two", "paragraph three"]
    alice.judge(["intro", *document])
    for order in itertools.permutations(document):  # every order, from another client
        mallory.judge(list(order))
    judged = alice.judge(["other", *document])
    assert judged.glued[2:] == (True, True)  # alice's document is still one unit


def test_a_separator_is_not_part_of_a_blocks_identity() -> None:
    assert block_key("node three\n") == block_key("node three\n\n") == block_key("node three")
    assert block_key("\ud800 lone surrogate") != block_key("")
    assert block_key("x", b"one client") != block_key("x", b"another")


def test_the_capacity_in_bytes_is_respected() -> None:
    capacity = 20_000
    evidence = BlockEvidence(capacity)
    for i in range(2_000):
        evidence.judge([f"block {i}", f"block {i + 1}", f"block {i + 2}"])
    stats = evidence.stats()
    assert 0 < stats["bytes"] <= capacity
    assert stats["entries"] < 2_000  # the oldest were forgotten
    assert stats["requests"] == 2_000 and stats["blocks"] == 6_000
    # a forgotten block starts over: nothing known, one unit
    assert evidence.judge(["block 0", "block 5"]).glued == (False, True)


def test_concurrent_observers_lose_no_request() -> None:
    evidence = BlockEvidence(1 << 22)
    docs = [f"document {i}" for i in range(8)]

    def run(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            evidence.judge(rng.sample(docs, 4))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(run, range(8)))
    stats = evidence.stats()
    assert stats["requests"] == 8 * 300 and stats["blocks"] == 8 * 300 * 4
    assert stats["entries"] == len(docs)
    assert evidence.judge(docs[:3] + docs[5:6]).glued == (False,) * 4  # shuffled: all cut
