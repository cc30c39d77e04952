"""Front alignment and ordered bucket signatures (SPEC §2).

Both are per request: O(m log f_front) and O(m log κ) for a skeleton of m segments.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

Priority = Callable[[str], float]


def _top_positions(skeleton: Sequence[str], priority: Priority, count: int) -> list[int]:
    """Positions of the `count` highest-priority segments, best first.

    Ties go to the earlier position.
    """
    if count <= 0:
        return []
    return heapq.nlargest(count, range(len(skeleton)), key=lambda i: (priority(skeleton[i]), -i))


def front_align(skeleton: Sequence[str], priority: Priority, f_front: int) -> tuple[str, ...]:
    """Π*_i: the top-`f_front` segments first in descending priority, the rest in order."""
    front = _top_positions(skeleton, priority, f_front)
    moved = set(front)
    rest = (segment for i, segment in enumerate(skeleton) if i not in moved)
    return (*(skeleton[i] for i in front), *rest)


def signature(aligned: Sequence[str], priority: Priority, kappa: int) -> tuple[str, ...]:
    """sig_κ(q) = Top→_κ(Π*_i): the κ best segments written in their Π*_i order."""
    return tuple(aligned[i] for i in sorted(_top_positions(aligned, priority, kappa)))
