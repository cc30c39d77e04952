"""The dispatch-batch priority table with epochs (SPEC §3, §4).

The proxy pushes `{epoch, table: {segment_id: P̂_t}, protect: f}` after each wave.
Epochs increase monotonically; an update whose epoch is not greater than the last
accepted one is stale and rejected. Updates arrive on the control-RPC thread but the
tree belongs to the scheduler thread, so `UpdateInbox` accepts them (deciding
staleness at once, under a lock) and queues them; the scheduler thread drains the
queue between tree operations (`drain`), never in the middle of an eviction.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prism_wire import DEFAULT_PROTECT, MAX_EPOCH, Retention

# F_t's resident tokens stay within this share of the KV pool. A quarter
# leaves three quarters for the running batch (whose paths are locked anyway) and for
# reuse ordered by (class, P̂, last); and it seldom binds in normal use: f = 8 owners
# fill a quarter of a 432k-token pool only at 13.5k resident tokens each on average,
# far above a system prompt or a document. It binds when owners are pathological (a
# head of tens of thousands of tokens, a segment resident on many paths), which is
# exactly when unbounded protection would starve everything else.
DEFAULT_PROTECT_FRACTION = 0.25
# R_t's path tokens stay within this share of the pool: agents' paused histories may take
# most of it (that is their purpose), never all of it.
DEFAULT_RETAIN_FRACTION = 0.75
# How a host tier (SGLang's HiCache) orders what it drops: "dart" ranks a host copy by
# the owner its node had on the device (what DART keeps stays on host longest); "lru"
# by last access alone, as without DART. Measured: docs/results/agent-step-call, "DART
# orders the host tier too".
HOST_ORDERS = ("dart", "lru")
DEFAULT_HOST_ORDER = "dart"


class StaleEpochError(ValueError):
    """The update's epoch is not greater than the last accepted one."""

    def __init__(self, epoch: int, current: int) -> None:
        super().__init__(f"stale epoch {epoch}: already at {current}")
        self.epoch = epoch
        self.current = current


@dataclass(frozen=True, slots=True)
class PriorityUpdate:
    """One push from the proxy: P̂_t per segment and the protection budget f."""

    epoch: int
    table: Mapping[str, float]
    protect: int = DEFAULT_PROTECT

    def __post_init__(self) -> None:
        if not 0 <= self.epoch <= MAX_EPOCH:
            raise ValueError(f"epoch must be in [0, {MAX_EPOCH}]")
        if self.protect < 0:
            raise ValueError("protect must be >= 0")
        for seg, score in self.table.items():
            if not math.isfinite(score):
                raise ValueError(f"priority of {seg!r} must be finite")
        object.__setattr__(self, "table", MappingProxyType(dict(self.table)))


@dataclass(frozen=True, slots=True)
class Reset:
    """Forget the table (DART then orders like LRU) and the epoch."""


@dataclass
class UpdateInbox:
    """Thread-safe queue of accepted updates, drained by the tree's owner thread."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pending: list[PriorityUpdate | Retention | Reset] = field(default_factory=list)
    _accepted_epoch: int | None = None

    @property
    def accepted_epoch(self) -> int | None:
        with self._lock:
            return self._accepted_epoch

    def submit(self, update: PriorityUpdate) -> None:
        """Queue `update`; raises `StaleEpochError` if its epoch is not new."""
        with self._lock:
            if self._accepted_epoch is not None and update.epoch <= self._accepted_epoch:
                raise StaleEpochError(update.epoch, self._accepted_epoch)
            self._accepted_epoch = update.epoch
            self._pending.append(update)

    def submit_retain(self, retention: Retention) -> None:
        """Queue `retention` (no epoch: one proxy's words apply in the order they come)."""
        with self._lock:
            self._pending.append(retention)

    def submit_reset(self) -> None:
        with self._lock:
            self._accepted_epoch = None
            self._pending.append(Reset())

    def drain(self) -> list[PriorityUpdate | Retention | Reset]:
        """Everything accepted since the last drain, oldest first."""
        with self._lock:
            pending, self._pending = self._pending, []
        return pending
