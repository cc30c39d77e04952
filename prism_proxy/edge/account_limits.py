"""Per-account limits on admission: in flight, queued, tokens per minute (issue 36).

* **In flight** (`max_inflight`): the account's requests accepted and not yet
  answered, queued or at the engine.
* **Queued** (`max_queued`): those of them still waiting in QAS for release.
* **Tokens per minute** (`tokens_per_minute`): prompt plus completion tokens of the
  account's answers (their usage), as a token bucket that holds a minute's worth and
  refills continuously. A request is admitted while the bucket is not empty; its
  tokens are charged when its answer ends (they are not known before), so the bucket
  may go below zero, and the account then waits until it refills.

A request over a limit is refused before it holds anything (429 with Retry-After):
over in flight or tokens per minute as soon as its headers are in
(`accounts.account_middleware`, before its body is read or tokenized, so a flood's
refusals cost the proxy little), over queued when it would enter QAS (`edge.admit`).
Each limit is the account's own (`KeyLimits`, from the key file) or the deployment's
default; 0 means none.

`AccountUsage` is a sans-IO table (the caller passes `now`); an account is dropped
from it when it holds nothing and its bucket is full again, so the table is bounded by
the accounts active within the last minute; beyond `MAX_ACCOUNTS` at once, idle
accounts are swept first.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

MAX_ACCOUNTS = 65_536
WINDOW_S = 60.0  # tokens_per_minute


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits in effect for one account (0: none)."""

    max_inflight: int = 0
    max_queued: int = 0
    tokens_per_minute: int = 0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused, and when to try again (whole seconds)."""

    message: str
    retry_after_s: int
    limit: str  # the setting that refused it: max_inflight, max_queued, tokens_per_minute


@dataclass(slots=True)
class _Use:
    open: int = 0  # accepted, not answered
    queued: int = 0  # of those, waiting for release
    level: float = math.nan  # tokens left in the bucket (NaN: full, not yet used)
    at: float = 0.0  # when `level` was last brought up to date
    capacity: int = 0  # the bucket's size (tokens_per_minute) when last used


class AccountUsage:
    """What each account holds and has used. A request `open`s when it arrives (in
    flight, tokens per minute checked), `queue`s when it enters QAS (queued checked),
    `unqueue`s when released or withdrawn, and `close`s when answered."""

    def __init__(self) -> None:
        self._use: dict[str, _Use] = {}

    def _get(self, account: str, now: float) -> _Use:
        use = self._use.get(account)
        if use is None:
            if len(self._use) >= MAX_ACCOUNTS:
                self._sweep(now)
            use = self._use[account] = _Use()
        return use

    def open(
        self, account: str, limits: Limits, now: float, retry_after_s: int = 1
    ) -> Refusal | None:
        """Count a new request of `account` in flight, or say why it is refused
        (`retry_after_s` over the count; the refill time over tokens per minute)."""
        use = self._get(account, now)
        if limits.max_inflight and use.open >= limits.max_inflight:
            return Refusal(
                f"this API key has {use.open} requests in flight, its limit "
                f"(max_inflight {limits.max_inflight})",
                retry_after_s,
                "max_inflight",
            )
        if limits.tokens_per_minute:
            level = self._refill(use, limits.tokens_per_minute, now)
            if level <= 0:
                rate = limits.tokens_per_minute / WINDOW_S
                wait_s = max(1, math.ceil((1 - level) / rate))
                return Refusal(
                    f"this API key used its tokens per minute (tokens_per_minute "
                    f"{limits.tokens_per_minute}); retry in {wait_s} s",
                    wait_s,
                    "tokens_per_minute",
                )
        use.open += 1
        return None

    def queue(
        self, account: str, limits: Limits, now: float, retry_after_s: int = 1
    ) -> Refusal | None:
        """Count a request of `account` as waiting in QAS, or say why it may not."""
        use = self._get(account, now)
        if limits.max_queued and use.queued >= limits.max_queued:
            return Refusal(
                f"this API key has {use.queued} requests queued, its limit "
                f"(max_queued {limits.max_queued})",
                retry_after_s,
                "max_queued",
            )
        use.queued += 1
        return None

    def unqueue(self, account: str, now: float) -> None:
        """A queued request of `account` was released, or withdrawn."""
        use = self._use.get(account)
        if use is not None:
            use.queued = max(0, use.queued - 1)
            self._forget_if_idle(account, use, now)

    def close(self, account: str, now: float) -> None:
        """A request of `account` ended (answered, refused or failed)."""
        use = self._use.get(account)
        if use is not None:
            use.open = max(0, use.open - 1)
            self._forget_if_idle(account, use, now)

    def charge(self, account: str, tokens: int, tokens_per_minute: int, now: float) -> None:
        """`account`'s answer used `tokens` (prompt + completion)."""
        if tokens_per_minute <= 0 or tokens <= 0:
            return
        use = self._use.get(account)
        if use is None:
            use = self._use[account] = _Use()
        use.level = self._refill(use, tokens_per_minute, now) - tokens
        use.capacity = tokens_per_minute
        self._forget_if_idle(account, use, now)

    def holding(self, account: str) -> tuple[int, int]:
        """(in flight, queued) of `account`."""
        use = self._use.get(account)
        return (0, 0) if use is None else (use.open, use.queued)

    def holdings(self) -> Iterator[tuple[str, int, int]]:
        """(account, in flight, queued) of every account the table holds (at most
        `MAX_ACCOUNTS`)."""
        for account, use in self._use.items():
            yield account, use.open, use.queued

    def __len__(self) -> int:
        return len(self._use)

    @staticmethod
    def _refill(use: _Use, tokens_per_minute: int, now: float) -> float:
        if math.isnan(use.level):
            use.level, use.at = float(tokens_per_minute), now
            return use.level
        rate = tokens_per_minute / WINDOW_S
        use.level = min(float(tokens_per_minute), use.level + rate * max(0.0, now - use.at))
        use.at = now
        return use.level

    def _forget_if_idle(self, account: str, use: _Use, now: float) -> None:
        if use.open or use.queued:
            return
        if math.isnan(use.level):
            del self._use[account]
            return
        refilled = use.level + use.capacity / WINDOW_S * max(0.0, now - use.at)
        if refilled >= use.capacity:
            del self._use[account]

    def _sweep(self, now: float) -> None:
        for account, use in list(self._use.items()):
            self._forget_if_idle(account, use, now)
