"""Front alignment and ordered bucket signatures (SPEC §2).

Both are per request: O(m log f_front) and O(m log κ) for a skeleton of m segments.

Ties. The paper breaks equal priorities by position, so a lone request (every segment
tied) keeps the client's order, and the same documents in another order share nothing.
With `canonical` ties they break by `canonical_key`, a stable global order of
segment ids, and the segments after the front follow that order too: any order of the
same set aligns to the same skeleton. The key is a hash, not the id's spelling, so the
order carries no meaning a trace could line up with.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
from collections.abc import Callable, Sequence

Priority = Callable[[str], float]


@functools.lru_cache(maxsize=1 << 16)
def canonical_key(segment: str) -> int:
    """A segment's place in the global tie order (smaller first): 64 bits of BLAKE2b."""
    return int.from_bytes(hashlib.blake2b(segment.encode(), digest_size=8).digest(), "big")


def _top_positions(
    skeleton: Sequence[str], priority: Priority, count: int, canonical: bool = False
) -> list[int]:
    """Positions of the `count` highest-priority segments, best first.

    Ties go to the earlier position, or with `canonical` to the smaller canonical key.
    """
    if count <= 0:
        return []
    if canonical:
        return heapq.nlargest(
            count,
            range(len(skeleton)),
            key=lambda i: (priority(skeleton[i]), -canonical_key(skeleton[i])),
        )
    return heapq.nlargest(count, range(len(skeleton)), key=lambda i: (priority(skeleton[i]), -i))


def front_align(
    skeleton: Sequence[str], priority: Priority, f_front: int, canonical: bool = False
) -> tuple[str, ...]:
    """Π*_i: the top-`f_front` segments first in descending priority, the rest in order
    (their own order, or with `canonical` the global one)."""
    front = _top_positions(skeleton, priority, f_front, canonical)
    moved = set(front)
    rest = [segment for i, segment in enumerate(skeleton) if i not in moved]
    if canonical:
        rest.sort(key=canonical_key)
    return (*(skeleton[i] for i in front), *rest)


def signature(
    aligned: Sequence[str], priority: Priority, kappa: int, canonical: bool = False
) -> tuple[str, ...]:
    """sig_κ(q) = Top→_κ(Π*_i): the κ best segments written in their Π*_i order."""
    return tuple(aligned[i] for i in sorted(_top_positions(aligned, priority, kappa, canonical)))
