"""Drives the pure `Scheduler` on an asyncio task in (scaled) real time (SPEC §7).

Modeled time is wall time since start multiplied by `speed`: a batch of modeled
duration `d` occupies `d / speed` wall seconds. Python overhead therefore shows up in
modeled latencies too (scaled by `speed`), which is why a very high speed on a busy
machine inflates them; `lag_s` (modeled seconds the loop fell behind its schedule)
measures that.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from prism_sim.request import SimRequest
from prism_sim.scheduler import Batch, Scheduler

WallClock = Callable[[], float]


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
        self.lag_s = 0.0
        self.current_batch: Batch | None = None

    def now(self) -> float:
        """Modeled seconds since the engine started."""
        return (self.wall_clock() - self._t0) * self.speed

    def submit(self, req: SimRequest) -> None:
        """Queue a request (raises `ValueError` if the scheduler refuses it)."""
        self.scheduler.add_request(req, self.now())
        self._wakeup.set()

    def abort(self, rid: str) -> bool:
        found = self.scheduler.abort(rid, self.now())
        self._wakeup.set()
        return found

    async def run(self) -> None:
        """Run batches forever (cancel the task to stop)."""
        while True:
            batch = self.scheduler.next_batch(self.now())
            if batch is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            self.current_batch = batch
            deadline = self._t0 + (batch.started_s + batch.duration_s) / self.speed
            delay = deadline - self.wall_clock()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.lag_s += -delay * self.speed
                await asyncio.sleep(0)
            self.current_batch = None
            self.scheduler.complete_batch(batch, self.now())

    async def __aenter__(self) -> EngineLoop:
        self._task = asyncio.create_task(self.run(), name="prism-sim-engine")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
