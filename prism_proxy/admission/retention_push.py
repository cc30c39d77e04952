"""The word the session table sends DART (sans-IO): owners to retain, release and
discard, combined so that a later word about an owner replaces an earlier one
(`admission.sessions` makes them, `admission.session_keeper` sends them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Push:
    """What to tell DART: owners to retain (`owner -> (score, ttl_s, path tokens)`), to
    release, and to discard (evict with private pieces)."""

    retain: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    release: tuple[str, ...] = ()
    discard: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.retain or self.release or self.discard)

    def __add__(self, later: Push) -> Push:
        """Both pushes, `later`'s word winning for an owner named in both."""
        if not self:
            return later
        if not later:
            return self
        named = {*later.retain, *later.release, *later.discard}
        retain = {o: e for o, e in self.retain.items() if o not in named}
        retain.update(later.retain)
        return Push(
            retain,
            (*(o for o in self.release if o not in named), *later.release),
            (*(o for o in self.discard if o not in named), *later.discard),
        )


NOTHING = Push()

# Sends a push to DART's control RPC (every replica's).
RetainPush = Callable[[Push], None]
