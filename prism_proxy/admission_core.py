"""The admission core: queue, rounds, waves and prefill pacing, with no I/O (SPEC §2).

    arrive ──► queue (rid → waiting, arrival order) ──round──► wave ──► released
                  ▲                                                      │
                  └── withdraw (client gone)              pending prefill (no token yet)
                                                                         │ first_token
                                                                         ▼
                                                                 decoding (active)
                                                                         │ finish
                                                                         ▼ gone

A sans-IO state machine: the caller passes `now` (seconds, any monotonic clock) and
events in, and gets the wave to release out; it never sleeps, reads a clock or touches
a socket. The proxy's asyncio loop (`prism_proxy.admission`) and the modeled-time twin
(`loadgen.twin`) are its two drivers.

Pacing (SPEC §2): a released request is *pending prefill* until its first token. A
round runs only while fewer than `B` requests are pending and fewer than the backstop
are released-and-unfinished; its wave size is `M = min(B − pending, backstop −
in flight)`. Decoding requests do not count against `B`. A round is due `window_s`
after the previous one, or at once when a request arrives at an empty queue while
there is room. `finish` (done, aborted, failed, client gone) frees both counts at once.

Deadlines (issue 13): `arrive` stamps each request with the moment its admission wait
runs out: its TTFT SLO less the observed release-to-first-token time (an EWMA), or
else the policy's `cold_deadline_ms`; the policy's deadline lane reads it.

Rounds may be split (`begin_round` → `plan` → `commit`) so that a driver can run the
pure `plan` elsewhere (a worker thread); `commit` tolerates requests withdrawn meanwhile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from prism_proxy.pacing import PrefillPacing
from prism_proxy.qas.policies import SchedulingPolicy
from prism_proxy.qas.types import ActiveRequest, Lane, QueuedRequest, RoundPlan


class QueueFullError(Exception):
    """The queue holds `max_queue` requests; the caller answers 429."""


class DuplicateRidError(ValueError):
    """A request with this rid is already queued or in flight; the caller answers 400."""


class ShuttingDownError(Exception):
    """The core stopped admitting; the caller answers 503."""


@dataclass(frozen=True, slots=True)
class Released:
    """What QAS decided for one released request."""

    rid: str
    lane: Lane
    skeleton: tuple[str, ...]
    priorities: dict[str, float]  # P̂_t of the request's own segments (its anchors)
    wait_s: float


@dataclass(frozen=True, slots=True)
class RoundInput:
    """What a round plans over: Q_queue, Q_active and M, taken at one instant."""

    now: float
    queue: list[QueuedRequest]
    active: list[ActiveRequest]
    wave_size: int

    @property
    def occurrences(self) -> int:
        """S: queued segment occurrences (the round's cost, SPEC §2)."""
        return sum(len(request.segments) for request in self.queue)


@dataclass(frozen=True, slots=True)
class Wave:
    """One committed round: the requests released, in release order, and P̂_t."""

    released: list[Released]
    plan: RoundPlan

    @property
    def dispatch_priorities(self) -> dict[str, float]:
        return self.plan.dispatch_priorities


@dataclass(slots=True)
class _Waiting:
    request: QueuedRequest
    enqueued: float


class AdmissionCore:
    """Queue, active set and pending-prefill set around one scheduling policy."""

    def __init__(
        self,
        policy: SchedulingPolicy,
        pacing: PrefillPacing,
        *,
        window_s: float,
        max_queue: int,
    ) -> None:
        self.policy = policy
        self.pacing = pacing
        self.window_s = window_s
        self.max_queue = max_queue
        self._queue: dict[str, _Waiting] = {}
        self._active: dict[str, ActiveRequest] = {}
        self._pending: dict[str, float] = {}  # released, no first token yet (⊆ _active)
        self.prefill_s: float | None = None  # EWMA of release → first token
        self._last_round = float("-inf")
        self._run_now = False
        self.closed = False

    # --- views ---------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def inflight(self) -> int:
        return len(self._active)

    @property
    def pending_prefill(self) -> int:
        return len(self._pending)

    @property
    def room(self) -> int:
        """M: how many requests a round could release now."""
        by_prefill = self.pacing.prefill_batch - len(self._pending)
        by_backstop = self.pacing.backstop - len(self._active)
        return max(0, min(by_prefill, by_backstop))

    def is_queued(self, rid: str) -> bool:
        return rid in self._queue

    # --- events ----------------------------------------------------------------------
    def arrive(self, request: QueuedRequest, now: float) -> None:
        """Queue a request (QueueFullError, DuplicateRidError, ShuttingDownError)."""
        if self.closed:
            raise ShuttingDownError("the proxy is shutting down")
        if len(self._queue) >= self.max_queue:
            raise QueueFullError(f"admission queue full ({self.max_queue} requests waiting)")
        if request.rid in self._queue or request.rid in self._active:
            raise DuplicateRidError(f"rid {request.rid!r} is already in use")
        if not self._queue and self.room > 0:
            self._run_now = True  # SPEC §2: a round runs at once on an idle backend
        deadline = self.deadline_for(request, now)
        if deadline != request.deadline:
            request = replace(request, deadline=deadline)
        self._queue[request.rid] = _Waiting(request, now)

    def deadline_for(self, request: QueuedRequest, now: float) -> float:
        """When `request`'s admission wait runs out (inf: never)."""
        if request.ttft_slo_s is not None:
            return now + max(0.0, request.ttft_slo_s - (self.prefill_s or 0.0))
        params = getattr(self.policy, "params", None)
        target_ms = getattr(params, "cold_deadline_ms", 0.0)
        return now + target_ms / 1000.0 if target_ms > 0 else math.inf

    def withdraw(self, rid: str) -> bool:
        """Remove a request that is still queued; False if it is not queued."""
        return self._queue.pop(rid, None) is not None

    def first_token(
        self, rid: str, uncached_tokens: int | None = None, now: float | None = None
    ) -> None:
        """The backend answered `rid`'s first token (or first byte): it now decodes.
        `uncached_tokens` (prompt − cached, when reported) feeds the B rule; `now`
        the release-to-first-token estimate that SLO deadlines use."""
        released = self._pending.pop(rid, None)
        if released is None:
            return
        if uncached_tokens is not None:
            self.pacing.observe(uncached_tokens)
        if now is not None:
            sample = max(0.0, now - released)
            previous = self.prefill_s
            self.prefill_s = sample if previous is None else previous + (sample - previous) / 16

    def finish(self, rid: str) -> bool:
        """`rid` ended (finished, aborted, failed or its client left); False if it was
        not released."""
        self._pending.pop(rid, None)
        return self._active.pop(rid, None) is not None

    def close(self) -> list[str]:
        """Stop admitting; empties the queue and returns the rids it held."""
        self.closed = True
        rids = list(self._queue)
        self._queue.clear()
        return rids

    # --- rounds ----------------------------------------------------------------------
    def next_round_at(self, now: float) -> float | None:
        """When the next round is due (≤ now: at once); None while nothing can go."""
        if not self._queue or self.room == 0:
            return None
        if self._run_now:
            return now
        return max(now, self._last_round + self.window_s)

    def begin_round(self, now: float) -> RoundInput | None:
        """Start a round if one can release anything: snapshot Q_queue, Q_active, M."""
        wave_size = self.room
        if not self._queue or wave_size == 0:
            return None
        self._run_now = False
        self._last_round = now
        return RoundInput(
            now=now,
            queue=[waiting.request for waiting in self._queue.values()],
            active=list(self._active.values()),
            wave_size=wave_size,
        )

    def plan(self, round_input: RoundInput) -> RoundPlan:
        """The policy's decision (pure apart from the baselines' cache view)."""
        return self.policy.plan_round(
            round_input.queue, round_input.active, round_input.wave_size, now=round_input.now
        )

    def commit(self, round_input: RoundInput, plan: RoundPlan, now: float) -> Wave:
        """Release the wave in order; requests no longer queued are skipped."""
        released: list[Released] = []
        table = plan.dispatch_priorities
        for entry in plan.wave[: round_input.wave_size]:
            waiting = self._queue.pop(entry.rid, None)
            if waiting is None:
                continue
            skeleton = tuple(plan.skeletons.get(entry.rid, waiting.request.segments))
            head = waiting.request.head
            self._active[entry.rid] = ActiveRequest(entry.rid, skeleton, head)
            self._pending[entry.rid] = now
            priorities = {s: table[s] for s in skeleton if s in table}
            released.append(
                Released(entry.rid, entry.lane, skeleton, priorities, now - waiting.enqueued)
            )
        return Wave(released, plan)

    def run_round(self, now: float) -> Wave | None:
        """One whole round inline (None when no round can run)."""
        round_input = self.begin_round(now)
        if round_input is None:
            return None
        return self.commit(round_input, self.plan(round_input), now)
