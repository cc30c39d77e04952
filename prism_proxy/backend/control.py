"""Client of DART's control RPC: pushes P̂_t after each wave and reads residency
summaries (SPEC §3, §4).

`push(table)` never blocks and never raises: it replaces the pending table and wakes
one sender task, so at most one request is in flight and only the newest table is sent
(a slow or dead endpoint cannot pile up work). Epochs increase monotonically, also
across proxy restarts (they start from the wall clock in milliseconds). A 409 (stale
epoch: another proxy, or a push from elsewhere, got ahead) is a failure: it is counted
and logged, and the client resynchronises: it jumps past the RPC's current epoch and
sends the same table again, or, when no epoch is left above it, resets the RPC's table
first. After any other failure the sender backs off (0.5 s doubling to 10 s) and skips
the tables in between; the newest is sent next.

`retain(entries, release)` never blocks either: it merges into the pending retention
delta (a later word on an owner replaces an earlier one), which the same sender posts to
`POST /prism/retain` after the table. Retention is best effort: a failed post is counted
and dropped, and DART's TTLs forget whatever it said before.

`fetch_residency(generation, since)` reads `GET /prism/residency` (polled by
`residency_poller.ResidencyPoller`). It returns None on any failure and touches no
metric: `control_up` and the failure counter keep describing the pushes (a dead RPC
shows there at the next wave), and polls many times a second must not flap them. Its
log says "unreachable" once per outage (warning) and "back" once (info).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import orjson

from prism_proxy.metrics import ProxyMetrics
from prism_wire import (
    MAX_EPOCH,
    MAX_RETAINED,
    RPC_PRIORITIES,
    RPC_RESET,
    RPC_RESIDENCY,
    RPC_RETAIN,
    ResidencySummary,
    Retention,
)

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.5
RELEASE, DISCARD = "release", "discard"  # pending retention words besides an entry
BACKOFF_MAX_S = 10.0


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
        # owner -> its latest word: (score, ttl_s, path tokens), RELEASE or DISCARD
        self._retention: dict[str, tuple[float, float, int | None] | str] = {}
        self._wakeup = asyncio.Event()
        self._backoff_s = 0.0
        self._residency_ok = True

    def push(self, table: dict[str, float]) -> None:
        """Queue the newest table (replacing an unsent one); returns at once."""
        self._pending = table
        self._wakeup.set()

    def retain(self, retention: Retention) -> None:
        """Queue `retention` (merged with unsent words, the latest about an owner
        winning); returns at once."""
        pending = self._retention
        for owner in retention.release:
            pending[owner] = RELEASE
        pending.update(retention.retain)
        for owner in retention.discard:
            pending[owner] = DISCARD
        while len(pending) > MAX_RETAINED:  # an RPC down for long: the oldest words go
            del pending[next(iter(pending))]
        self._wakeup.set()

    async def run(self) -> None:
        """Sender loop (one task per app)."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            table, self._pending = self._pending, None
            words, self._retention = self._retention, {}
            ok = True
            if words:
                ok = await self._send_retention(words)
            if table is not None:
                ok = await self._send(table) and ok
            elif not words:
                continue
            if ok:
                self._backoff_s = 0.0
            else:
                self._backoff_s = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, 2 * self._backoff_s))
                await asyncio.sleep(self._backoff_s)

    async def _send(self, table: dict[str, float]) -> bool:
        status, answer = await self._post_table(table)
        if status == 409:
            current = answer.get("current_epoch") if isinstance(answer, dict) else None
            self._failed(f"epoch {self.epoch} rejected as stale (RPC at {current})")
            if not await self._resync(current):
                return False
            status, answer = await self._post_table(table)
        if status == 200:
            self.metrics.control_pushes.inc()
            self.metrics.control_up.set(1)
            return True
        return False if status is None else self._failed(f"HTTP {status}")

    async def _send_retention(
        self, words: dict[str, tuple[float, float, int | None] | str]
    ) -> bool:
        retention = Retention(
            {o: e for o, e in words.items() if not isinstance(e, str)},
            tuple(o for o, e in words.items() if e == RELEASE),
            tuple(o for o, e in words.items() if e == DISCARD),
        )
        status, _ = await self._call(RPC_RETAIN, retention.as_dict())
        if status == 200:
            return True
        return False if status is None else self._failed(f"retain: HTTP {status}")

    async def _post_table(self, table: dict[str, float]) -> tuple[int | None, Any]:
        """One push with the next epoch: (status, JSON answer); (None, None) when the
        RPC could not be reached (already counted as a failure)."""
        self.epoch += 1
        # `prism_wire.PriorityBody`'s fields, which the RPC validates; built as a dict, as
        # model_dump would copy the table (30 us for 500 segments) on every push.
        body = {"epoch": self.epoch, "table": table, "protect": self.protect}
        return await self._call(RPC_PRIORITIES, body)

    async def _call(self, path: str, body: dict[str, Any]) -> tuple[int | None, Any]:
        try:
            async with self.session.post(
                self.url + path, json=body, headers=self.headers, timeout=self.timeout
            ) as response:
                data = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            return None, None
        try:
            return status, orjson.loads(data)
        except orjson.JSONDecodeError:
            return status, None

    async def _resync(self, current: Any) -> bool:
        """Move past the RPC's epoch; if none is left above it, reset the RPC's table
        (which forgets its epoch) and start again from the wall clock, as a new proxy."""
        if isinstance(current, int) and not isinstance(current, bool) and current < MAX_EPOCH:
            self.epoch = max(self.epoch, current)
            return True
        status, _ = await self._call(RPC_RESET, {})
        if status != 200:
            return False if status is None else self._failed(f"reset: HTTP {status}")
        self.epoch = int(time.time() * 1000)
        return True

    def _failed(self, reason: str) -> bool:
        self.metrics.control_failures.inc()
        self.metrics.control_up.set(0)
        log.warning("control RPC push to %s failed (%s); serving on", self.url, reason)
        return False

    async def fetch_residency(
        self, generation: str | None, since: int | None
    ) -> ResidencySummary | None:
        """`GET /prism/residency`: a delta since `since` of `generation`, or the full
        set when the RPC cannot answer one. None on any failure (see the module doc)."""
        params: dict[str, str] = {}
        if generation is not None:
            params["generation"] = generation
        if since is not None:
            params["since"] = str(since)
        try:
            async with self.session.get(
                self.url + RPC_RESIDENCY,
                params=params,
                headers=self.headers,
                timeout=self.timeout,
            ) as response:
                data = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return self._residency_failed(f"{type(exc).__name__}: {exc}")
        if status != 200:
            return self._residency_failed(f"HTTP {status}")
        try:
            summary = ResidencySummary.from_json(data)
        except ValueError as exc:
            return self._residency_failed(f"malformed answer: {str(exc)[:300]}")
        if not self._residency_ok:
            self._residency_ok = True
            log.info("control RPC residency at %s is back", self.url)
        return summary

    def _residency_failed(self, reason: str) -> None:
        level = logging.WARNING if self._residency_ok else logging.DEBUG
        self._residency_ok = False
        log.log(level, "control RPC residency at %s unreachable (%s)", self.url, reason)
        return None
