"""A regular expression read with Python's own regex parser (the syntax xgrammar takes
for its common part) into `Rules` and checked (`check_regex`). Lookahead, back
references and other anchors are refused with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from prism_proxy.api.grammars.ll1 import check_ll1
from prism_proxy.api.grammars.rules import (
    ANY_CHAR,
    GrammarError,
    Ranges,
    Rules,
    Symbol,
    char_set,
    complement,
)

# What a category matches as xgrammar 0.2.7 (the engine's) reads it: ASCII digits and
# word characters, and six whitespace characters with U+00A0.
_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = char_set([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
_SPACE: Ranges = char_set([(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0)])


def _category(name: str) -> Ranges:
    kind = name.removeprefix("CATEGORY_").removeprefix("UNI_")
    negate = kind.startswith("NOT_")
    ranges = {"DIGIT": _DIGIT, "WORD": _WORD, "SPACE": _SPACE}.get(kind.removeprefix("NOT_"))
    if ranges is None:
        return ANY_CHAR  # widened: a wider set only refuses more
    return complement(ranges) if negate else ranges


def _regex_items(grammar: Rules, pattern: Iterable[tuple[object, object]]) -> Iterator[Symbol]:
    from re import _constants as c  # type: ignore[attr-defined]

    for op, arg in pattern:
        if op is c.LITERAL:
            point = int(arg)  # type: ignore[call-overload]
            yield ((point, point),)
        elif op is c.NOT_LITERAL:
            point = int(arg)  # type: ignore[call-overload]
            yield complement(((point, point),))
        elif op is c.ANY:
            yield ANY_CHAR
        elif op is c.IN:
            yield _regex_class(arg)  # type: ignore[arg-type]
        elif op is c.AT:
            if arg in (c.AT_BEGINNING, c.AT_BEGINNING_STRING, c.AT_END, c.AT_END_STRING):
                continue  # the engine matches the whole output anyway
            raise GrammarError(f"the anchor {arg} is not checked")
        elif op is c.SUBPATTERN:
            yield from _regex_items(grammar, arg[-1])  # type: ignore[index]
        elif op is c.BRANCH:
            branches = [tuple(_regex_items(grammar, b)) for b in arg[1]]  # type: ignore[index]
            yield grammar.fresh(branches)
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            low, high, sub = arg  # type: ignore[misc]
            body = tuple(_regex_items(grammar, sub))
            unbounded = high is c.MAXREPEAT
            symbols = grammar.repeat(body, int(low), None if unbounded else int(high))
            yield grammar.fresh([symbols]) if len(symbols) != 1 else symbols[0]
        elif op is c.CATEGORY:
            yield _category(str(arg))
        else:
            raise GrammarError(f"the regex construct {str(op).lower()} is not checked")


def _regex_class(items: Iterable[tuple[object, object]]) -> Ranges:
    from re import _constants as c  # type: ignore[attr-defined]

    ranges: list[tuple[int, int]] = []
    negate = False
    for op, arg in items:
        if op is c.NEGATE:
            negate = True
        elif op is c.LITERAL:
            point = int(arg)  # type: ignore[call-overload]
            ranges.append((point, point))
        elif op is c.RANGE:
            low, high = arg  # type: ignore[misc]
            ranges.append((int(low), int(high)))
        elif op is c.CATEGORY:
            ranges.extend(_category(str(arg)))
        else:
            return ANY_CHAR  # widened
    result = char_set(ranges)
    return complement(result) if negate and result != ANY_CHAR else (ANY_CHAR if negate else result)


def check_regex(pattern: str) -> None:
    """Raise GrammarError unless `pattern` reads as a regular expression of the checked
    (LL(1)) class."""
    from re import _parser  # type: ignore[attr-defined]

    try:
        parsed = _parser.parse(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise GrammarError(f"not a regular expression: {exc}") from None
    grammar = Rules()
    body = tuple(_regex_items(grammar, parsed))
    grammar.add("root", [body])
    check_ll1(grammar)
