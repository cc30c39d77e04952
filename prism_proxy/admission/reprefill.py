"""Why a continuation re-prefilled its own history (sans-IO, pure): the accounting that
adds up to what was re-prefilled.

A continuation (an agent session's call after its first) re-sends the previous call's
whole prompt, its **history**. What of it was not cached when its prefill read the
cache was prefilled again: `history_tokens - cached_tokens` (at least 0). Each
continuation's missing tokens go to exactly one cause, decided from what the proxy's
session table knew of its pause and what DART knew of its key:

    pause retained (asked and applied)?           --no-->   never_retained
      | yes
    key gone when the retention arrived?           --yes-->  late
      | no         (below: an eviction of the pause's key between its retention's start
      |            and the prefill; it starts at the pause, or where the stream showed the
      |            tool call with `retain_from` "call")
    key evicted while in R_t?                      --yes-->  evicted_while_retained
      | no
    key evicted while outside R_t's token cap?     --yes-->  over_cap
      | no
    key's host copy dropped while retained?        --yes-->  dropped_from_host
      | no
    back after its TTL?                            --yes-->  expired
      | no
    unheld

* `never_retained`: no retention was asked and applied for the pause: no session
  features, a continuation the table did not recognise (or had dropped), a pause too
  short or not earned (`credit`), or retention not applied (no DART);
* `late`: retained, but none of the key's tokens were resident when DART applied the
  retention: the engine evicted them after the call ended, before the proxy's word
  (which comes a hop later, once the answer has reached the proxy);
* `evicted_while_retained`: DART evicted tokens of the retained key under pressure
  while it was in R_t (its TTL had not run out), or of the continuation's hold while it
  waited for its prefill;
* `over_cap`: retained, and DART evicted tokens of the key while its entry was live but
  outside R_t (the longest prefix by score within `retain_fraction` of the pool), so it
  ranked with unretained segments;
* `dropped_from_host`: with a host tier (SGLang's HiCache), the retained key was demoted
  to host (which is no loss: a later request loads it back) and the host tier then
  dropped its copy while the retention was live (DART tells it only where it keeps the
  owner of a demoted node: `PRISM_DART_HOST_ORDER=dart`);
* `expired`: retained, never evicted while in R_t, and back after its TTL: the tokens
  went after the retention ended;
* `unheld`: retained, back in time, never evicted while in R_t, yet tokens were
  missing: they were lost where DART's retention does not reach, past the retained key
  (the generation prompt the template adds after the last message: a few tokens), or
  of a key only partly evicted before the retention arrived.

With a host tier in LRU order (`PRISM_DART_HOST_ORDER=lru`) DART does not know whose
copies the host tier drops, so a retained history lost there is counted under `expired`
or `unheld`.

The parts sum to the total by construction; the scenarios in tests/test_reprefill.py
reach each cause on the twin.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Cause(StrEnum):
    NEVER_RETAINED = "never_retained"
    LATE = "late"
    EVICTED_WHILE_RETAINED = "evicted_while_retained"
    OVER_CAP = "over_cap"
    DROPPED_FROM_HOST = "dropped_from_host"
    EXPIRED = "expired"
    UNHELD = "unheld"


@dataclass(frozen=True, slots=True)
class Pause:
    """A paused session as the table left it: the key DART was asked to keep, when it
    paused, its time-to-live, whether its retention was applied, and when that
    retention was first asked (`held_at`: at the pause, or earlier, when the stream
    showed the tool call; None: at the pause)."""

    key: str
    paused_at: float
    ttl_s: float
    retained: bool
    held_at: float | None = None

    @property
    def retained_from(self) -> float:
        return self.paused_at if self.held_at is None else min(self.held_at, self.paused_at)


@dataclass(frozen=True, slots=True)
class Continuation:
    """One continuation's facts: the history it re-sent and what of it was cached, the
    pause it continued (None: none known), when it came back and when its prefill read
    the cache, and what DART last saw of the pause's key (`DartCore.retained_loss`: its
    tokens evicted while retained, in R_t or outside its cap, an entry applied when none
    were resident, its host copy dropped while retained; None: never)."""

    history_tokens: int
    cached_tokens: int
    pause: Pause | None
    returned_at: float
    prefilled_at: float
    evicted_in_cap_at: float | None = None
    evicted_over_cap_at: float | None = None
    absent_at: float | None = None
    dropped_from_host_at: float | None = None

    @property
    def missing_tokens(self) -> int:
        return max(0, self.history_tokens - self.cached_tokens)


def cause(call: Continuation) -> Cause:
    """The one cause of `call`'s missing history tokens (module docstring)."""
    pause = call.pause
    if pause is None or not pause.retained:
        return Cause.NEVER_RETAINED

    held = pause.retained_from

    def since_held(at: float | None) -> bool:
        return at is not None and held <= at <= call.prefilled_at

    absent = call.absent_at
    if absent is not None and held <= absent < call.returned_at:
        return Cause.LATE  # (its own hold, applied at the return, is not the pause's)
    if since_held(call.evicted_in_cap_at):
        return Cause.EVICTED_WHILE_RETAINED
    if since_held(call.evicted_over_cap_at):
        return Cause.OVER_CAP
    if since_held(call.dropped_from_host_at):
        return Cause.DROPPED_FROM_HOST
    if call.returned_at - pause.paused_at > pause.ttl_s:
        return Cause.EXPIRED
    return Cause.UNHELD


def reprefill_tokens(calls: Iterable[Continuation]) -> dict[str, int]:
    """Missing history tokens by cause, their `total`, the continuations' `history`
    tokens and the `continuations` counted."""
    out = {c.value: 0 for c in Cause}
    history = count = 0
    for call in calls:
        out[cause(call).value] += call.missing_tokens
        history += call.history_tokens
        count += 1
    return {**out, "total": sum(out.values()), "history": history, "continuations": count}
