"""Agent sessions as the proxy sees them (sans-IO): which request continues which, when
a session pauses on a tool call, and how long to ask DART to keep its history.

An agent program re-sends its whole history with every model call. The proxy cuts a
chat at its message ends and names each cut by the hash of every token before it
(`prompts.conversation`), so the cut at the end of call k's last message has the same
id in call k + 1, which re-sends those messages. That id is the session's **key**:

    call k      [head | turn | ... | last message k]<gen>      key_k = id at the end
    call k + 1  [head | turn | ... | last message k | call k's tool call | tool output]<gen>
                                                   ^ key_k again: a continuation

Events, in the order they happen to one request, each returning the `prism_wire.Retention`
to send DART's control RPC (owners to retain with a score and a time-to-live, to release,
to discard):

* `arrive(rid, keys, head, tokens, now)`: `keys` are the request's cut ids. If one of
  them is a paused session's key, the request continues that session: it inherits the
  program's start (for program-level precedence in QAS), the observed return delay
  feeds the head's statistics, and the path is held above every paused one
  (`QUEUED_SCORE`) while the request waits: its next use is the soonest of all. Else a
  new program starts.
* `started(rid, now)`: the first token came back, so the engine has matched and
  extended the path: the hold is released (not at dispatch: in the engine's own queue
  nothing holds the path, and under pressure that is when it would be evicted).
* `calling(rid, now, tools)`: the stream shows the answer becoming a tool call. With
  `retain_from` "call" the request's own key is retained from here, with the score its
  pause will have, until `finish` says what becomes of it: the engine frees a finished
  request's path at once, and under pressure evicts it before the proxy has read the
  answer's end (a hop later). With "end" (the default) nothing happens here.
* `finish(rid, tool_call, now, tools)`: an answer that ended in a tool call pauses the
  session under the request's last key: DART keeps the path ending there for the TTL,
  if the session's account has earned it (below). An answer without a tool call ends
  the session: its own pieces (every cut after its first call's, which sessions of one
  task share) and its last message are discarded: finished sessions go first.

**Retention is earned** (`credit.RetentionLedger`, SPEC §3). A session's account is its
client (`client` of `arrive`: the edge's `client_key`) and its head. A pause is
retained only while the tokens the account's retained pauses hold stay within the tokens
of its sessions that came back within their TTL lately, less those it let lapse. A pause
that is not retained, like a short one and a finished session, is **discarded**: the
session cut gave its last message an id (without sessions it is a private piece), and
that id must not rank it above another client's private pieces, so it goes with them,
by last access, as LRU would order it; so do its own earlier pieces. A request whose
account could not retain its pause has its pieces discarded when it arrives, so that
they never rank as segments, not even between its end and DART hearing of it. A key
that several sessions paused on (sessions of one task start alike) is retained while
any of them holds a live grant, whoever else paused there: another client's unearned
pause never takes it away.

Which paused sessions go first when the pool runs short (`rank`), all after what will
not be used again (finished sessions, generated tokens the template re-renders):
`recent` scores a pause by its time, so the longest-paused goes first (LRU among paused
sessions; with heavy-tailed tool times, the longer a tool has run, the longer it is
likely to run on). `program` scores by the program's start (Continuum's program-level
FCFS). `predicted` scores by when the session is expected back: its pause time plus the
median return delay for its agent type and the tools its answer called
(`returns.ReturnModel`), so a lookup's pause outranks a hand-off to a person.

The time-to-live is the `ttl_quantile` of the return delays observed for the same head
(agent type; late returns included, so the TTL does not censor its own estimate),
within [`min_ttl_s`, `max_ttl_s`], or `default_ttl_s` before `min_samples` delays are
seen; with `predicted`, that quantile of the return model's fit for the head and tools.
Prompts of fewer than `min_tokens` beyond their head are not retained: their prefill
costs less than holding them. A session that never returns costs its TTL at most.

Everything is bounded: `max_sessions` paused sessions and requests in flight (the oldest
paused ones dropped first, with their retention released), the delays (`returns`) and
the ledger's `MAX_ACCOUNTS` accounts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from prism_proxy.admission.credit import Account, Grant, RetentionLedger
from prism_proxy.admission.reprefill import Pause
from prism_proxy.admission.returns import ANY_TOOL, HeadDelays, ReturnModel, tool_key
from prism_wire import MAX_RETAIN_TTL_S, MAX_RETAINED, NO_RETENTION, Retention

# Paused sessions are remembered this many longest TTLs, to observe late returns.
REMEMBER_TTLS = 4
# The score of a continuation's path while it waits in the queue: above every paused
# session's (times or minus times, on a clock near zero or monotonic seconds).
QUEUED_SCORE = 1e15


RANKS = ("recent", "program", "predicted")
# When a paused session's retention is first asked: at the answer's `end`, or at its
# tool `call` (when the stream first shows one; held until the end says how it went).
RETAIN_FROM = ("call", "end")


@dataclass(frozen=True, slots=True)
class SessionParams:
    ttl_quantile: float = 0.9
    min_ttl_s: float = 0.5
    max_ttl_s: float = 60.0
    default_ttl_s: float = 10.0
    min_samples: int = 8
    min_tokens: int = 256
    max_sessions: int = MAX_RETAINED
    # recent: the latest paused kept first; program: the oldest program; predicted: the
    # one expected back soonest
    rank: str = "recent"
    credit_half_life_s: float = 60.0  # how long returns count towards retention (`credit`)
    retain_from: str = "end"  # one of RETAIN_FROM

    def __post_init__(self) -> None:
        if not 0.0 < self.ttl_quantile <= 1.0:
            raise ValueError("ttl_quantile must be in (0, 1]")
        if not 0.0 <= self.min_ttl_s <= self.max_ttl_s <= MAX_RETAIN_TTL_S:
            raise ValueError(f"need 0 <= min_ttl_s <= max_ttl_s <= {MAX_RETAIN_TTL_S}")
        if self.rank not in RANKS:
            raise ValueError(f"rank: one of {', '.join(RANKS)}")
        if self.max_sessions < 1 or self.min_samples < 1:
            raise ValueError("max_sessions and min_samples must be >= 1")
        if self.credit_half_life_s <= 0 or self.default_ttl_s <= 0:
            raise ValueError("credit_half_life_s and default_ttl_s must be > 0")
        if self.retain_from not in RETAIN_FROM:
            raise ValueError(f"retain_from: one of {', '.join(RETAIN_FROM)}")


@dataclass(frozen=True, slots=True)
class Arrival:
    """What `arrive` found: the program's start, whether it continues a paused
    session, what to tell DART, and the pause it continues (for `reprefill`'s accounting)."""

    program_start: float
    continues: bool
    retention: Retention = NO_RETENTION
    pause: Pause | None = None


@dataclass(slots=True)
class _InFlight:
    keys: tuple[str, ...]
    account: Account
    program_start: float
    tokens: int
    own_from: int  # keys[own_from:] are the session's own (after its first call's)
    continued: str | None = None  # the paused key it continues, held while queued
    calling_at: float | None = None  # when `calling` held its own key (its answer a call)

    @property
    def key(self) -> str | None:
        return self.keys[-1] if self.keys else None

    @property
    def head(self) -> str:
        return self.account[1]

    def own(self) -> tuple[str, ...]:
        """The pieces only this session has: its own, and its last message's."""
        own = self.keys[self.own_from :]
        if self.keys and not own:
            own = self.keys[-1:]
        return own


@dataclass(slots=True)
class _Paused:
    account: Account
    program_start: float
    paused_at: float
    ttl_s: float
    tokens: int
    own_from: int
    grant: Grant | None  # None: the account had not earned its retention
    tool: str = ANY_TOOL  # the tools its answer called (`returns.tool_key`)
    expected_back: float = 0.0  # paused_at + the predicted return delay
    held_at: float = 0.0  # when its retention was first asked (`calling`, else paused_at)

    @property
    def head(self) -> str:
        return self.account[1]


@dataclass
class SessionTable:
    """Requests in flight by rid; paused sessions by key (several sessions may pause on
    the same prefix: sessions of one task start alike), oldest first."""

    params: SessionParams = field(default_factory=SessionParams)
    _flight: OrderedDict[str, _InFlight] = field(default_factory=OrderedDict)
    _paused: OrderedDict[str, list[_Paused]] = field(default_factory=OrderedDict)
    delays: HeadDelays = field(default_factory=HeadDelays)
    ledger: RetentionLedger = field(init=False)
    returns: ReturnModel = field(init=False)
    paused: int = 0
    continued: int = 0
    new_programs: int = 0
    retained: int = 0
    unearned: int = 0

    def __post_init__(self) -> None:
        self.ledger = RetentionLedger(self.params.credit_half_life_s)
        self.returns = ReturnModel(prior_s=self.params.default_ttl_s)

    # ---- events ---------------------------------------------------------------------
    def arrive(
        self, rid: str, keys: Sequence[str], head: str, tokens: int, now: float, client: str = ""
    ) -> Arrival:
        """A request from `client` with cut ids `keys` (in prompt order) and `tokens`
        prompt tokens beyond its head (what its path holds apart from the head it
        shares)."""
        self.ledger.expire(now)
        account = (client, head)
        found: _Paused | None = None
        continued: str | None = None
        # The longest match, the latest call it continues, short of its own last key: a
        # request that ends where a paused one ended repeats it (another session of the
        # same task), it does not continue it. A request continues only a session its
        # own client paused (the oldest there): another's return is not this one's.
        for key in reversed(keys[:-1]):
            sessions = self._paused.get(key)
            mine = [i for i, p in enumerate(sessions or ()) if p.account[0] == client]
            if sessions and mine:
                found, continued = self._take(key, sessions, mine[0]), key
                break
        keys = tuple(keys)
        if found is None:
            self.new_programs += 1
            # a first call's pieces may be shared (sessions of one task start alike)
            flight = _InFlight(keys, account, now, tokens, len(keys))
            self._flight[rid] = flight
            dropped = self._bound_flight(now)
            return Arrival(now, False, dropped + self._unearned(flight, now))
        # every return is observed, late ones too (paused sessions are remembered past
        # their TTL), or the quantile would only ever see delays below it
        delay = now - found.paused_at
        self.delays.observe(found.head, delay)
        self.returns.observe(found.head, found.tool, delay)
        self.ledger.came_back(found.account, found.tokens, delay <= found.ttl_s, now)
        self.ledger.settle(found.grant)
        self.continued += 1
        flight = _InFlight(keys, account, found.program_start, tokens, found.own_from, continued)
        self._flight[rid] = flight
        dropped = self._bound_flight(now)
        hold = Retention({continued: (QUEUED_SCORE, self.params.max_ttl_s, found.tokens)})
        pause = Pause(
            continued, found.paused_at, found.ttl_s, found.grant is not None, found.held_at
        )
        retention = dropped + hold + self._unearned(flight, now)
        return Arrival(found.program_start, True, retention, pause)

    def started(self, rid: str, now: float) -> Retention:
        """The request's first token came back: its path is the engine's again."""
        self.ledger.expire(now)
        flight = self._flight.get(rid)
        if flight is None or flight.continued is None:
            return NO_RETENTION
        key, flight.continued = flight.continued, None
        return self._key_state(key, now)

    def calling(self, rid: str, now: float, tools: Sequence[str] = ()) -> Retention:
        """The request's answer is becoming a tool call (the stream shows one; `tools`:
        the names seen so far). With `retain_from` "call", its path is retained from now
        with the score its pause will have, so that it is held when the engine frees it,
        a hop before `finish` reaches the proxy; `finish` (or `forget`) then says what
        becomes of it and for how long. Until then it is held for `max_ttl_s`: the rest
        of the answer may take longer than the pause's own TTL. Nothing for an account
        that could not retain the pause now, or a prompt too short to keep."""
        self.ledger.expire(now)
        flight = self._flight.get(rid)
        if (
            self.params.retain_from != "call"
            or flight is None
            or flight.calling_at is not None
            or flight.key is None
            or flight.tokens < self.params.min_tokens
            or not self.ledger.affords(flight.account, flight.tokens, now)
        ):
            return NO_RETENTION
        flight.calling_at = now
        tool = tool_key(tools)
        ttl = self.ttl(flight.head, tool)
        would = _Paused(flight.account, flight.program_start, now, ttl, flight.tokens,
                        flight.own_from, None, tool,
                        now + self.returns.predict(flight.head, tool))  # fmt: skip
        return Retention({flight.key: (self._score(would), self.params.max_ttl_s, flight.tokens)})

    def finish(self, rid: str, tool_call: bool, now: float, tools: Sequence[str] = ()) -> Retention:
        """The request's answer ended (`tool_call`: in a tool call; `tools`: the names of
        the tools it called, where known)."""
        self.ledger.expire(now)
        retention = NO_RETENTION
        flight = self._flight.pop(rid, None)
        if flight is None:
            return retention
        if flight.continued:
            retention += self._key_state(flight.continued, now)
        if not tool_call or flight.key is None or flight.tokens < self.params.min_tokens:
            # the session ended, or is too short to keep: its own pieces go first (a
            # `calling` hold on its key with them)
            return retention + self._discard(flight.own(), now)
        tool = tool_key(tools)
        ttl = self.ttl(flight.head, tool)
        grant = self.ledger.grant(flight.account, flight.key, flight.tokens, ttl, now)
        paused = _Paused(flight.account, flight.program_start, now, ttl, flight.tokens,
                         flight.own_from, grant, tool,
                         now + self.returns.predict(flight.head, tool),
                         now if flight.calling_at is None else flight.calling_at)  # fmt: skip
        sessions = self._paused.pop(flight.key, [])
        sessions.append(paused)
        self._paused[flight.key] = sessions  # the most recent pause last
        self.paused += 1
        if grant is None:
            self.unearned += 1
            retention += self._discard(flight.own(), now)
        else:
            self.retained += 1
            retention += self._key_state(flight.key, now)
        dropped = self._bound_paused()
        return retention + Retention(release=tuple(k for k in dropped if k != flight.key))

    def forget(self, rid: str, now: float) -> Retention:
        """The request failed or was withdrawn: no pause follows."""
        self.ledger.expire(now)
        flight = self._flight.pop(rid, None)
        return NO_RETENTION if flight is None else self._unhold(flight, now)

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
            for session in sessions:
                self.ledger.settle(session.grant)

    # ---- helpers ----------------------------------------------------------------------
    def _take(self, key: str, sessions: list[_Paused], index: int = 0) -> _Paused:
        found = sessions.pop(index)
        self.paused -= 1
        if not sessions:
            del self._paused[key]
        return found

    def _score(self, paused: _Paused) -> float:
        if self.params.rank == "program":
            return -paused.program_start
        if self.params.rank == "predicted":
            return -paused.expected_back
        return paused.paused_at

    def _key_state(self, key: str, now: float) -> Retention:
        """What DART should do with `key` now: retain it while a session paused there
        holds a live grant, discard it while only unearned ones are paused there, else
        release it (a continuation's path: the engine's again)."""
        sessions = self._paused.get(key)
        if not sessions:
            return Retention(release=(key,))
        live = [p for p in sessions if p.grant is not None and p.grant.live(now)]
        if not live:
            return Retention(discard=(key,))
        latest = live[-1]
        left = max(0.0, max(p.paused_at + p.ttl_s for p in live) - now)
        return Retention({key: (self._score(latest), left, latest.tokens)})

    def _discard(self, keys: Sequence[str], now: float) -> Retention:
        """Discard `keys`, but leave a key that a session paused there with a live grant
        still holds (another session of the same task) as it is."""
        held = [k for k in keys if k in self._paused]
        retention = Retention(discard=tuple(k for k in keys if k not in self._paused))
        for key in held:
            retention += self._key_state(key, now)
        return retention

    def _unearned(self, flight: _InFlight, now: float) -> Retention:
        """A request whose account could not retain its pause now: its own pieces are
        discarded at once, before the engine holds them (a word sent at its end would
        leave them ranked as segments until it arrives); a pause it earns meanwhile is
        retained at `finish` all the same."""
        if self.ledger.affords(flight.account, flight.tokens, now):
            return NO_RETENTION
        return self._discard([k for k in flight.own() if k != flight.continued], now)

    def _unhold(self, flight: _InFlight, now: float) -> Retention:
        """Undo what a request in flight held: the paused key it continued, and its own
        key from `calling`."""
        retention = NO_RETENTION
        if flight.continued is not None:
            retention += self._key_state(flight.continued, now)
        if flight.calling_at is not None and flight.key is not None:
            retention += self._key_state(flight.key, now)
        return retention

    def _bound_flight(self, now: float) -> Retention:
        """Forget the oldest requests in flight beyond `max_sessions`, with their holds."""
        retention = NO_RETENTION
        while len(self._flight) > self.params.max_sessions:
            _, flight = self._flight.popitem(last=False)
            retention += self._unhold(flight, now)
        return retention

    def _bound_paused(self) -> list[str]:
        """Drop the oldest paused sessions beyond `max_sessions`; the keys left empty."""
        emptied: list[str] = []
        while self.paused > self.params.max_sessions:
            key, sessions = next(iter(self._paused.items()))
            self.ledger.settle(self._take(key, sessions).grant)
            if key not in self._paused:
                emptied.append(key)
        return emptied

    # ---- the TTL --------------------------------------------------------------------
    def ttl(self, head: str, tool: str = ANY_TOOL) -> float:
        params = self.params
        if params.rank == "predicted":
            fit = self.returns.fit(head, tool)
            if fit.level in ("tool", "head"):
                quantile = fit.quantile_s(params.ttl_quantile)
                return min(params.max_ttl_s, max(params.min_ttl_s, quantile))
        seen = self.delays.quantile(head, params.ttl_quantile, params.min_samples)
        if seen is None:
            return min(params.default_ttl_s, params.max_ttl_s)
        return min(params.max_ttl_s, max(params.min_ttl_s, seen))

    # ---- what the proxy reports ---------------------------------------------------------
    def stats(self) -> dict[str, float | int]:
        return {
            "paused": self.paused,
            "in_flight": len(self._flight),
            "continued": self.continued,
            "new_programs": self.new_programs,
            "retained": self.retained,
            "unearned": self.unearned,
            "holding": self.ledger.live_grants,
        }
