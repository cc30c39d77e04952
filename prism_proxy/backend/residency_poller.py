"""Keeps the proxy's copy of DART's resident segments current (SPEC §2 c_t, §4).

One task polls `GET /prism/residency` every `interval_s` with the generation and version
it holds, so a steady cache answers an empty delta. When the RPC is unreachable,
residency is unknown: the copy is cleared (c_t = 0 for every segment, the paper's QAS)
and the poller backs off like the push sender (0.5 s doubling to 10 s); the next
answer is then a full summary. A delta it cannot apply (another generation) makes it
ask for the full set next time.
"""

from __future__ import annotations

import asyncio

from prism_proxy.backend.control import BACKOFF_MAX_S, BACKOFF_MIN_S, ControlClient
from prism_proxy.qas.residency import ResidentSegments


class ResidencyPoller:
    """Applies the control RPC's residency summaries to `target`."""

    def __init__(
        self, client: ControlClient, target: ResidentSegments, interval_s: float = 0.05
    ) -> None:
        self.client = client
        self.target = target
        self.interval_s = interval_s
        self._want_full = False
        self._backoff_s = 0.0

    @property
    def backoff_s(self) -> float:
        """The pause after the last failed fetch (0 after a success)."""
        return self._backoff_s

    async def poll_once(self) -> bool:
        """One fetch and apply; True if a summary was applied."""
        target = self.target
        if self._want_full:
            generation, since = None, None
        else:
            generation, since = target.generation, target.version
        summary = await self.client.fetch_residency(generation, since)
        if summary is None:
            target.clear()
            self._backoff_s = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, 2 * self._backoff_s))
            return False
        self._backoff_s = 0.0
        try:
            target.apply(summary)
        except ValueError:
            self._want_full = True  # the RPC answered, just not in our terms
            return False
        self._want_full = False
        return True

    async def run(self) -> None:
        """Poll until cancelled (one task per app)."""
        while True:
            await self.poll_once()
            await asyncio.sleep(self._backoff_s or self.interval_s)
