"""Where blank-line blocks may be cut apart, from evidence across one client's requests
(SPEC §1: documents "are reorderable only where their boundaries are certain, from the
layout itself or from evidence across requests").

Blank lines separate documents (LangChain's stuff-documents join) but also a
document's own blocks (a metadata line, a title, paragraphs), so a request's blocks
move only as **units**: runs of blocks the evidence never saw apart. `BlockEvidence`
remembers, for each block, the neighbours it was first seen between, and whether it has
since been seen after a different predecessor or before a different successor (None,
the list's start or end, counts as a neighbour). Between two consecutive blocks X, Y of
a request each side says `apart` (X was followed by another block, or Y preceded by
another), `together` (always next to each other so far) or nothing (never seen):

    X says      Y says      boundary
    together    any         glued          (a footer X always had, a header Y always had)
    apart       apart       cut
    apart       nothing     cut, unless X is a heading (a short line without a full
                            stop: a title, "file_path: a.txt"), which keeps its new text
    nothing     apart       cut
    nothing     nothing     glued          (two new blocks: nothing says they are two)

    requests  [A B C]  [C A B]                 (three documents, the second in another order)
    second:   C|A cut (C ended the list, A began it), A|B glued: units [C] [A B],
              which the policy serves along the arrangement cached: A B C
    requests  [X P1 P2 Y]  [P1 P2 Z]  [W P1 P2]   (P1 P2: one two-paragraph document)
    P1|P2 glued every time: the document is never split

So the first repeat of the same blocks in another order can be served as the first
request was (its units are runs of that arrangement), and a new block between known ones
is a unit of its own. The request's leading units whose first block has only ever opened
the list (an instruction) stay in front; its trailing ones whose last block has only
ever closed it stay at the end.

Evidence is kept per client (`scoped`): one client's arrangements never cut another's
documents. A block's identity is its text without its trailing separator (and the
client), so the same block before "\n\n" or before a closing rule's "\n" is one block.
Records live in a `ByteLRU` (bounded in bytes, least recently used evicted first); a
forgotten block starts over.
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

    glued: tuple[bool, ...]  # travels with the block before it (the first: False)
    known: tuple[bool, ...]  # seen in an earlier request
    opens: tuple[bool, ...]  # known, and only ever seen first in its list
    closes: tuple[bool, ...]  # known, and only ever seen last in its list

    def units(self) -> list[range]:
        """The request's units: runs of glued blocks, as index ranges."""
        starts = [i for i, glued in enumerate(self.glued) if not glued]
        return [range(a, b) for a, b in zip(starts, [*starts[1:], len(self.glued)], strict=True)]

    def in_place(self) -> tuple[int, int]:
        """(lead, tail): blocks before `lead` (leading units whose first block only ever
        opened the list: an instruction, "Context:") stay in front, blocks from `tail`
        (trailing units whose last block only ever closed it) stay at the end."""
        units = self.units()
        lead = 0
        while units and self.opens[units[0].start]:
            lead = units.pop(0).stop
        tail = len(self.glued)
        while units and self.closes[units[-1].stop - 1]:
            tail = units.pop().start
        return lead, tail


def block_key(block: str, scope: bytes = b"") -> bytes:
    """A block's identity: 16-byte BLAKE2b of its text without trailing whitespace,
    keyed by the client's `scope`."""
    data = block.rstrip().encode("utf-8", "surrogatepass")  # JSON may carry lone surrogates
    return hashlib.blake2b(data, digest_size=KEY_BYTES, key=scope[:64]).digest()


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


# A heading: at most this many lines and characters, not ending as a sentence does.
HEADING_LINES = 3
HEADING_CHARS = 200
_SENTENCE_ENDS = tuple(".!?:;\"'”)]")


def is_heading(block: str) -> bool:
    """Whether `block` reads as a heading of what follows it (a title, metadata lines
    such as "file_path: a.txt"): short, and not ending as a sentence or a list's
    introduction ("Context:") does."""
    text = block.strip()
    return (
        0 < len(text) <= HEADING_CHARS
        and text.count("\n") < HEADING_LINES
        and not text.endswith(_SENTENCE_ENDS)
    )


