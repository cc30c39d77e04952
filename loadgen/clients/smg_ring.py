"""Where sgl-model-gateway 1.13.0 sends a routing key (docs/scale-out.md).

`smg --policy consistent_hashing` hashes `X-SMG-Routing-Key` onto a ring: each worker URL
sits at 150 points, `blake3(f"{url}#{vnode}")`, and a key goes to the first point at or
after `blake3(key)` (positions are the digest's first 8 bytes, little-endian), skipping
unhealthy workers. `SmgRing` is that ring, so a client can tell which replica a key
reaches before sending it (checked against a running smg in tests/test_gateway_smg.py).

BLAKE3 is the `blake3` package (the reference implementation's Python binding).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from blake3 import blake3

VIRTUAL_NODES = 150  # smg's VIRTUAL_NODES_PER_WORKER


def ring_position(text: str) -> int:
    """smg's ring position of a string: BLAKE3's first 8 bytes, little-endian."""
    return int.from_bytes(blake3(text.encode()).digest()[:8], "little")


class SmgRing:
    """smg 1.13.0's consistent-hashing ring over `urls` (as smg lists them on
    `/workers`), all healthy."""

    def __init__(self, urls: Iterable[str]) -> None:
        points = sorted(
            (ring_position(f"{url}#{vnode}"), url) for url in urls for vnode in range(VIRTUAL_NODES)
        )
        if not points:
            raise ValueError("a ring needs at least one worker URL")
        self._positions = [position for position, _ in points]
        self._urls = [url for _, url in points]
        self.urls = tuple(sorted(set(self._urls)))

    def place(self, key: str) -> str:
        """The worker URL smg sends `key` to."""
        index = bisect.bisect_left(self._positions, ring_position(key))
        return self._urls[index % len(self._urls)]
