"""Which blank-line blocks are documents on their own, from evidence across requests
(SPEC §1: documents "are reorderable only where their boundaries are certain, from the
layout itself or from evidence across requests").

Blank lines separate documents (LangChain's stuff-documents join) but also the
paragraphs of one document, so a block may move only once requests have shown it to be
a unit. `BlockEvidence` remembers, for each block, the neighbours it was first seen
between, and whether it has since been seen after a different predecessor or before a
different successor (None, the list's end, counts as a neighbour). The rule, `is_unit`,
asks for both sides, and for neither current neighbour to be glued to it:

    requests  [X P1 P2 Y]  [P1 P2 Z]  [W P1 P2]     (P1 P2: one two-paragraph document)
    P1: predecessor varied (X, None, W), successor always P2  -> not a unit
    P2: predecessor always P1,           successor varied     -> not a unit
    X, Y, Z, W once each                                      -> not units (no evidence)

    requests  [A B C]  [C A B]  [B C A]                        (three documents shuffled)
    A, B, C: both sides varied, no neighbour always next to them -> units from the
    fourth request on

Asking for either side alone would make P1 and P2 units as soon as their document
moved, and let reordering split it. The glue check keeps a paragraph that follows
several documents (a shared footer) with the one it follows now when that one has only
ever been followed by it.

Evidence counts the requests seen before the one being observed (on request, this one
too for a block's own variation). A block's identity is its text without its trailing
separator, so the same block before "\n\n" or before a closing rule's "\n" is one
block. Records live in a `ByteLRU` (bounded in bytes, least recently used evicted
first); a forgotten block starts over.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections.abc import Sequence
from typing import NamedTuple

from prism_tokens.byte_lru import ByteLRU

KEY_BYTES = 16


class BlockRecord(NamedTuple):
    """What the requests seen so far say about one block."""

    predecessor: bytes | None  # key of the block first seen before it (None: first)
    successor: bytes | None  # key of the block first seen after it (None: last)
    predecessor_varied: bool  # since seen after another predecessor
    successor_varied: bool  # since seen before another successor


class Judgement(NamedTuple):
    """What the evidence says of one request's blocks, in prompt order."""

    units: tuple[bool, ...]  # documents of their own: they may move
    known: tuple[bool, ...]  # seen in an earlier request


def block_key(block: str) -> bytes:
    """A block's identity: 16-byte BLAKE2b of its text without trailing whitespace."""
    data = block.rstrip().encode("utf-8", "surrogatepass")  # JSON may carry lone surrogates
    return hashlib.blake2b(data, digest_size=KEY_BYTES).digest()


def seen_with(
    record: BlockRecord | None, predecessor: bytes | None, successor: bytes | None
) -> BlockRecord:
    """`record` after one more sighting of its block between these neighbours."""
    if record is None:
        return BlockRecord(predecessor, successor, False, False)
    return record._replace(
        predecessor_varied=record.predecessor_varied or predecessor != record.predecessor,
        successor_varied=record.successor_varied or successor != record.successor,
    )


def is_unit(
    record: BlockRecord | None,
    key: bytes,
    before: BlockRecord | None,
    after: BlockRecord | None,
) -> bool:
    """Whether the block `key` (its `record`) is a document on its own between its
    current neighbours (their records; None at the list's ends or when unknown): it has
    been seen after two different predecessors and before two different successors, and
    neither neighbour has always been seen next to it."""
    if record is None or not (record.predecessor_varied and record.successor_varied):
        return False
    if before is not None and before.successor == key and not before.successor_varied:
        return False
    return not (after is not None and after.predecessor == key and not after.predecessor_varied)


def _record_size(key: bytes, record: BlockRecord) -> int:
    neighbours = (n for n in (record.predecessor, record.successor) if n is not None)
    return sys.getsizeof(key) + sys.getsizeof(record) + sum(map(sys.getsizeof, neighbours))


class BlockEvidence:
    """Neighbour records of blank-line blocks, bounded in bytes; thread-safe."""

    def __init__(self, capacity_bytes: int) -> None:
        self._records: ByteLRU[bytes, BlockRecord] = ByteLRU(capacity_bytes, _record_size)
        self._lock = threading.Lock()  # one request's read-then-record is atomic
        self.requests = 0
        self.blocks = 0
        self.units = 0

    def observe(
        self, blocks: Sequence[str], *, count_this_request: bool = False
    ) -> tuple[bool, ...]:
        """For each of one request's blocks (in prompt order), whether it is a unit
        given the requests observed before; then record this request. With
        `count_this_request`, this request counts towards the block's own variation
        (two documents swapped between two requests are units at the second), never
        towards its neighbours' glue."""
        return self.judge(blocks, count_this_request=count_this_request).units

    def judge(self, blocks: Sequence[str], *, count_this_request: bool = False) -> Judgement:
        """`observe`, also saying which blocks earlier requests had shown (`known`): a
        known block that is no unit has stayed where it was (an instruction, a
        heading), an unknown one is merely new."""
        keys = [block_key(block) for block in blocks]
        last = len(keys) - 1
        with self._lock:
            records = [self._records.get(key) for key in keys]
            updated: dict[bytes, BlockRecord] = {}
            for i, key in enumerate(keys):
                predecessor = keys[i - 1] if i > 0 else None
                successor = keys[i + 1] if i < last else None
                updated[key] = seen_with(updated.get(key, records[i]), predecessor, successor)
            # Glue is evidence from earlier requests only: a neighbour first seen now
            # has only ever been next to this block, which says nothing yet.
            own = [updated[key] for key in keys] if count_this_request else records
            units = tuple(
                is_unit(
                    own[i],
                    key,
                    records[i - 1] if i > 0 else None,
                    records[i + 1] if i < last else None,
                )
                for i, key in enumerate(keys)
            )
            for key, record in updated.items():
                self._records.put(key, record)
            self.requests += 1
            self.blocks += len(keys)
            self.units += sum(units)
        return Judgement(units, tuple(record is not None for record in records))

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self.requests = self.blocks = self.units = 0

    def stats(self) -> dict[str, int]:
        """The record map's entries, bytes, capacity, hits and misses; requests and
        blocks observed and the blocks answered as units."""
        with self._lock:
            return {
                **self._records.stats(),
                "requests": self.requests,
                "blocks": self.blocks,
                "units": self.units,
            }