def _side(record: BlockRecord | None, neighbour: bytes, *, after: bool) -> bool | None:
    """What one side of a boundary says: True apart, False together, None unknown.
    `record` is the block before the boundary (`after`: its successor is `neighbour`)
    or after it (its predecessor is `neighbour`)."""
    if record is None:
        return None
    first, varied = (
        (record.successor, record.successor_varied)
        if after
        else (record.predecessor, record.predecessor_varied)
    )
    return varied or first != neighbour


def is_cut(
    before: BlockRecord | None,
    before_key: bytes,
    after: BlockRecord | None,
    after_key: bytes,
    before_is_heading: bool,
) -> bool:
    """Whether the boundary between two consecutive blocks is certain (module doc)."""
    left = _side(before, after_key, after=True)
    right = _side(after, before_key, after=False)
    if left is False or right is False:
        return False
    if left and right:
        return True
    if left:
        return not before_is_heading
    return bool(right)


def _record_size(key: bytes, record: BlockRecord) -> int:
    neighbours = (n for n in (record.predecessor, record.successor) if n is not None)
    return sys.getsizeof(key) + sys.getsizeof(record) + sum(map(sys.getsizeof, neighbours))


class BlockEvidence:
    """Neighbour records of blank-line blocks, bounded in bytes; thread-safe. `scoped`
    gives one client's view of it."""

    def __init__(self, capacity_bytes: int) -> None:
        self._records: ByteLRU[bytes, BlockRecord] = ByteLRU(capacity_bytes, _record_size)
        self._lock = threading.Lock()  # one request's read-then-record is atomic
        self.requests = 0
        self.blocks = 0
        self.cuts = 0

    def scoped(self, client: str) -> ScopedEvidence:
        """The evidence of one client's requests only."""
        return ScopedEvidence(self, client.encode("utf-8", "surrogatepass"))

    def judge(self, blocks: Sequence[str], scope: bytes = b"") -> Judgement:
        """What the requests observed before say of `blocks` (one request's, in prompt
        order); then record this request."""
        keys = [block_key(block, scope) for block in blocks]
        last = len(keys) - 1
        with self._lock:
            records = [self._records.get(key) for key in keys]
            glued = [False] + [
                not is_cut(
                    records[i - 1], keys[i - 1], records[i], keys[i], is_heading(blocks[i - 1])
                )
                for i in range(1, len(keys))
            ]
            updated: dict[bytes, BlockRecord] = {}
            for i, key in enumerate(keys):
                predecessor = keys[i - 1] if i > 0 else None
                successor = keys[i + 1] if i < last else None
                updated[key] = seen_with(updated.get(key, records[i]), predecessor, successor)
            for key, record in updated.items():
                self._records.put(key, record)
            self.requests += 1
            self.blocks += len(keys)
            self.cuts += glued.count(False) - 1 if keys else 0
        return Judgement(
            tuple(glued),
            tuple(r is not None for r in records),
            tuple(
                r is not None and r.predecessor is None and not r.predecessor_varied
                for r in records
            ),
            tuple(
                r is not None and r.successor is None and not r.successor_varied for r in records
            ),
        )

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self.requests = self.blocks = self.cuts = 0

    def stats(self) -> dict[str, int]:
        """The record map's entries, bytes, capacity, hits and misses; requests and
        blocks observed and the boundaries found certain."""
        with self._lock:
            return {
                **self._records.stats(),
                "requests": self.requests,
                "blocks": self.blocks,
                "cuts": self.cuts,
            }


class ScopedEvidence:
    """One client's evidence: `judge` as `BlockEvidence.judge` within its scope."""

    __slots__ = ("evidence", "scope")

    def __init__(self, evidence: BlockEvidence, scope: bytes) -> None:
        self.evidence = evidence
        self.scope = hashlib.blake2b(scope, digest_size=32).digest()

    def judge(self, blocks: Sequence[str]) -> Judgement:
        return self.evidence.judge(blocks, self.scope)
