"""The asyncio driver of the admission core (SPEC §2, §3).

`AdmissionCore` (pure) decides; this loop only keeps time, resolves each released
request's future in wave order, keeps the metrics and hands P̂_t to `on_wave`:

    submit ─► core.arrive ─► future ··· round due ─► core.begin_round ─► plan ─► commit
                                                                                  │
    edge: admit(request) ─► future ◄── resolved in release order ◄─────────────────┘
          ... first chunk ─► first_token(rid)      (leaves pending prefill)
          exit (done, error, client gone) ─► finish(rid), or withdraw(rid) if queued
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from prism_proxy.admission.core import (
    AdmissionCore,
    BackendLimits,
    DuplicateRidError,
    PrefillPacing,
    QueueFullError,
    Released,
    RoundInput,
    ShuttingDownError,
    Wave,
)
from prism_proxy.admission.pieces import PrefillTurns
from prism_proxy.metrics import ProxyMetrics
from prism_proxy.qas.types import QueuedRequest, RoundPlan

__all__ = [
    "AdmissionController",
    "DuplicateRidError",
    "QueueFullError",
    "Released",
    "ShuttingDownError",
]

log = logging.getLogger(__name__)

PushFn = Callable[[dict[str, float]], None]

# Rounds over at least this many queued segment occurrences run in a worker thread.
OFFLOAD_OCCURRENCES = 2048


class AdmissionController:
    """Drives one `AdmissionCore` on the event loop; `run()` is the round loop task.
    The core is built apart (`prism_proxy.scheduling.admission_core`, as the twin
    builds its own)."""

    def __init__(
        self,
        core: AdmissionCore,
        *,
        metrics: ProxyMetrics,
        on_wave: PushFn | None = None,
        offload_occurrences: int = OFFLOAD_OCCURRENCES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        pacing = core.pacing
        self.metrics = metrics
        self.on_wave = on_wave
        self.offload_occurrences = offload_occurrences
        self.clock = clock
        self._futures: dict[str, asyncio.Future[Released]] = {}
        self._wakeup = asyncio.Event()
        # Pieced prompts take turns at the engine, one per replica (`admission.pieces`).
        self.turns = PrefillTurns(pacing.replicas)
        self._bind_gauges()

    # --- views -----------------------------------------------------------------------
    @property
    def pacing(self) -> PrefillPacing:
        return self.core.pacing

    @property
    def queue_depth(self) -> int:
        return self.core.queue_depth

    @property
    def inflight(self) -> int:
        return self.core.inflight

    @property
    def pending_prefill(self) -> int:
        return self.core.pending_prefill

    def _bind_gauges(self) -> None:
        """The state gauges read the core when scraped (no work per request event)."""
        metrics, core = self.metrics, self.core
        metrics.queue_depth.set_function(lambda: core.queue_depth)
        metrics.inflight.set_function(lambda: core.inflight)
        metrics.pending_prefill.set_function(lambda: core.pending_prefill)
        metrics.prefill_batch.set_function(lambda: core.pacing.prefill_batch)
        metrics.inflight_limit.set_function(lambda: core.pacing.backstop)

    def learn_backend(self, limits: BackendLimits) -> None:
        """The backend reported its batch limits: B and the backstop may change."""
        self.core.learn_backend(limits)
        self._wakeup.set()  # more room may let a round run now

    # --- request side ------------------------------------------------------------------
    def submit(self, request: QueuedRequest) -> asyncio.Future[Released]:
        """Queue a request; its future resolves at release. Raises QueueFullError,
        DuplicateRidError or ShuttingDownError."""
        future = self._enqueue(request, self.clock())
        self._wakeup.set()
        return future

    def _enqueue(self, request: QueuedRequest, now: float) -> asyncio.Future[Released]:
        self.core.arrive(request, now)
        future: asyncio.Future[Released] = asyncio.get_running_loop().create_future()
        self._futures[request.rid] = future
        return future

    def admit(self, request: QueuedRequest) -> asyncio.Future[Released]:
        """`submit`, except that a request reaching an idle proxy (nothing queued, nothing
        in flight) when a round is due gets that round here and now.

        It is the round the loop task would run one hop later, with the same core and
        policy, and nobody else to share it: the hop to the round task and back cost
        about 0.03 ms of latency per request. Only when idle: under load
        the loop's rounds take several arrivals at once, and a round per request cost
        more CPU than the hop (docs/performance.md)."""
        now = self.clock()
        future = self._enqueue(request, now)
        core = self.core
        if (
            core.queue_depth == 1
            and core.inflight == 0
            and len(request.segments) < self.offload_occurrences
            and core.next_round_at(now) == now
        ):
            self.run_round()
        if not future.done():  # behind others, or held back by the policy
            self._wakeup.set()
        return future

    def withdraw(self, rid: str) -> None:
        """Remove a request that is still queued (its client left)."""
        if self.core.withdraw(rid):
            future = self._futures.pop(rid, None)
            if future is not None and not future.done():
                future.cancel()

    def first_token(self, rid: str, uncached_tokens: int | None = None) -> None:
        """The backend's first token (or first byte) of `rid` arrived."""
        if self.core.pending_prefill:
            self.core.first_token(rid, uncached_tokens, self.clock())
            self._wakeup.set()

    def observe_uncached(self, uncached_tokens: int) -> None:
        """A request's uncached prompt tokens, told after its first token."""
        self.core.observe_uncached(uncached_tokens)

    def park(self, rid: str) -> None:
        """`rid` waits outside the engine (`AdmissionCore.park`): room for a round."""
        self.core.park(rid)
        self._wakeup.set()

    def unpark(self, rid: str) -> None:
        """`rid` goes back to the engine, pending prefill again."""
        self.core.unpark(rid)

    def finish(self, rid: str) -> None:
        """Free the request's place (finished, aborted, failed or client gone)."""
        if self.core.finish(rid):
            self._wakeup.set()

    # --- loop side ---------------------------------------------------------------------
    async def run(self) -> None:
        """Round loop; runs until cancelled, then fails whoever still waits."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                now = self.clock()
                due = self.core.next_round_at(now)
                if due is None or due > now:
                    self._wakeup.clear()
                    timer = None if due is None else loop.call_later(due - now, self._wakeup.set)
                    await self._wakeup.wait()
                    if timer is not None:
                        timer.cancel()
                    continue
                round_input = self.core.begin_round(now)
                if round_input is None:
                    continue
                if round_input.occurrences >= self.offload_occurrences:
                    # A big round runs in a worker thread so that streams keep flowing
                    # (the GIL is handed back every few ms); `commit` skips requests
                    # withdrawn meanwhile.
                    plan = await asyncio.to_thread(self._plan, round_input)
                else:
                    plan = self._plan(round_input)
                self._commit(round_input, plan)
                # Let released handlers start before the next round.
                await asyncio.sleep(0)
        finally:
            self.close()

    def run_round(self) -> Wave | None:
        """One round inline: snapshot, plan, release the wave in order, push P̂_t."""
        round_input = self.core.begin_round(self.clock())
        if round_input is None:
            return None
        return self._commit(round_input, self._plan(round_input))

    def _plan(self, round_input: RoundInput) -> RoundPlan:
        started = time.perf_counter()
        plan = self.core.plan(round_input)
        self.metrics.round_seconds.observe(time.perf_counter() - started)
        return plan

    def _commit(self, round_input: RoundInput, plan: RoundPlan) -> Wave:
        """Resolve the wave's futures in release order, then hand P̂_t to `on_wave`."""
        wave = self.core.commit(round_input, plan, self.clock())
        for release in wave.released:
            future = self._futures.pop(release.rid, None)
            if future is None or future.done():
                self.core.finish(release.rid)  # its client is already gone
                continue
            future.set_result(release)
            self.metrics.child(self.metrics.releases, release.lane.value).inc()
        if wave.released:
            self.metrics.wave_size.observe(len(wave.released))
            if self.on_wave is not None and wave.dispatch_priorities:
                self.on_wave(dict(wave.dispatch_priorities))
        return wave

    def close(self) -> None:
        """Stop admitting; fail every queued request with ShuttingDownError."""
        for rid in self.core.close():
            future = self._futures.pop(rid, None)
            if future is not None and not future.done():
                future.set_exception(ShuttingDownError("the proxy stopped"))
