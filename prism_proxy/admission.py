"""The QAS admission loop: queue, rounds, waves, releases (SPEC §2, §3).

    submit ──► queue (rid → Pending, arrival order) ──round──► wave ──► futures resolved
                       ▲                                         │       in wave order
                       └── cancel (client gone) removes it       ▼
                                                  active (released, not finished)
                                                         │ finish(rid)
                                                         ▼ frees a slot

A round runs every `window_s` while requests wait and slots are free, or at once when
a request arrives at an empty queue with a free slot. The wave size is
`M = max_inflight − inflight`; the policy picks which requests and in what order
(`plan_round`), and this loop only does the bookkeeping and the I/O hand-off.
Every released request holds one slot until `finish(rid)`; `slot()` guarantees that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from prism_proxy.metrics import ProxyMetrics
from prism_proxy.qas.policies import SchedulingPolicy
from prism_proxy.qas.types import ActiveRequest, Lane, QueuedRequest, RoundPlan

log = logging.getLogger(__name__)


class QueueFullError(Exception):
    """The queue holds `max_queue` requests; the caller answers 429."""


class DuplicateRidError(ValueError):
    """A request with this rid is already queued or in flight; the caller answers 400."""


class ShuttingDownError(Exception):
    """The loop stopped before the request was released; the caller answers 503."""


@dataclass(frozen=True, slots=True)
class Release:
    """What QAS decided for one released request."""

    lane: Lane
    skeleton: tuple[str, ...]
    priorities: dict[str, float]
    wait_s: float


@dataclass(slots=True)
class _Pending:
    request: QueuedRequest
    future: asyncio.Future[Release]
    enqueued: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What a round plans over: Q_queue, Q_active and M, taken at one instant."""

    queue: list[QueuedRequest]
    active: list[ActiveRequest]
    wave_size: int
    occurrences: int


PushFn = Callable[[dict[str, float]], None]

# Rounds over at least this many queued segment occurrences run in a worker thread.
OFFLOAD_OCCURRENCES = 2048


