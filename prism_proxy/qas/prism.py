"""The PRISM policy: one QAS round (SPEC §2) and the DART table P̂_t (SPEC §3)."""

from __future__ import annotations

from collections.abc import Sequence

from prism_proxy.qas.alignment import front_align, signature
from prism_proxy.qas.buckets import Member, group_by_signature, scan_order
from prism_proxy.qas.counters import SegmentCounters
from prism_proxy.qas.params import QasParams
from prism_proxy.qas.round import fifo_order
from prism_proxy.qas.types import ActiveRequest, BucketView, QueuedRequest, RoundPlan
from prism_proxy.qas.wave import fill_wave


class PrismPolicy:
    """QAS: counters → front alignment → signatures → buckets → scores → wave.

    Stateless across rounds: every round recomputes from its snapshot.
    """

    name = "prism"

    def __init__(self, params: QasParams) -> None:
        self.params = params

    def plan_round(
        self,
        queue: Sequence[QueuedRequest],
        active: Sequence[ActiveRequest],
        wave_size: int,
    ) -> RoundPlan:
        params = self.params
        counters = SegmentCounters.snapshot(queue, active, params)
        priorities = counters.base_priorities()
        priority = priorities.__getitem__
        members = []
        for rank, request in enumerate(fifo_order(queue)):
            skeleton = (
                front_align(request.segments, priority, params.f_front)
                if request.reorder
                else tuple(request.segments)
            )
            members.append(
                Member(
                    rid=request.rid,
                    rank=rank,
                    arrival=request.arrival,
                    skeleton=skeleton,
                    signature=signature(skeleton, priority, params.kappa),
                )
            )
        hot_capacity = max(0, wave_size - params.q_cold)
        scan = scan_order(group_by_signature(members), counters, hot_capacity)
        wave = fill_wave(members, scan, wave_size, params.q_cold)
        skeletons = {m.rid: m.skeleton for m in members}
        return RoundPlan(
            priorities=priorities,
            skeletons=skeletons,
            signatures={m.rid: m.signature for m in members},
            buckets=[
                BucketView(b.signature, tuple(m.rid for m in b.members), b.score) for b in scan
            ],
            wave=wave,
            dispatch_priorities=counters.batch_priorities(skeletons[e.rid] for e in wave),
        )
