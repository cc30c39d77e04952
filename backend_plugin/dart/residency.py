"""Which segments DART holds, as versioned summaries for the proxy (SPEC §2 c_t, §4).

`ResidencyLog` follows the resident set of reusable segments (not the system prompt):
the tree's owner records each transition (a segment's resident tokens go 0 -> >0 or
>0 -> 0), the control RPC thread reads summaries. Each transition bumps `version` and
moves the segment to the end of an ordered change list:

    _changes   oldest ... newest     (segment -> version of its last change)
               [a:3][c:7][b:9][d:12]            version = 12
                 ^ pruned beyond `max_entries`: horizon = the pruned entry's version

A delta since V walks the list backwards while versions are > V, so it costs
O(changes after V); `resident`/`gone` give each changed segment's state now (net, so
the order of its transitions does not matter). V is answerable when
horizon <= V <= version and the caller's generation is this log's; otherwise the answer
is the full resident set. Memory: the resident set plus at most `max_entries` changes.

Threading: one lock guards every mutation and every summary; a transition holds it
for O(1), a summary for the copy it returns (O(changes) or O(resident)), never for the
JSON encoding. `version` and `len()` read one value each, atomic in CPython.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict

from prism_wire import ResidencySummary

DEFAULT_MAX_ENTRIES = 1 << 17


class ResidencyLog:
    """Resident segments and their change log (see the module docstring)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self.generation = secrets.token_hex(8)  # a restarted server is a new instance
        self._lock = threading.Lock()
        self._version = 0
        self._horizon = 0  # smallest `since` a delta can answer
        self._resident: set[str] = set()
        self._changes: OrderedDict[str, int] = OrderedDict()

    def record(self, segment: str, resident: bool) -> None:
        """`segment` entered (`resident`) or left the tree. O(1)."""
        with self._lock:
            if resident:
                self._resident.add(segment)
            else:
                self._resident.discard(segment)
            self._version += 1
            changes = self._changes
            changes[segment] = self._version
            changes.move_to_end(segment)
            if len(changes) > self.max_entries:
                _, pruned = changes.popitem(last=False)
                self._horizon = pruned  # a delta from before it would miss it

    def clear(self) -> None:
        """The tree was emptied: one version step, and every older `since` gets the
        (empty) full set rather than a delta listing each segment as gone."""
        with self._lock:
            self._resident.clear()
            self._changes.clear()
            self._version += 1
            self._horizon = self._version

    @property
    def version(self) -> int:
        return self._version

    @property
    def horizon(self) -> int:
        return self._horizon

    def __len__(self) -> int:
        """Number of resident segments."""
        return len(self._resident)

    def summary(self, generation: str | None, since: int | None) -> ResidencySummary:
        """A delta since `since` if `generation` is this log's and `since` is
        answerable, else the full set."""
        with self._lock:
            version = self._version
            if (
                generation != self.generation
                or since is None
                or not (self._horizon <= since <= version)
            ):
                return ResidencySummary(self.generation, version, True, tuple(self._resident))
            resident: list[str] = []
            gone: list[str] = []
            now = self._resident
            for segment, changed in reversed(self._changes.items()):
                if changed <= since:
                    break
                (resident if segment in now else gone).append(segment)
            return ResidencySummary(self.generation, version, False, tuple(resident), tuple(gone))