class AdmissionController:
    """Owns the queue and the active set; `run()` is the round loop (one task)."""

    def __init__(
        self,
        policy: SchedulingPolicy,
        *,
        max_inflight: int,
        window_s: float,
        max_queue: int,
        metrics: ProxyMetrics,
        on_wave: PushFn | None = None,
        offload_occurrences: int = OFFLOAD_OCCURRENCES,
    ) -> None:
        self.policy = policy
        self.max_inflight = max_inflight
        self.window_s = window_s
        self.max_queue = max_queue
        self.metrics = metrics
        self.on_wave = on_wave
        self.offload_occurrences = offload_occurrences
        self._queue: dict[str, _Pending] = {}
        self._active: dict[str, ActiveRequest] = {}
        self._wakeup = asyncio.Event()
        self._run_now = False
        self._last_round = float("-inf")
        self._closed = False

    # --- views -----------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def inflight(self) -> int:
        return len(self._active)

    @property
    def free_slots(self) -> int:
        return max(0, self.max_inflight - len(self._active))

    # --- request side ------------------------------------------------------------------
    def submit(self, request: QueuedRequest) -> asyncio.Future[Release]:
        """Queue a request; its future resolves at release. Raises QueueFullError."""
        if self._closed:
            raise ShuttingDownError("the proxy is shutting down")
        if len(self._queue) >= self.max_queue:
            raise QueueFullError(f"admission queue full ({self.max_queue} requests waiting)")
        if request.rid in self._queue or request.rid in self._active:
            raise DuplicateRidError(f"rid {request.rid!r} is already in use")
        future: asyncio.Future[Release] = asyncio.get_running_loop().create_future()
        if not self._queue and self.free_slots > 0:
            self._run_now = True  # SPEC §2: a round runs at once on an idle backend
        self._queue[request.rid] = _Pending(request, future)
        self.metrics.queue_depth.set(len(self._queue))
        self._wakeup.set()
        return future

    def withdraw(self, rid: str) -> None:
        """Remove a request that is still queued (its client left)."""
        pending = self._queue.pop(rid, None)
        if pending is not None:
            pending.future.cancel()
            self.metrics.queue_depth.set(len(self._queue))

    def finish(self, rid: str) -> None:
        """Release the slot of a finished (or aborted) request."""
        if self._active.pop(rid, None) is not None:
            self.metrics.inflight.set(len(self._active))
            self._wakeup.set()

    @contextlib.asynccontextmanager
    async def slot(self, request: QueuedRequest) -> AsyncIterator[Release]:
        """Wait for release, hold the slot for the block, always give it back.

        Cancellation while queued withdraws the request; cancellation after release
        (or any exit from the block) finishes it, so slots never leak.
        """
        future = self.submit(request)
        try:
            release = await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.finish(request.rid)  # released just as the client left
            else:
                self.withdraw(request.rid)
            raise
        except BaseException:
            self.withdraw(request.rid)
            raise
        try:
            yield release
        finally:
            self.finish(request.rid)

    # --- loop side ---------------------------------------------------------------------
    async def run(self) -> None:
        """Round loop; runs until cancelled, then fails whoever still waits."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._queue or self.free_slots == 0:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                due = self._last_round + self.window_s
                now = loop.time()
                if not self._run_now and now < due:
                    await asyncio.sleep(due - now)
                    continue
                self._run_now = False
                self._last_round = loop.time()
                snapshot = self._snapshot()
                if snapshot.occurrences >= self.offload_occurrences:
                    # A big round runs in a worker thread so that streams keep flowing
                    # (the GIL is handed back every few ms); the queue may change
                    # meanwhile, which `_release` tolerates.
                    plan = await asyncio.to_thread(self._plan, snapshot)
                else:
                    plan = self._plan(snapshot)
                self._release(plan, snapshot.wave_size)
                # Let released handlers start before the next round.
                await asyncio.sleep(0)
        finally:
            self.close()

    def run_round(self) -> RoundPlan | None:
        """One QAS round inline: snapshot, plan, release the wave in order, push P̂_t."""
        if self.free_slots == 0 or not self._queue:
            return None
        snapshot = self._snapshot()
        plan = self._plan(snapshot)
        self._release(plan, snapshot.wave_size)
        return plan

    def _snapshot(self) -> _Snapshot:
        queue = [pending.request for pending in self._queue.values()]
        return _Snapshot(
            queue=queue,
            active=list(self._active.values()),
            wave_size=self.free_slots,
            occurrences=sum(len(request.segments) for request in queue),
        )

    def _plan(self, snapshot: _Snapshot) -> RoundPlan:
        started = time.perf_counter()
        plan = self.policy.plan_round(snapshot.queue, snapshot.active, snapshot.wave_size)
        self.metrics.round_seconds.observe(time.perf_counter() - started)
        return plan

    def _release(self, plan: RoundPlan, wave_size: int) -> None:
        """Resolve the wave's futures in release order (requests withdrawn meanwhile are
        skipped), then hand P̂_t to `on_wave`."""
        released = 0
        now = time.monotonic()
        for entry in plan.wave[:wave_size]:
            pending = self._queue.pop(entry.rid, None)
            if pending is None or pending.future.done():
                continue
            request = pending.request
            skeleton = tuple(plan.skeletons.get(entry.rid, request.segments))
            self._active[entry.rid] = ActiveRequest(rid=entry.rid, segments=skeleton)
            priorities = {
                s: plan.dispatch_priorities[s] for s in skeleton if s in plan.dispatch_priorities
            }
            pending.future.set_result(
                Release(entry.lane, skeleton, priorities, now - pending.enqueued)
            )
            released += 1
        self.metrics.queue_depth.set(len(self._queue))
        self.metrics.inflight.set(len(self._active))
        if released:
            self.metrics.wave_size.observe(released)
            if self.on_wave is not None and plan.dispatch_priorities:
                self.on_wave(dict(plan.dispatch_priorities))

    def close(self) -> None:
        """Stop admitting; fail every queued request with ShuttingDownError."""
        self._closed = True
        for pending in self._queue.values():
            if not pending.future.done():
                pending.future.set_exception(ShuttingDownError("the proxy stopped"))
        self._queue.clear()
        self.metrics.queue_depth.set(0)
