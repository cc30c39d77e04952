"""The admission core: queue, rounds, waves and prefill pacing, with no I/O (SPEC §2).

    arrive ──► queue (rid → request, arrival order) ──round──► wave ──► released
                  ▲                                                      │
                  └── withdraw (client gone)              pending prefill (no token yet)
                                                                         │ first_token
                                                                         ▼
                                                                 decoding (active)
                                                                         │ finish
                                                                         ▼ gone

A sans-IO state machine: the caller passes `now` (seconds, any monotonic clock) and
events in, and gets the wave to release out; it never sleeps, reads a clock or touches
a socket. The proxy's asyncio loop (`prism_proxy.admission.driver`) and the modeled-time twin
(`loadgen.twin.twin`) are its two drivers.

Pacing (SPEC §2): a released request is *pending prefill* until its first token. A
round runs only while fewer than `B` requests are pending and fewer than the backstop
are released-and-unfinished; its wave size is `M = min(B − pending, backstop −
in flight)`. Decoding requests do not count against `B`, nor do *parked* ones (`park`:
a pieced prompt waiting for its turn at the engine, `admission.pieces`; `unpark`
makes it pending again). A round is due `window_s`
after the previous one, or at once when a request arrives at an empty queue while
there is room. `finish` (done, aborted, failed, client gone) frees both counts at once.

Deadlines: `arrive` stamps each request with the moment its admission wait
runs out: its TTFT SLO less the observed release-to-first-token time (an EWMA), or
else `cold_deadline_s` (a parameter of the core); the policy's deadline lane reads it.

What the backend reports enters as events too: `first_token` (its uncached tokens feed
the B rule; `observe_uncached` when they come later, with an engine-served answer's
usage) and `learn_backend` (its batch limits).

Accounts (issue 36): when requests of several accounts wait, `begin_round` splits the
wave between them (`fair_share.share_wave`, weighted by `account_weight`) and `plan`
lets the policy choose within each account's share (`fair_share.plan_shared`); with
one account a round is planned exactly as without accounts.

Rounds may be split (`begin_round` → `plan` → `commit`) so that a driver can run the
pure `plan` elsewhere (a worker thread); `commit` tolerates requests withdrawn meanwhile.

Prefill pacing (`PrefillPacing`, SPEC §2, dispatch wave): `B` (requests pending
prefill) and the concurrency backstop.

    B        = clamp(round(prefill budget / uncached tokens per request), 1, backstop)
    backstop = the backend's max_running_requests

* **Prefill budget**: the tokens one backend prefill batch takes: SGLang's
  `chunked_prefill_size`, or `max_prefill_tokens` when chunking is off (`-1`), read
  from `/server_info`; 8192 until the backend has said.
* **Uncached tokens per request**: an exponential moving average (weight 1/16) of
  `prompt_tokens − cached_tokens` that the backend reports with each first token (an
  answer of the engine's own endpoint reports them in its usage, at its end; one
  without usage, never); 1024 before the first report, so B starts at 8 for an 8k
  budget.
* **Backstop**: requests released and not finished; the backend's
  `max_running_requests` (1024 until it has said).

A setting fixes either number (`prefill_batch`, `max_inflight`); None ("auto") follows
the rule. Behind a gateway in front of `replicas` engines (`backend_replicas`, or one
per DART control RPC) the backend's reported budget and backstop are one engine's: each
counts `replicas` times, since every replica prefills its own batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from prism_proxy.admission.fair_share import plan_shared, share_wave
from prism_proxy.qas.policies import SchedulingPolicy
from prism_proxy.qas.types import ActiveRequest, Lane, QueuedRequest, RoundPlan


class QueueFullError(Exception):
    """The queue holds `max_queue` requests; the caller answers 429."""


class DuplicateRidError(ValueError):
    """A request with this rid is already queued or in flight; the caller answers 400."""


class ShuttingDownError(Exception):
    """The core stopped admitting; the caller answers 503."""


@dataclass(frozen=True, slots=True)
class Released:
    """What QAS decided for one released request."""

    rid: str
    lane: Lane
    skeleton: tuple[str, ...]
    priorities: dict[str, float]  # P̂_t of the request's own segments (its anchors)
    wait_s: float


@dataclass(frozen=True, slots=True)
class RoundInput:
    """What a round plans over: Q_queue, Q_active and M, taken at one instant."""

    now: float
    queue: list[QueuedRequest]
    active: list[ActiveRequest]
    wave_size: int
    # Releases per account when several accounts wait (None: one account, no split).
    shares: dict[str, int] | None = None

    @property
    def occurrences(self) -> int:
        """S: queued segment occurrences (the round's cost, SPEC §2)."""
        return sum(len(request.segments) for request in self.queue)


@dataclass(frozen=True, slots=True)
class Wave:
    """One committed round: the requests released, in release order, and P̂_t."""

    released: list[Released]
    plan: RoundPlan

    @property
    def dispatch_priorities(self) -> dict[str, float]:
        return self.plan.dispatch_priorities


class AdmissionCore:
    """Queue, active set and pending-prefill set around one scheduling policy."""

    def __init__(
        self,
        policy: SchedulingPolicy,
        pacing: PrefillPacing,
        *,
        window_s: float,
        max_queue: int,
        cold_deadline_s: float | None = None,
        share_accounts: bool = True,
        account_weight: Callable[[str], float] | None = None,
    ) -> None:
        self.policy = policy
        self.share_accounts = share_accounts
        self.account_weight = account_weight or (lambda account: 1.0)
        self._credit: dict[str, float] = {}  # fair-share credit of backlogged accounts
        # Requests queued per account, accounts in the order their backlog began.
        self._by_account: dict[str, int] = {}
        self.pacing = pacing
        self.window_s = window_s
        self.max_queue = max_queue
        self.cold_deadline_s = cold_deadline_s
        self._queue: dict[str, QueuedRequest] = {}  # each with its deadline and enqueued
        self._active: dict[str, ActiveRequest] = {}
        self._pending: dict[str, float] = {}  # released, no first token yet (⊆ _active)
        # Released, no first token yet, holding no place in the engine (a pieced
        # prompt waiting for its turn, `admission.pieces`): not pending prefill.
        self._parked: dict[str, float] = {}
        self.prefill_s: float | None = None  # EWMA of release → first token
        self._last_round = float("-inf")
        self._run_now = False
        self.closed = False

    # --- views ---------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def inflight(self) -> int:
        return len(self._active)

    @property
    def pending_prefill(self) -> int:
        return len(self._pending)

    @property
    def room(self) -> int:
        """M: how many requests a round could release now."""
        by_prefill = self.pacing.prefill_batch - len(self._pending)
        by_backstop = self.pacing.backstop - len(self._active)
        return max(0, min(by_prefill, by_backstop))

    def is_queued(self, rid: str) -> bool:
        return rid in self._queue

    # --- events ----------------------------------------------------------------------
    def arrive(self, request: QueuedRequest, now: float) -> None:
        """Queue a request (QueueFullError, DuplicateRidError, ShuttingDownError)."""
        if self.closed:
            raise ShuttingDownError("the proxy is shutting down")
        if len(self._queue) >= self.max_queue:
            raise QueueFullError(f"admission queue full ({self.max_queue} requests waiting)")
        if request.rid in self._queue or request.rid in self._active:
            raise DuplicateRidError(f"rid {request.rid!r} is already in use")
        if not self._queue and self.room > 0:
            self._run_now = True  # SPEC §2: a round runs at once on an idle backend
        request = replace(request, deadline=self.deadline_for(request, now), enqueued=now)
        self._queue[request.rid] = request
        self._by_account[request.account] = self._by_account.get(request.account, 0) + 1

    def deadline_for(self, request: QueuedRequest, now: float) -> float:
        """When `request`'s admission wait runs out (inf: never)."""
        if request.ttft_slo_s is not None:
            return now + max(0.0, request.ttft_slo_s - (self.prefill_s or 0.0))
        if self.cold_deadline_s is None:
            return math.inf
        return now + self.cold_deadline_s

    def learn_backend(self, limits: BackendLimits) -> None:
        """The backend reported its batch limits: B and the backstop may change."""
        self.pacing.learn(limits)

    def withdraw(self, rid: str) -> bool:
        """Remove a request that is still queued; False if it is not queued."""
        request = self._queue.pop(rid, None)
        if request is None:
            return False
        self._left_queue(request.account)
        return True

    def _left_queue(self, account: str) -> None:
        left = self._by_account[account] - 1
        if left:
            self._by_account[account] = left
        else:
            del self._by_account[account]

    def first_token(
        self, rid: str, uncached_tokens: int | None = None, now: float | None = None
    ) -> None:
        """The backend answered `rid`'s first token (or first byte): it now decodes.
        `uncached_tokens` (prompt − cached, when reported) feeds the B rule; `now`
        the release-to-first-token estimate that SLO deadlines use."""
        released = self._pending.pop(rid, None)
        if released is None:
            return
        if uncached_tokens is not None:
            self.pacing.observe(uncached_tokens)
        if now is not None:
            sample = max(0.0, now - released)
            previous = self.prefill_s
            self.prefill_s = sample if previous is None else previous + (sample - previous) / 16

    def observe_uncached(self, uncached_tokens: int) -> None:
        """A request's uncached prompt tokens, told after its first token (an answer
        served by the engine's own endpoint reports them only in its usage, at its
        end): they feed the B rule as a first token's do."""
        self.pacing.observe(uncached_tokens)

    def park(self, rid: str) -> None:
        """`rid` (pending prefill) waits outside the engine for now: it leaves pending
        prefill, and its release time is kept for when it comes back."""
        released = self._pending.pop(rid, None)
        if released is not None:
            self._parked[rid] = released

    def unpark(self, rid: str) -> None:
        """`rid` goes back to the engine: pending prefill again."""
        released = self._parked.pop(rid, None)
        if released is not None:
            self._pending[rid] = released

    def finish(self, rid: str) -> bool:
        """`rid` ended (finished, aborted, failed or its client left); False if it was
        not released."""
        self._pending.pop(rid, None)
        self._parked.pop(rid, None)
        return self._active.pop(rid, None) is not None

    def close(self) -> list[str]:
        """Stop admitting; empties the queue and returns the rids it held."""
        self.closed = True
        rids = list(self._queue)
        self._queue.clear()
        self._by_account.clear()
        return rids

    # --- rounds ----------------------------------------------------------------------
    def next_round_at(self, now: float) -> float | None:
        """When the next round is due (≤ now: at once); None while nothing can go."""
        if not self._queue or self.room == 0:
            return None
        if self._run_now:
            return now
        return max(now, self._last_round + self.window_s)

    def begin_round(self, now: float) -> RoundInput | None:
        """Start a round if one can release anything: snapshot Q_queue, Q_active, M."""
        wave_size = self.room
        if not self._queue or wave_size == 0:
            return None
        self._run_now = False
        self._last_round = now
        queue = list(self._queue.values())
        shares = None
        if self.share_accounts and len(self._by_account) > 1:
            waiting = self._by_account
            weights = {account: self.account_weight(account) for account in waiting}
            split = share_wave(waiting, weights, wave_size, self._credit)
            shares, self._credit = split.slots, split.credit
        elif self._credit:
            self._credit = {}
        return RoundInput(
            now=now,
            queue=queue,
            active=list(self._active.values()),
            wave_size=wave_size,
            shares=shares,
        )

    def plan(self, round_input: RoundInput) -> RoundPlan:
        """The policy's decision (pure apart from the baselines' cache view)."""
        if round_input.shares is not None:
            return plan_shared(
                self.policy,
                round_input.queue,
                round_input.active,
                round_input.shares,
                round_input.now,
            )
        return self.policy.plan_round(
            round_input.queue, round_input.active, round_input.wave_size, now=round_input.now
        )

    def commit(self, round_input: RoundInput, plan: RoundPlan, now: float) -> Wave:
        """Release the wave in order; requests no longer queued are skipped."""
        released: list[Released] = []
        table = plan.dispatch_priorities
        for entry in plan.wave[: round_input.wave_size]:
            request = self._queue.pop(entry.rid, None)
            if request is None:
                continue
            self._left_queue(request.account)
            skeleton = tuple(plan.skeletons.get(entry.rid, request.segments))
            self._active[entry.rid] = ActiveRequest(entry.rid, skeleton, request.head)
            self._pending[entry.rid] = now
            priorities = {s: table[s] for s in skeleton if s in table}
            released.append(
                Released(entry.rid, entry.lane, skeleton, priorities, now - request.enqueued)
            )
        return Wave(released, plan)

    def run_round(self, now: float) -> Wave | None:
        """One whole round inline (None when no round can run)."""
        round_input = self.begin_round(now)
        if round_input is None:
            return None
        return self.commit(round_input, self.plan(round_input), now)


DEFAULT_PREFILL_BUDGET_TOKENS = 8192
DEFAULT_UNCACHED_TOKENS = 1024.0
DEFAULT_BACKSTOP = 1024
UNCACHED_EWMA_WEIGHT = 1.0 / 16.0


@dataclass(frozen=True, slots=True)
class BackendLimits:
    """What the backend reports about its batches (None: not reported)."""

    prefill_budget_tokens: int | None = None
    max_running_requests: int | None = None
    kv_pool_tokens: int | None = None  # `max_total_num_tokens`
    context_tokens: int | None = None  # the longest request: `max_req_input_len`

    @classmethod
    def from_server_info(cls, info: Mapping[str, Any]) -> BackendLimits:
        """Read SGLang's (or prism-sim's) `/get_server_info`.

        `chunked_prefill_size` ≤ 0 means chunking is off: the batch budget is then
        `max_prefill_tokens`. `max_running_requests` is a server argument that may be
        null; the scheduler's resolved value is `internal_states[0]
        .effective_max_running_requests_per_dp` (SGLang 0.5.23, prism-sim alike).
        """
        states = info.get("internal_states")
        state = states[0] if isinstance(states, list) and states else {}
        state = state if isinstance(state, Mapping) else {}

        def positive(*values: Any) -> int | None:
            for value in values:
                if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                    return int(value)
            return None

        chunk = info.get("chunked_prefill_size")
        budget = positive(chunk) if positive(chunk) else positive(info.get("max_prefill_tokens"))
        running = positive(
            state.get("effective_max_running_requests_per_dp"), info.get("max_running_requests")
        )
        pool = positive(info.get("max_total_num_tokens"), state.get("max_total_num_tokens"))
        context = positive(info.get("max_req_input_len"), state.get("max_req_input_len"))
        return cls(budget, running, pool, context)


class PrefillPacing:
    """The current `B` and backstop; `observe` and `learn` update them."""

    def __init__(
        self, prefill_batch: int | None = None, max_inflight: int | None = None, replicas: int = 1
    ) -> None:
        for name, value in (("prefill_batch", prefill_batch), ("max_inflight", max_inflight)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be None (automatic) or >= 1, got {value}")
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        self.replicas = replicas
        self.setting = prefill_batch  # B as configured; None: automatic
        self.backstop_setting = max_inflight
        self.backend = BackendLimits()
        self.uncached_tokens = DEFAULT_UNCACHED_TOKENS

    def learn(self, limits: BackendLimits) -> None:
        """Take the backend's reported limits (keeps what it did not report)."""
        known = self.backend
        self.backend = BackendLimits(
            limits.prefill_budget_tokens or known.prefill_budget_tokens,
            limits.max_running_requests or known.max_running_requests,
            limits.kv_pool_tokens or known.kv_pool_tokens,
            limits.context_tokens or known.context_tokens,
        )

    def observe(self, uncached_tokens: int) -> None:
        """One request's first token reported this many prompt tokens not cached."""
        sample = max(1, uncached_tokens)
        self.uncached_tokens += UNCACHED_EWMA_WEIGHT * (sample - self.uncached_tokens)

    @property
    def prefill_budget_tokens(self) -> int:
        """Tokens the backend prefills per batch round, over all its replicas."""
        per_engine = self.backend.prefill_budget_tokens or DEFAULT_PREFILL_BUDGET_TOKENS
        return self.replicas * per_engine

    @property
    def backstop(self) -> int:
        per_engine = self.backend.max_running_requests or DEFAULT_BACKSTOP
        return self.backstop_setting or self.replicas * per_engine

    @property
    def prefill_batch(self) -> int:
        """B: how many released requests may wait for their first token at once."""
        if self.setting is not None:
            return self.setting
        rule = round(self.prefill_budget_tokens / self.uncached_tokens)
        return max(1, min(rule, self.backstop))
