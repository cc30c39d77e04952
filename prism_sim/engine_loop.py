"""Drives the pure `Scheduler` on an asyncio task in (scaled) real time (SPEC §7).

Two clocks, both in modeled seconds: `now()` = wall time since start × `speed` (used to
stamp arrivals and aborts), and the engine's own clock, which advances by exactly each
batch's modeled duration while busy and jumps to `now()` when idle. After a batch the
loop sleeps until wall time reaches the engine clock; if Python overhead (or a coarse
timer) made it late, it skips sleeping until it has caught up, so overhead does not
accumulate into modeled latencies. A request is only admitted once the engine clock has
reached its arrival, so modeled times stay causal. `lag_s`/`max_lag_s` report how far
the engine clock trails wall time (it should stay near zero; if it grows, lower
`speed`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from prism_sim.request import SimRequest
from prism_sim.scheduler import Batch, Scheduler

WallClock = Callable[[], float]
log = logging.getLogger(__name__)


class EngineLoop:
    """Owns the scheduler's time: `submit`/`abort` from handlers, `run` as a task."""

    def __init__(
        self,
        scheduler: Scheduler,
        speed: float = 1.0,
        wall_clock: WallClock = time.monotonic,
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.scheduler = scheduler
        self.speed = speed
        self.wall_clock = wall_clock
        self._t0 = wall_clock()
        self._wakeup = asyncio.Event()
        self.lag_s = 0.0  # how far (modeled s) the engine clock trails wall time now
        self.max_lag_s = 0.0
        self.current_batch: Batch | None = None
        self.failed: BaseException | None = None  # set if the loop crashed

    def now(self) -> float:
        """Modeled seconds since the engine started."""
        return (self.wall_clock() - self._t0) * self.speed

    def submit(self, req: SimRequest) -> None:
        """Queue a request (raises `ValueError` if the scheduler refuses it, and
        `RuntimeError` once the loop has crashed)."""
        if self.failed is not None:
            raise RuntimeError(f"engine loop crashed: {self.failed!r}")
        self.scheduler.add_request(req, self.now())
        self._wakeup.set()

    def abort(self, rid: str) -> bool:
        found = self.scheduler.abort(rid, self.now())
        self._wakeup.set()
        return found

    async def run(self) -> None:
        """Run batches forever (cancel the task to stop)."""
        try:
            await self._run()
        except Exception as exc:
            log.exception("engine loop crashed")
            self.failed = exc
            self.scheduler.fail_all(self.now(), f"engine loop crashed: {exc!r}")
            raise

    async def _run(self) -> None:
        virtual = self.now()
        while True:
            batch = self.scheduler.next_batch(virtual)
            if batch is None:
                upcoming = self.scheduler.next_arrival_after(virtual)
                if upcoming is not None:
                    virtual = upcoming  # arrived in wall time while we were catching up
                    continue
                self._wakeup.clear()
                await self._wakeup.wait()
                virtual = max(virtual, self.now())
                continue
            self.current_batch = batch
            virtual += batch.duration_s
            delay = self._t0 + virtual / self.speed - self.wall_clock()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let handlers run even when behind
            self.current_batch = None
            self.scheduler.complete_batch(batch, virtual)
            self.lag_s = max(0.0, self.now() - virtual)
            self.max_lag_s = max(self.max_lag_s, self.lag_s)

    async def __aenter__(self) -> EngineLoop:
        self._task = asyncio.create_task(self.run(), name="prism-sim-engine")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        except Exception:
            if self.failed is None:
                raise  # a crash is logged and reported through `failed` already
