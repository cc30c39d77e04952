"""Bounded load for hot routing keys (docs/scale-out.md).

A client that routes by anchor segment (`loadgen.clients.routing`) sends a Zipf-hot anchor's
requests all to one replica. `BoundedKeys` keeps that replica under a share of the
client's traffic by spreading only the hot keys:

* it remembers the replica each of the client's last W - 1 requests went to (`window`
  = W; `place`: routing key -> replica, e.g. `SmgRing(urls).place`, smg's own ring);
* a key is **hot** when, with this request, it holds more than `hot_share` (h, default
  `max_share / 2`) of the last W requests; any other key is **cold** and is sent as
  itself, always;
* a hot key has one sub-key per replica (`anchor`, then the first `anchor#i` that smg
  places on a replica not yet used), tried in that fixed order: its request goes to the
  first whose replica would still hold at most `cap = ceil(max_share * W)` of the last W,
  else to the least loaded. So it fills its home replica first and spills to a second
  replica, then a third, only as far as needed, always the same ones for that key.

The bound: a hot request never brings a replica above `cap` of the last W requests.
A replica with room always exists when `max_share >= 1/R` (R replicas at `cap` would
hold R * cap >= W > W - 1 requests), and a hot key's sub-keys reach every replica. So in
any W consecutive requests a replica gets at most `cap` plus the cold-key requests it
got after its last hot one in them (the window ending at that hot request held at most
`cap`). Cold keys never move (each under h * W of the window), so they alone can push a
replica past `cap`. With `hot_share=0` every key may move, and no replica ever gets
more than `cap` of any W consecutive requests. The bound is on this client's requests
as placed by `place`: smg sends a key elsewhere only when its worker is unhealthy.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Hashable, Mapping, Sequence

from loadgen.clients.routing import ROUTING_KEY_HEADER, anchor_segment

SUBKEY_SEPARATOR = "#"
MAX_PROBES = 256  # suffixes tried to find a sub-key on each replica


def spread_keys(
    key: str, place: Callable[[str], Hashable], replicas: int, max_probes: int = MAX_PROBES
) -> list[str]:
    """`key`, then for each further replica the first `key#i` (i = 1, 2, …) placed on
    it: sub-keys on distinct replicas, in a fixed order."""
    keys, seen = [key], {place(key)}
    for i in range(1, max_probes + 1):
        if len(seen) >= replicas:
            break
        candidate = f"{key}{SUBKEY_SEPARATOR}{i}"
        replica = place(candidate)
        if replica not in seen:
            seen.add(replica)
            keys.append(candidate)
    return keys


class BoundedKeys:
    """The routing key of each request, hot keys spread (see the module docstring)."""

    def __init__(
        self,
        place: Callable[[str], Hashable],
        replicas: int,
        max_share: float,
        hot_share: float | None = None,
        window: int = 256,
    ) -> None:
        if replicas < 1 or window < 1:
            raise ValueError("replicas and window must be at least 1")
        if not 1.0 / replicas <= max_share <= 1.0:
            raise ValueError("max_share must be in [1/replicas, 1]")
        self.place, self.replicas, self.window = place, replicas, window
        self.max_share = max_share
        self.hot_share = max_share / 2 if hot_share is None else hot_share
        self.cap = math.ceil(max_share * window)
        self._recent: deque[tuple[str, Hashable]] = deque()
        self._by_key: Counter[str] = Counter()
        self._by_replica: Counter[Hashable] = Counter()
        self._spread: dict[str, list[tuple[str, Hashable]]] = {}

    def is_hot(self, key: str) -> bool:
        """Would a request of `key` now hold more than h * W of the last W requests?"""
        return self._by_key[key] + 1 > self.hot_share * self.window

    def key_for(self, anchor: str) -> str:
        """The routing key for the next request whose anchor is `anchor`."""
        if self.is_hot(anchor):
            options = self._spread.get(anchor)
            if options is None:
                keys = spread_keys(anchor, self.place, self.replicas)
                options = self._spread[anchor] = [(k, self.place(k)) for k in keys]
            roomy = [o for o in options if self._by_replica[o[1]] + 1 <= self.cap]
            key, replica = roomy[0] if roomy else min(options, key=self._replica_load)
        else:
            key, replica = anchor, self.place(anchor)
        self._record(anchor, replica)
        return key

    def headers(
        self, segment_ids: Sequence[str], popularity: Mapping[str, float] | None = None
    ) -> dict[str, str]:
        """`routing_headers` with the anchor's key bounded; no header without segments."""
        anchor = anchor_segment(segment_ids, popularity)
        return {} if anchor is None else {ROUTING_KEY_HEADER: self.key_for(anchor)}

    def replica_counts(self) -> dict[Hashable, int]:
        """Requests each replica got among the last W - 1."""
        return {replica: n for replica, n in self._by_replica.items() if n}

    def _replica_load(self, option: tuple[str, Hashable]) -> int:
        return self._by_replica[option[1]]

    def _record(self, anchor: str, replica: Hashable) -> None:
        self._recent.append((anchor, replica))
        self._by_key[anchor] += 1
        self._by_replica[replica] += 1
        if len(self._recent) >= self.window:
            old_anchor, old_replica = self._recent.popleft()
            self._by_key[old_anchor] -= 1
            self._by_replica[old_replica] -= 1
            if not self._by_key[old_anchor]:
                del self._by_key[old_anchor]
                self._spread.pop(old_anchor, None)  # recomputed if it runs hot again
