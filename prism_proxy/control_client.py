"""Client of DART's control RPC: pushes P̂_t after each wave (SPEC §3, §4).

`push(table)` never blocks and never raises: it replaces the pending table and wakes
one sender task, so at most one request is in flight and only the newest table is sent
(a slow or dead endpoint cannot pile up work). Epochs increase monotonically, also
across proxy restarts (they start from the wall clock in milliseconds), so the plugin's
"stale epoch" check never rejects a fresh proxy. After a failure the sender backs off
(0.5 s doubling to 10 s) and skips the tables in between; the newest is sent next.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from prism_proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

_BACKOFF_MIN_S = 0.5
_BACKOFF_MAX_S = 10.0


class ControlClient:
    """Sends `{epoch, table, protect}` to `POST {url}/prism/priorities`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        *,
        token: str | None,
        protect: int,
        metrics: ProxyMetrics,
        timeout_s: float = 2.0,
    ) -> None:
        self.session = session
        self.url = url.rstrip("/")
        self.protect = protect
        self.metrics = metrics
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.epoch = int(time.time() * 1000)
        self._pending: dict[str, float] | None = None
        self._wakeup = asyncio.Event()
        self._backoff_s = 0.0

    def push(self, table: dict[str, float]) -> None:
        """Queue the newest table (replacing an unsent one); returns at once."""
        self._pending = table
        self._wakeup.set()

    async def run(self) -> None:
        """Sender loop (one task per app)."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            table, self._pending = self._pending, None
            if table is None:
                continue
            ok = await self._send(table)
            if ok:
                self._backoff_s = 0.0
            else:
                self._backoff_s = min(_BACKOFF_MAX_S, max(_BACKOFF_MIN_S, 2 * self._backoff_s))
                await asyncio.sleep(self._backoff_s)

    async def _send(self, table: dict[str, float]) -> bool:
        self.epoch += 1
        body = {"epoch": self.epoch, "table": table, "protect": self.protect}
        try:
            async with self.session.post(
                self.url + "/prism/priorities", json=body, headers=self.headers,
                timeout=self.timeout,
            ) as response:  # fmt: skip
                await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._failed(f"{type(exc).__name__}: {exc}")
        if status == 200:
            self.metrics.control_pushes.inc()
            self.metrics.control_up.set(1)
            return True
        if status == 409:  # stale epoch: another proxy pushed newer; not an outage
            log.debug("control RPC rejected epoch %d as stale", self.epoch)
            self.metrics.control_up.set(1)
            return True
        return self._failed(f"HTTP {status}")

    def _failed(self, reason: str) -> bool:
        self.metrics.control_failures.inc()
        self.metrics.control_up.set(0)
        log.warning("control RPC push to %s failed (%s); serving on", self.url, reason)
        return False
