"""Discrete-event replay of a trace through the scheduler, in modeled time only (SPEC §7).

No wall clock, no asyncio: arrivals are queued at their modeled times, each batch
advances the clock by its modeled duration. This is the exact answer the real-time
engine approximates (it adds Python overhead × speed); the calibration command prints
both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from prism_sim.request import SimRequest
from prism_sim.scheduler import Scheduler


@dataclass(frozen=True)
class TraceRequest:
    rid: str
    arrival_s: float
    input_ids: list[int]
    max_new_tokens: int


@dataclass(frozen=True)
class RequestResult:
    """One request's outcome; times are modeled seconds since the start of the trace."""

    rid: str
    arrival_s: float
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @classmethod
    def of(cls, req: SimRequest, origin_s: float = 0.0) -> RequestResult:
        """`req`'s outcome with times counted from `origin_s` (NaN: never reached)."""

        def since(t: float | None) -> float:
            return math.nan if t is None else t - origin_s

        return cls(
            rid=req.rid,
            arrival_s=req.arrival_s - origin_s,
            first_token_s=since(req.first_token_s),
            finish_s=since(req.finish_s),
            prompt_tokens=len(req.input_ids),
            cached_tokens=req.cached_tokens,
            completion_tokens=len(req.output_ids),
        )


def replay(scheduler: Scheduler, trace: Sequence[TraceRequest]) -> list[RequestResult]:
    """Run `trace` (sorted by arrival) to completion; results in arrival order."""
    pending = sorted(trace, key=lambda t: t.arrival_s)
    reqs: list[SimRequest] = []
    now, i = 0.0, 0
    while True:
        while i < len(pending) and pending[i].arrival_s <= now:
            t = pending[i]
            req = SimRequest(t.rid, list(t.input_ids), t.max_new_tokens, t.arrival_s)
            scheduler.add_request(req, t.arrival_s)
            reqs.append(req)
            i += 1
        batch = scheduler.next_batch(now)
        if batch is None:
            if i >= len(pending):
                break
            now = pending[i].arrival_s
            continue
        now += batch.duration_s
        scheduler.complete_batch(batch, now)
    return [RequestResult.of(r) for r in reqs]
