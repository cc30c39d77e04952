"""Each client's grammars new to the engine (`edge.structured`): which grammars the
engine has compiled, and per client the requests in flight carrying a new one and the
new ones introduced within the last minute. Pure bookkeeping, time passed in."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

WINDOW_S = 60.0  # the span of `max_client_grammars_per_minute`
KNOWN_GRAMMARS = 16_384  # digests of grammars the engine compiled (LRU, 16 bytes each)
MAX_CLIENTS = 65_536  # clients with a grammar in flight or introduced within the window


@dataclass(slots=True)
class _Client:
    compiling: int = 0  # its requests in flight with a new grammar
    introduced: deque[float] = field(default_factory=deque)  # when, within the window


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request's new grammar must wait, and how long before a retry may pass."""

    message: str
    retry_after_s: float


class GrammarLedger:
    """Which grammars the engine has compiled, and each client's new ones: in flight,
    and introduced within the last `WINDOW_S`. Bounded: `KNOWN_GRAMMARS` digests, and a
    client's entry lives only while it has a grammar in flight or within the window
    (at most `MAX_CLIENTS` such clients; beyond, new grammars of others wait)."""

    def __init__(self, max_compiles: int, max_per_window: int) -> None:
        self.max_compiles = max_compiles
        self.max_per_window = max_per_window
        self._known: OrderedDict[bytes, None] = OrderedDict()
        # new grammars with a request in flight, and how many (bounded by those requests)
        self._compiling: dict[bytes, int] = {}
        self._clients: dict[str, _Client] = {}
        self._swept_at = 0  # table size after the last sweep

    def __len__(self) -> int:
        """Clients tracked."""
        return len(self._clients)

    def compiling(self, client: str) -> int:
        """`client`'s requests in flight with a new grammar."""
        entry = self._clients.get(client)
        return 0 if entry is None else entry.compiling

    def being_compiled(self, key: bytes) -> bool:
        """Whether a request carrying `key`, new to the engine, is in flight."""
        return key in self._compiling

    def new(self, keys: Sequence[bytes]) -> list[bytes]:
        """The keys the engine has not compiled (as far as the proxy saw)."""
        return [key for key in keys if key not in self._known]

    def admit(self, client: str, new: Sequence[bytes], now: float) -> Refusal | None:
        """Take a slot for a request of `client` carrying the `new` grammars (non-empty),
        or say why not. On success the caller must call `finish` once."""
        entry = self._clients.get(client)
        if entry is None:
            if len(self._clients) >= MAX_CLIENTS:
                self._sweep(now)
            if len(self._clients) >= MAX_CLIENTS:
                return Refusal("too many clients are introducing grammars; retry later", 1.0)
            entry = self._clients[client] = _Client()
        _expire(entry.introduced, now)
        if entry.compiling >= self.max_compiles:
            return Refusal(
                f"this client already has {entry.compiling} requests in flight whose grammar "
                f"the engine is compiling (max_client_grammar_compiles: {self.max_compiles})",
                1.0,
            )
        if len(entry.introduced) + len(new) > self.max_per_window:
            wait_s = entry.introduced[0] + WINDOW_S - now if entry.introduced else WINDOW_S
            self._forget_if_idle(client, entry)
            return Refusal(
                f"this client introduced {len(entry.introduced)} grammars new to the engine "
                f"within {WINDOW_S:g} s (max_client_grammars_per_minute: "
                f"{self.max_per_window})",
                max(1.0, wait_s),
            )
        entry.compiling += 1
        entry.introduced.extend(now for _ in new)
        for key in new:
            self._compiling[key] = self._compiling.get(key, 0) + 1
        if len(self._clients) > 2 * max(self._swept_at, 1024):
            self._sweep(now)
        return None

    def finish(self, client: str, new: Sequence[bytes], compiled: bool, now: float) -> None:
        """The request admitted by `admit` is over; `compiled`: the engine answered it
        (so it compiled its grammars, which are cheap from now on)."""
        entry = self._clients.get(client)
        if entry is not None:
            entry.compiling -= 1
            _expire(entry.introduced, now)
            self._forget_if_idle(client, entry)
        for key in new:
            left = self._compiling.pop(key, 1) - 1
            if left > 0:
                self._compiling[key] = left
        if compiled:
            for key in new:
                self._known[key] = None
                self._known.move_to_end(key)
            while len(self._known) > KNOWN_GRAMMARS:
                self._known.popitem(last=False)

    def _forget_if_idle(self, client: str, entry: _Client) -> None:
        if entry.compiling == 0 and not entry.introduced:
            del self._clients[client]

    def _sweep(self, now: float) -> None:
        """Drop the clients with nothing in flight and nothing within the window."""
        for client, entry in list(self._clients.items()):
            _expire(entry.introduced, now)
            self._forget_if_idle(client, entry)
        self._swept_at = len(self._clients)


def _expire(introduced: deque[float], now: float) -> None:
    while introduced and introduced[0] <= now - WINDOW_S:
        introduced.popleft()
