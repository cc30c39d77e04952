"""A fair share of each round's releases between accounts (issue 36).

When several accounts (API keys, or client addresses without keys) have requests
waiting, a round's `M` releases are split between them before QAS chooses which of
each account's requests go: weighted deficit round robin over the accounts active in
the queue, counted in requests.

    credit_a += M × w_a / Σ w (accounts with requests waiting)
    M times:  the account with the most credit left (credit_a − slots_a) that still
              has requests waiting takes a slot (ties: the account waiting longest)
    carried:  credit_a − slots_a, within [−1, 1]; 0 for an account whose queue emptied

An account that asks for less than its share leaves the rest to the others (max-min:
the engine never idles for fairness); the clamp keeps an account that used idle slots
from owing them later, and one that waited from hoarding credit. With one account the
share is the whole wave, so a single tenant is scheduled exactly as without accounts.

`plan_shared` then runs the policy once per account over that account's queued
requests with its share as the wave size, so QAS orders (and aligns) each account's
requests within its share; the accounts' waves are interleaved in release order.

Pure functions: plain data in, plain data out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prism_proxy.qas.policies import SchedulingPolicy
from prism_proxy.qas.types import ActiveRequest, QueuedRequest, RoundPlan, WaveEntry

CREDIT_BOUND = 1.0  # carried credit stays within ±this many requests


@dataclass(frozen=True, slots=True)
class Shares:
    """One round's split: `slots[a]` requests of account `a` (sum: min(M, waiting)),
    and the credit each account still backlogged carries to the next round."""

    slots: dict[str, int]
    credit: dict[str, float]


def share_wave(
    waiting: Mapping[str, int],
    weights: Mapping[str, float],
    wave_size: int,
    credit: Mapping[str, float],
) -> Shares:
    """Split `wave_size` releases between the accounts of `waiting` (account → requests
    queued, in the order ties break: the account waiting longest first). `weights`
    default to 1 (an account's weight must be > 0); `credit` is the previous round's
    `Shares.credit`."""
    active = [account for account, count in waiting.items() if count > 0]
    if not active or wave_size <= 0:
        return Shares({}, {a: c for a, c in credit.items() if a in active})
    total_weight = sum(weights.get(a, 1.0) for a in active)
    earned = {
        a: credit.get(a, 0.0) + wave_size * weights.get(a, 1.0) / total_weight for a in active
    }
    slots = dict.fromkeys(active, 0)
    for _ in range(min(wave_size, sum(waiting[a] for a in active))):
        # max() keeps the first of equals: the account waiting longest
        chosen = max(
            (a for a in active if slots[a] < waiting[a]), key=lambda a: earned[a] - slots[a]
        )
        slots[chosen] += 1
    carried = {
        a: max(-CREDIT_BOUND, min(CREDIT_BOUND, earned[a] - slots[a]))
        for a in active
        if slots[a] < waiting[a]
    }
    return Shares({a: n for a, n in slots.items() if n > 0}, carried)


def plan_shared(
    policy: SchedulingPolicy,
    queue: Sequence[QueuedRequest],
    active: Sequence[ActiveRequest],
    slots: Mapping[str, int],
    now: float | None,
) -> RoundPlan:
    """One round with the wave split by `slots`: the policy plans each account's share
    over that account's requests alone. Priorities and DART's dispatch table take, per
    segment, the highest of the accounts' plans (a segment hot for any account stays
    worth keeping); skeletons and signatures are each request's own plan's."""
    by_account: dict[str, list[QueuedRequest]] = {}
    for request in queue:
        by_account.setdefault(request.account, []).append(request)
    merged = RoundPlan()
    waves: list[list[WaveEntry]] = []
    for account, count in slots.items():
        plan = policy.plan_round(by_account.get(account, []), active, count, now=now)
        for segment, value in plan.priorities.items():
            merged.priorities[segment] = max(value, merged.priorities.get(segment, value))
        for segment, value in plan.dispatch_priorities.items():
            known = merged.dispatch_priorities.get(segment, value)
            merged.dispatch_priorities[segment] = max(value, known)
        merged.skeletons.update(plan.skeletons)
        merged.signatures.update(plan.signatures)
        merged.buckets.extend(plan.buckets)
        waves.append(plan.wave[:count])
    # Interleave: each account's first release, then each one's second, ...
    for position in range(max((len(w) for w in waves), default=0)):
        merged.wave.extend(w[position] for w in waves if position < len(w))
    return merged
