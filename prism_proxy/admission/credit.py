"""Retention earned by returns (sans-IO, SPEC §3): what an account's paused agent
sessions may hold in DART's retention is bounded by what its sessions have shown.

An account is one client's agent type: `(client, head)`, the client as the edge names it
(`edge.accounts.client_key`: its address until API keys arrive) and the head its
sessions share. Per account, two exponentially decaying sums of path tokens (half-life
`half_life_s`):

    returned(a)  tokens of a's paused sessions that came back within their TTL
                 (retained or not: the return is seen by its key either way)
    wasted(a)    tokens of a's retained pauses whose TTL passed without a return

    credit(a) = returned(a) - wasted(a)
    held(a)   = tokens of a's live grants (retained, not back, TTL not passed)

A pause of `tokens` is retained (granted) iff held(a) + tokens <= credit(a). So an
account whose sessions never come back, or a new one, holds nothing: its pauses rank as
LRU would rank them (`sessions.SessionTable` has DART evict them with private pieces).
An account keeps retaining while what it holds is no more than what came back lately,
and every pause it let lapse costs it that much credit: holding tokens for sessions
that never return has to be paid for by as many tokens that did. For agents that do
come back the credit is far above what they hold (returns keep arriving; a held pause
lasts a tool's run), so it does not bind.

Bounded: `max_accounts` accounts (the least recently used forgotten: it starts again at
0, which only takes retention away), and the expiry heap is rebuilt from the live
grants when settled ones pile up.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

Account = tuple[str, str]  # (client, head)

MAX_ACCOUNTS = 4096


@dataclass(slots=True)
class _Balance:
    returned: float = 0.0
    wasted: float = 0.0
    at: float = 0.0  # when the sums were last decayed
    held: int = 0

    def decay(self, now: float, half_life_s: float) -> None:
        if now > self.at:
            factor = 0.5 ** ((now - self.at) / half_life_s)
            self.returned *= factor
            self.wasted *= factor
            self.at = now

    @property
    def credit(self) -> float:
        return self.returned - self.wasted


@dataclass(slots=True, eq=False)
class Grant:
    """One retained pause: `tokens` held by its account until it comes back, is given
    up, or `expires` (then charged as waste). `key`: the paused session's key."""

    key: str
    tokens: int
    expires: float
    balance: _Balance = field(repr=False)
    settled: bool = False

    def live(self, now: float) -> bool:
        return not self.settled and self.expires > now


@dataclass
class RetentionLedger:
    half_life_s: float = 60.0
    max_accounts: int = MAX_ACCOUNTS
    _accounts: OrderedDict[Account, _Balance] = field(default_factory=OrderedDict)
    _expiries: list[tuple[float, int, Grant]] = field(default_factory=list)
    _order: itertools.count = field(default_factory=itertools.count)
    _live: int = 0  # grants not settled
    granted: int = 0
    refused: int = 0

    def __post_init__(self) -> None:
        if self.half_life_s <= 0 or self.max_accounts < 1:
            raise ValueError("half_life_s must be > 0 and max_accounts >= 1")

    def _balance(self, account: Account, now: float) -> _Balance:
        balance = self._accounts.pop(account, None)
        if balance is None:
            balance = _Balance(at=now)
        balance.decay(now, self.half_life_s)
        self._accounts[account] = balance  # the most recently used last
        while len(self._accounts) > self.max_accounts:
            self._accounts.popitem(last=False)
        return balance

    # ---- queries --------------------------------------------------------------------
    def credit(self, account: Account, now: float) -> float:
        balance = self._accounts.get(account)
        if balance is None:
            return 0.0
        balance.decay(now, self.half_life_s)
        return balance.credit

    def held(self, account: Account) -> int:
        balance = self._accounts.get(account)
        return 0 if balance is None else balance.held

    @property
    def live_grants(self) -> int:
        return self._live

    def affords(self, account: Account, tokens: int, now: float) -> bool:
        """Whether a pause of `tokens` would be granted now."""
        return self.held(account) + tokens <= self.credit(account, now)

    # ---- events ---------------------------------------------------------------------
    def grant(
        self, account: Account, key: str, tokens: int, ttl_s: float, now: float
    ) -> Grant | None:
        """A pause of `tokens` at `key`: its grant if the account can hold it, else None."""
        balance = self._balance(account, now)
        if balance.held + tokens > balance.credit or ttl_s <= 0:
            self.refused += 1
            return None
        balance.held += tokens
        grant = Grant(key, tokens, now + ttl_s, balance)
        heapq.heappush(self._expiries, (grant.expires, next(self._order), grant))
        self._live += 1
        self.granted += 1
        if len(self._expiries) > 2 * self._live + 1024:  # settled ones pile up
            self._expiries = [e for e in self._expiries if not e[2].settled]
            heapq.heapify(self._expiries)
        return grant

    def came_back(self, account: Account, tokens: int, in_time: bool, now: float) -> None:
        """A paused session of `tokens` came back (`in_time`: within its TTL)."""
        if in_time:
            self._balance(account, now).returned += tokens

    def settle(self, grant: Grant | None) -> None:
        """The grant ends without a charge: its session came back, or its retention was
        given up early."""
        if grant is not None and not grant.settled:
            grant.settled = True
            grant.balance.held -= grant.tokens
            self._live -= 1

    def expire(self, now: float) -> list[Grant]:
        """Grants whose TTL passed without a return: charged as waste; returned."""
        lapsed: list[Grant] = []
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            grant = heapq.heappop(expiries)[2]
            if grant.settled:
                continue
            self.settle(grant)
            balance = grant.balance
            balance.decay(now, self.half_life_s)
            balance.wasted += grant.tokens
            lapsed.append(grant)
        return lapsed
