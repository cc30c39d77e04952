"""Scheduling policies by name (SPEC §2, §5)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from prism_proxy.qas.baselines import (
    ContextPilotStylePolicy,
    ContinuumStylePolicy,
    FifoPolicy,
    KlpmPolicy,
)
from prism_proxy.qas.params import QasParams
from prism_proxy.qas.prism import PrismPolicy
from prism_proxy.qas.residency import CacheView
from prism_proxy.qas.types import ActiveRequest, QueuedRequest, RoundPlan


class SchedulingPolicy(Protocol):
    """Decides which queued requests a round releases, in what order, with what skeleton.

    Contract: the wave holds at most `wave_size` distinct rids, all from `queue`, and
    exactly min(wave_size, len(queue)) of them. `skeletons[rid]` is a permutation of the
    request's segments (the identity when `reorder` is false). The policy may keep state
    across rounds only to model what it released or what the backend holds (a cache
    view, a residency source). `now` is the round's time on the clock of `arrival`.
    `cache_view` is the bounded view of dispatched prompts it keeps, if any (its memory
    is reported in the proxy's metrics). `reorders`: whether it serves a request's
    segments in another order than the client's (the edge then also arranges what QAS
    does not schedule, such as the documents of tool results).
    """

    name: str
    cache_view: CacheView | None
    reorders: bool

    def plan_round(
        self,
        queue: Sequence[QueuedRequest],
        active: Sequence[ActiveRequest],
        wave_size: int,
        now: float | None = None,
    ) -> RoundPlan: ...


POLICIES: dict[str, Callable[[QasParams], SchedulingPolicy]] = {
    "prism": PrismPolicy,
    "fifo": FifoPolicy,
    "klpm": KlpmPolicy,
    "contextpilot-style": ContextPilotStylePolicy,
    "continuum-style": ContinuumStylePolicy,
}


def make_policy(name: str, params: QasParams | None = None) -> SchedulingPolicy:
    """Build a policy by name; unknown names raise ValueError listing the choices."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    return factory(params or QasParams())
