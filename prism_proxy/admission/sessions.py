"""Agent sessions as the proxy sees them (sans-IO): which request continues which, when
a session pauses on a tool call, and how long to ask DART to keep its history.

An agent program re-sends its whole history with every model call. The proxy cuts a
chat at its message ends and names each cut by the hash of every token before it
(`prompts.conversation`), so the cut at the end of call k's last message has the same
id in call k + 1, which re-sends those messages. That id is the session's **key**:

    call k      [head | turn | ... | last message k]<gen>      key_k = id at the end
    call k + 1  [head | turn | ... | last message k | call k's tool call | tool output]<gen>
                                                   ^ key_k again: a continuation

Events, in the order they happen to one request:

Every event returns a `Push` for DART's control RPC (owners to retain with a score and
a time-to-live, owners to release):

* `arrive(rid, keys, head, tokens, now)`: `keys` are the request's cut ids. If one of
  them is a paused session's key, the request continues that session: it inherits the
  program's start (for program-level precedence in QAS), the observed return delay
  feeds the head's statistics, and the path is held above every paused one
  (`QUEUED_SCORE`) while the request waits: its next use is the soonest of all. Else a
  new program starts.
* `started(rid, now)`: the first token came back, so the engine has matched and
  extended the path: the hold is released. (Not at dispatch: a request may wait in the
  engine's own queue, where nothing holds its path, and under pressure that is exactly
  when it would be evicted.)
* `finish(rid, tool_call, now)`: an answer that ended in a tool call pauses the session
  under the request's last key: DART keeps the path ending there for the TTL. An answer
  without a tool call ends the session: its own pieces (every cut after its first
  call's, which sessions of one task share) are discarded, evicted before anything
  else: finished sessions go first.

Which paused sessions go first when the pool runs short (`rank`): `recent` scores a
pause by its time, so the longest-paused goes first. With heavy-tailed tool times the
longer a tool has run, the longer it is likely to run on, so this is the order of
expected return; it is LRU among paused sessions, after everything that will not be
used again (finished sessions, generated tokens the template re-renders). `program`
scores by the program's start (older programs kept: Continuum's program-level FCFS).

The time-to-live is the `ttl_quantile` of the return delays observed for the same head
(agent type; late returns included, so the TTL does not censor its own estimate),
within [`min_ttl_s`, `max_ttl_s`], or `default_ttl_s` before `min_samples` delays are
seen. Prompts of fewer than `min_tokens` beyond their head are not retained: their
prefill costs less than holding them. A session that never returns costs its TTL at
most: DART forgets the entry by itself.

Everything is bounded: `max_sessions` paused sessions and requests in flight (the oldest
paused ones dropped first, with their retention released), `DELAY_WINDOW` delays per
head and `MAX_HEADS` heads.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prism_wire import MAX_RETAIN_TTL_S, MAX_RETAINED

DELAY_WINDOW = 256
MAX_HEADS = 1024
# Paused sessions are remembered this many longest TTLs, to observe late returns.
REMEMBER_TTLS = 4
# The score of a continuation's path while it waits in the queue: above every paused
# session's (those are minus a program's start, on a clock that starts near zero or is
# monotonic seconds).
QUEUED_SCORE = 1e15


@dataclass(frozen=True, slots=True)
class SessionParams:
    ttl_quantile: float = 0.9
    min_ttl_s: float = 0.5
    max_ttl_s: float = 60.0
    default_ttl_s: float = 10.0
    min_samples: int = 8
    min_tokens: int = 256
    max_sessions: int = MAX_RETAINED
    rank: str = "recent"  # recent: the latest paused kept first; program: the oldest program

    def __post_init__(self) -> None:
        if not 0.0 < self.ttl_quantile <= 1.0:
            raise ValueError("ttl_quantile must be in (0, 1]")
        if not 0.0 <= self.min_ttl_s <= self.max_ttl_s <= MAX_RETAIN_TTL_S:
            raise ValueError(f"need 0 <= min_ttl_s <= max_ttl_s <= {MAX_RETAIN_TTL_S}")
        if self.rank not in ("recent", "program"):
            raise ValueError("rank: recent or program")
        if self.max_sessions < 1 or self.min_samples < 1:
            raise ValueError("max_sessions and min_samples must be >= 1")


@dataclass(frozen=True, slots=True)
class Push:
    """What to tell DART: owners to retain (`owner -> (score, ttl_s, path tokens)`) and to
    release."""

    retain: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    release: tuple[str, ...] = ()
    discard: tuple[str, ...] = ()  # a finished session's own pieces: evict them first

    def __bool__(self) -> bool:
        return bool(self.retain or self.release or self.discard)


NOTHING = Push()


@dataclass(frozen=True, slots=True)
class Arrival:
    """What `arrive` found: the program's start, whether it continues a paused
    session, and what to push."""

    program_start: float
    continues: bool
    push: Push = NOTHING


@dataclass(slots=True)
class _InFlight:
    keys: tuple[str, ...]
    head: str
    program_start: float
    tokens: int
    own_from: int  # keys[own_from:] are the session's own (after its first call's)
    continued: str | None = None  # the paused key it continues, held while queued

    @property
    def key(self) -> str | None:
        return self.keys[-1] if self.keys else None


@dataclass(slots=True)
class _Paused:
    head: str
    program_start: float
    paused_at: float
    ttl_s: float
    tokens: int
    own_from: int


@dataclass
class SessionTable:
    """Requests in flight by rid; paused sessions by key (several sessions may pause on
    the same prefix: sessions of one task start alike), oldest first."""

    params: SessionParams = field(default_factory=SessionParams)
    _flight: OrderedDict[str, _InFlight] = field(default_factory=OrderedDict)
    _paused: OrderedDict[str, list[_Paused]] = field(default_factory=OrderedDict)
    _delays: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict)
    paused: int = 0
    continued: int = 0
    new_programs: int = 0
    retained: int = 0

    # ---- events ---------------------------------------------------------------------
    def arrive(self, rid: str, keys: Sequence[str], head: str, tokens: int, now: float) -> Arrival:
        """A request with cut ids `keys` (in prompt order) and `tokens` prompt tokens
        beyond its head (what its path holds apart from the head it shares)."""
        found: _Paused | None = None
        continued: str | None = None
        # The longest match, the latest call it continues, short of its own last key: a
        # request that ends where a paused one ended repeats it (another session of the
        # same task), it does not continue it.
        for key in reversed(keys[:-1]):
            sessions = self._paused.get(key)
            if sessions:
                found, continued = self._take(key, sessions), key
                break
        keys = tuple(keys)
        if found is None:
            self.new_programs += 1
            # a first call's pieces may be shared (sessions of one task start alike)
            self._flight[rid] = _InFlight(keys, head, now, tokens, len(keys))
            self._bound_flight()
            return Arrival(now, False)
        # every return is observed, late ones too (paused sessions are remembered past
        # their TTL), or the quantile would only ever see delays below it
        self._observe(found.head, now - found.paused_at)
        self.continued += 1
        self._flight[rid] = _InFlight(
            keys, head, found.program_start, tokens, found.own_from, continued
        )
        self._bound_flight()
        hold = Push({continued: (QUEUED_SCORE, self.params.max_ttl_s, found.tokens)})
        return Arrival(found.program_start, True, hold)

    def started(self, rid: str, now: float) -> Push:
        """The request's first token came back: its path is the engine's again."""
        flight = self._flight.get(rid)
        if flight is None or flight.continued is None:
            return NOTHING
        key, flight.continued = flight.continued, None
        return self._after_leaving(key, now)

    def finish(self, rid: str, tool_call: bool, now: float) -> Push:
        """The request's answer ended (`tool_call`: in a tool call)."""
        flight = self._flight.pop(rid, None)
        if flight is None:
            return NOTHING
        push = self._after_leaving(flight.continued, now) if flight.continued else NOTHING
        if not tool_call:  # the session ended: its own history will not be read again
            own = flight.keys[flight.own_from :]
            return Push(push.retain, push.release, own) if own else push
        if flight.key is None or flight.tokens < self.params.min_tokens:
            return push
        ttl = self.ttl(flight.head)
        paused = _Paused(
            flight.head, flight.program_start, now, ttl, flight.tokens, flight.own_from
        )
        sessions = self._paused.pop(flight.key, [])
        sessions.append(paused)
        self._paused[flight.key] = sessions  # the most recent pause last
        self.paused += 1
        self.retained += 1
        dropped = self._bound_paused()
        retain = {flight.key: (self._score(paused), ttl, flight.tokens)}
        return Push(retain, (*push.release, *(k for k in dropped if k != flight.key)))

    def forget(self, rid: str, now: float) -> Push:
        """The request failed or was withdrawn: no pause follows."""
        flight = self._flight.pop(rid, None)
        if flight is None or flight.continued is None:
            return NOTHING
        return self._after_leaving(flight.continued, now)

    def expire(self, now: float) -> None:
        """Forget paused sessions gone for `REMEMBER_TTLS` x the longest TTL (DART forgot
        their retention at their own TTL already)."""
        horizon = REMEMBER_TTLS * self.params.max_ttl_s
        while self._paused:
            key, sessions = next(iter(self._paused.items()))
            if sessions[-1].paused_at + horizon > now:
                break  # keys are ordered by their latest pause
            del self._paused[key]
            self.paused -= len(sessions)

    # ---- helpers ----------------------------------------------------------------------
    def _take(self, key: str, sessions: list[_Paused]) -> _Paused:
        found = sessions.pop(0)
        self.paused -= 1
        if not sessions:
            del self._paused[key]
        return found

    def _score(self, paused: _Paused) -> float:
        return -paused.program_start if self.params.rank == "program" else paused.paused_at

    def _after_leaving(self, key: str | None, now: float) -> Push:
        """A continuation of `key` no longer needs its hold: release it, or give it back
        to the sessions still paused there."""
        if key is None:
            return NOTHING
        sessions = self._paused.get(key)
        if not sessions:
            return Push(release=(key,))
        latest = sessions[-1]
        left = max(p.paused_at + p.ttl_s for p in sessions) - now
        if left <= 0:
            return Push(release=(key,))
        return Push({key: (self._score(latest), left, latest.tokens)})

    def _bound_flight(self) -> None:
        while len(self._flight) > self.params.max_sessions:
            self._flight.popitem(last=False)

    def _bound_paused(self) -> list[str]:
        """Drop the oldest paused sessions beyond `max_sessions`; the keys left empty."""
        emptied: list[str] = []
        while self.paused > self.params.max_sessions:
            key, sessions = next(iter(self._paused.items()))
            self._take(key, sessions)
            if key not in self._paused:
                emptied.append(key)
        return emptied

    # ---- the TTL --------------------------------------------------------------------
    def ttl(self, head: str) -> float:
        params = self.params
        delays = self._delays.get(head)
        if delays is None or len(delays) < params.min_samples:
            return min(params.default_ttl_s, params.max_ttl_s)
        ordered = sorted(delays)
        index = min(len(ordered) - 1, int(params.ttl_quantile * len(ordered)))
        return min(params.max_ttl_s, max(params.min_ttl_s, ordered[index]))

    def _observe(self, head: str, delay: float) -> None:
        delays = self._delays.pop(head, None)
        if delays is None:
            delays = deque(maxlen=DELAY_WINDOW)
        delays.append(delay)
        self._delays[head] = delays  # most recently seen last
        while len(self._delays) > MAX_HEADS:
            self._delays.popitem(last=False)

    # ---- what the proxy reports ---------------------------------------------------------
    def stats(self) -> dict[str, float | int]:
        return {
            "paused": self.paused,
            "in_flight": len(self._flight),
            "continued": self.continued,
            "new_programs": self.new_programs,
            "retained": self.retained,
        }


RetainPush = Callable[[Push], None]


class SessionKeeper:
    """The proxy's session table with its pushes to DART (`push(retain, release)`, or
    None without a control RPC: continuations are still recognised for QAS). Times come
    from `clock`; every method returns at once."""

    def __init__(
        self,
        params: SessionParams,
        push: RetainPush | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = SessionTable(params)
        self.push = push
        self.clock = clock

    def arrive(self, rid: str, keys: Sequence[str], head: str, tokens: int) -> float | None:
        """A request with cut ids `keys`: its program's start if it continues a paused
        session (None: a new program)."""
        now = self.clock()
        self.table.expire(now)
        found = self.table.arrive(rid, keys, head, tokens, now)
        self._push(found.push)
        return found.program_start if found.continues else None

    def started(self, rid: str) -> None:
        self._push(self.table.started(rid, self.clock()))

    def finish(self, rid: str, tool_call: bool) -> None:
        self._push(self.table.finish(rid, tool_call, self.clock()))

    def forget(self, rid: str) -> None:
        self._push(self.table.forget(rid, self.clock()))

    def _push(self, push: Push) -> None:
        if self.push is not None and push:
            self.push(push)
