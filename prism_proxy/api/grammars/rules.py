"""The desugared grammar both readers build: character sets (sorted, disjoint, inclusive
code-point ranges) and `Rules`, plain alternatives of symbol sequences with repetition
expanded, bounded by `MAX_SYMBOLS` and `MAX_REPEAT`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Code points; `END` stands for the end of the text (what may follow `root`).
MAX_CODE_POINT = 0x10FFFF
END = -1
# Most symbols of the desugared grammar (a `{m,n}` repeats its body), and most `m, n`.
MAX_SYMBOLS = 50_000
MAX_REPEAT = 1_000


class GrammarError(ValueError):
    """A grammar the proxy will not send: unreadable, or not in the checked class."""


# ---- character sets: sorted, disjoint, inclusive ranges -------------------------------
Ranges = tuple[tuple[int, int], ...]
ANY_CHAR: Ranges = ((0, MAX_CODE_POINT),)


def char_set(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Normalize ranges: sorted, merged where they touch or overlap."""
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            if high > merged[-1][1]:
                merged[-1] = (merged[-1][0], high)
        else:
            merged.append((low, high))
    return tuple(merged)


def complement(ranges: Ranges) -> Ranges:
    out, start = [], 0
    for low, high in ranges:
        if low > start:
            out.append((start, low - 1))
        start = max(start, high + 1)
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return tuple(out)


def overlap(a: Ranges, b: Ranges) -> tuple[int, int] | None:
    """A code point in both sets, as a range (None: disjoint)."""
    i = j = 0
    while i < len(a) and j < len(b):
        low, high = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if low <= high:
            return (low, high)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return None


# ---- the desugared grammar ------------------------------------------------------------
# A symbol is a rule name (str) or a character set (Ranges).
Symbol = str | Ranges
Sequence_ = tuple[Symbol, ...]


@dataclass
class Rules:
    """Rules of plain alternatives of symbol sequences, built by the readers below."""

    rules: dict[str, list[Sequence_]] = field(default_factory=dict)
    symbols: int = 0
    _fresh: int = 0

    def add(self, name: str, alternatives: list[Sequence_]) -> None:
        self.symbols += sum(len(alt) + 1 for alt in alternatives)
        if self.symbols > MAX_SYMBOLS:
            raise GrammarError(
                f"too large once repetition is expanded (over {MAX_SYMBOLS} symbols)"
            )
        self.rules[name] = alternatives

    def fresh(self, alternatives: list[Sequence_]) -> str:
        self._fresh += 1
        name = f"\x00{self._fresh}"
        self.add(name, alternatives)
        return name

    def star(self, body: Sequence_) -> str:
        """`body*` as `R ::= body R | ""` (right recursion: no left recursion appears)."""
        self._fresh += 1
        name = f"\x00{self._fresh}"
        self.add(name, [(*body, name), ()])
        return name

    def repeat(self, body: Sequence_, low: int, high: int | None) -> Sequence_:
        """`body{low,high}` (high None: unbounded) as a sequence of symbols."""
        if low > MAX_REPEAT or (high is not None and high > MAX_REPEAT):
            raise GrammarError(f"a repetition count above {MAX_REPEAT}")
        if high is not None and high < low:
            raise GrammarError(f"a repetition {{{low},{high}}} with its bounds reversed")
        out: list[Symbol] = []
        for _ in range(low):
            out.extend(body)
        if high is None:
            out.append(self.star(body))
        else:
            # body? (body (body ...)?)?: nested, so each optional copy has one way in
            tail: Sequence_ = ()
            for _ in range(high - low):
                tail = (self.fresh([(*body, *tail), ()]),)
            out.extend(tail)
        self.symbols += len(out)
        if self.symbols > MAX_SYMBOLS:
            raise GrammarError(
                f"too large once repetition is expanded (over {MAX_SYMBOLS} symbols)"
            )
        return tuple(out)
