"""Which segments the backend's cache holds: the residency counter c_t of P_t (SPEC §2).

Two sources, one interface (`resident()`: the set a round reads):

* `ResidentSegments`: DART's own account, applied from the control RPC's epoch-stamped
  summaries (`GET /prism/residency`, SPEC §4). A summary is either full (the whole set)
  or a delta since a version the proxy already holds (each changed segment's current
  state), so a steady cache costs a few bytes per poll even at 10^5 anchors.
* `UnionResidency`: several DART instances (one proxy in front of a gateway and N
  replicas): resident on any of them.
* `ViewResidency`: without the plugin, the proxy's own bounded view of what it
  dispatched (`CacheView`): a segment counts as resident while some recorded path
  holds it.
* `PendingResidency`: DART's account plus what the proxy released that DART has not
  reported yet (a released request is cached only once prefilled, and reported a poll
  later; the request right behind it must still be aligned to it).

The policy keeps that view of dispatched paths either way (`PrismPolicy.paths`): it
also says in which order the resident segments were cached.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from prism_proxy.qas.cache_view import CacheView


class Residency(Protocol):
    """What a round reads: the segments resident now."""

    def resident(self) -> frozenset[str]: ...


# How long a released segment counts as resident without DART saying so: long enough for
# its request to wait in the engine's queue, prefill and be reported.
PENDING_GRACE_S = 5.0


class PendingResidency:
    """`source` (DART's account) plus the segments released since (`released`) that it
    has not reported resident yet, each for at most `grace_s` after its release; then
    DART's word is final (an evicted or never-cached segment drops out)."""

    def __init__(
        self,
        source: Residency,
        grace_s: float = PENDING_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.grace_s = grace_s
        self.clock = clock
        self._pending: dict[str, float] = {}  # segment -> when it stops counting
        self._expiries: list[tuple[float, str]] = []  # heap; stale entries skipped
        self._confirmed: frozenset[str] | None = None  # the source's set last seen
        self._union: frozenset[str] = frozenset()
        self._dirty = False

    def released(self, segments: Iterable[str]) -> None:
        until = self.clock() + self.grace_s
        for segment in segments:
            self._pending[segment] = until
            heapq.heappush(self._expiries, (until, segment))
        self._dirty = True

    def resident(self) -> frozenset[str]:
        """Per round: expired entries leave through a heap; the pending set is checked
        against DART's only when DART's set changed (the sources hand out the same
        frozenset until a summary changes it)."""
        confirmed = self.source.resident()
        now = self.clock()
        expiries, pending = self._expiries, self._pending
        while expiries and expiries[0][0] <= now:
            until, segment = heapq.heappop(expiries)
            if pending.get(segment) == until:  # not released again since
                del pending[segment]
                self._dirty = True
        if confirmed is not self._confirmed:
            self._confirmed = confirmed
            for segment in [s for s in pending if s in confirmed]:
                del pending[segment]
            self._dirty = True
        if self._dirty:
            self._dirty = False
            self._union = confirmed.union(pending) if pending else confirmed
        return self._union


@dataclass(frozen=True, slots=True)
class ResidencySummary:
    """One answer of `GET /prism/residency?generation=G&since=V`.

    `generation` names the DART instance (a restarted server starts a new one), and
    `version` counts its residency changes. `full`: `resident` is the whole set;
    otherwise `resident`/`gone` list the segments whose state changed after `since`.
    """

    generation: str
    version: int
    full: bool
    resident: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()


class ResidentSegments:
    """The proxy's copy of DART's resident set, kept by applying summaries."""

    def __init__(self) -> None:
        self.generation: str | None = None
        self.version: int | None = None
        self._segments: set[str] = set()
        self._frozen: frozenset[str] = frozenset()

    def apply(self, summary: ResidencySummary) -> None:
        """Apply a full summary, or a delta of the generation held."""
        if summary.full:
            self._segments = set(summary.resident)
        elif summary.generation != self.generation:
            raise ValueError("a delta of another generation; ask for a full summary")
        else:
            self._segments.difference_update(summary.gone)
            self._segments.update(summary.resident)
        self.generation, self.version = summary.generation, summary.version
        self._frozen = frozenset(self._segments)

    def clear(self) -> None:
        """Forget everything (the RPC is unreachable: residency is unknown)."""
        self.generation = self.version = None
        self._segments.clear()
        self._frozen = frozenset()

    def resident(self) -> frozenset[str]:
        return self._frozen


class UnionResidency:
    """Several DART instances (replicas behind a gateway): resident on any of them."""

    def __init__(self, sets: list[ResidentSegments]) -> None:
        self.sets = sets
        self._key: tuple[tuple[str | None, int | None], ...] | None = None
        self._union: frozenset[str] = frozenset()

    def resident(self) -> frozenset[str]:
        key = tuple((s.generation, s.version) for s in self.sets)
        if key != self._key:  # recomputed only when a summary was applied
            self._key = key
            self._union = frozenset().union(*(s.resident() for s in self.sets))
        return self._union


class ViewResidency:
    """Residency from the proxy's own `CacheView` (no plugin to ask)."""

    def __init__(self, view: CacheView) -> None:
        self.view = view

    def resident(self) -> frozenset[str]:
        return self.view.segments()


class NoResidency:
    """The paper's QAS: c_t = 0 for every segment."""

    def resident(self) -> frozenset[str]:
        return frozenset()


def residency_source(policy: object) -> str:
    """Where a policy learns which segments the backend holds: `dart` (DART's resident
    sets, through the control RPC), `view` (the proxy's own cache view) or `none`
    (residency unused: `w_c` = 0, or a policy without it)."""
    residency = getattr(policy, "residency", None)
    if isinstance(residency, PendingResidency):
        return "dart"
    if isinstance(residency, ViewResidency):
        return "view"
    return "none"
