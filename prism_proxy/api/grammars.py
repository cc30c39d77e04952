"""Grammars a client asks the engine to follow (`ebnf`, `regex`), and the check that
bounds what matching them can cost.

SGLang hands these to xgrammar, whose matcher is an Earley parser: for an ambiguous
grammar the work of one decode step grows with the text generated so far. Measured with
xgrammar 0.2.7 (the engine's) on this CPU, a 140-character grammar of nested nullable
alternatives (`r0 ::= r1 r1 | r1 | ""`, eight layers, `root ::= r0 r0 r0`) took 0.2 s
for the first of 14 one-character tokens and 17.5 s for the tenth: a step of the
engine's scheduler, during which no other request moves. A deterministic grammar stays
flat (2,000 characters, under 0.1 ms a step). The proxy cannot run xgrammar itself (it
needs torch), so it checks the grammar's *form* instead:

**LL(1) over characters.** After desugaring repetition (`X*`, `X+`, `X?`, `X{m,n}`) into
rules, every rule's alternatives must start with disjoint characters, at most one may
be empty, and an empty one's rule must not be followed by a character another
alternative starts with. Then at every character exactly one way to continue is alive:
the parser's work per step is bounded by the grammar's size, not by the text so far.
Left recursion and every ambiguity fail the check. Character sets are kept exact for
literals and classes and widened (never narrowed) for regex categories (`\\w`, `\\s`, `.`),
so a wider set can only refuse more: the check never passes a grammar it should not.

`check_ebnf` reads xgrammar's EBNF dialect (rules `name ::= ...`, `"strings"`,
`[classes]`, groups, `| * + ? {m,n}`, `#` comments; the start rule is `root`);
`check_regex` reads a regular expression with Python's own regex parser (the syntax
xgrammar takes for its common part). Anything else (lookahead, back references,
xgrammar's built-in functions) is refused with the reason, as is a grammar whose
desugared form exceeds `MAX_SYMBOLS`. Pure functions; a 64 KB grammar is checked in
tens of milliseconds.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
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


def _show(point: int) -> str:
    return "the end" if point == END else repr(chr(point))


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


# ---- the check --------------------------------------------------------------------------
def _first_of(seq: Sequence_, first: dict[str, Ranges], nullable: set[str]) -> tuple[Ranges, bool]:
    """FIRST of a sequence, and whether all of it may be empty."""
    parts: list[tuple[int, int]] = []
    for symbol in seq:
        if isinstance(symbol, str):
            parts.extend(first[symbol])
            if symbol not in nullable:
                return char_set(parts), False
        else:
            parts.extend(symbol)
            return char_set(parts), False
    return char_set(parts), True


def _components(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of `graph`, each after every component it reaches
    (Tarjan's order), iteratively (grammars may be thousands of rules deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    order: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            edges = graph[node]
            if i < len(edges):
                work.append((node, i + 1))
                nxt = edges[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                order.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return order


def _sweep_conflict(sets: list[Ranges]) -> tuple[int, int, int] | None:
    """Two of `sets` that share a character: (first index, second index, character)."""
    spans = sorted((low, high, i) for i, ranges in enumerate(sets) for low, high in ranges)
    reach, owner = -2, -1
    for low, high, i in spans:
        if low <= reach and i != owner:
            return owner, i, low
        if high > reach:
            reach, owner = high, i
    return None


def check_ll1(grammar: Rules, start: str = "root") -> None:
    """Raise GrammarError unless `grammar` is LL(1) over characters (module docstring).

    Linear in the grammar's size: nullability by propagation, FIRST over the left-corner
    graph (which must be acyclic: left recursion is never LL(1)), FOLLOW over the
    strongly connected components of its flow, and each rule's alternatives compared by
    one sweep over their sorted character ranges."""
    rules = grammar.rules
    if start not in rules:
        raise GrammarError(f"no rule {start!r} to start from")
    for name, alternatives in rules.items():
        for alt in alternatives:
            for symbol in alt:
                if isinstance(symbol, str) and symbol not in rules:
                    raise GrammarError(f"rule {_name(name)} uses {symbol!r}, which is not defined")
    # nullable: a rule with an alternative whose symbols are all nullable rules
    users: dict[str, list[tuple[str, int]]] = {name: [] for name in rules}
    missing: dict[tuple[str, int], int] = {}
    nullable: set[str] = set()
    ready: list[str] = []
    for name, alternatives in rules.items():
        for k, alt in enumerate(alternatives):
            if all(isinstance(s, str) for s in alt):
                missing[(name, k)] = len(alt)
                for s in alt:
                    users[s].append((name, k))  # type: ignore[index]
                if not alt:
                    ready.append(name)
    while ready:
        name = ready.pop()
        if name in nullable:
            continue
        nullable.add(name)
        for user in users[name]:
            missing[user] -= 1
            if missing[user] == 0:
                ready.append(user[0])
    # FIRST: over the left corners (each rule reached before a non-nullable symbol)
    corners: dict[str, list[str]] = {}
    for name, alternatives in rules.items():
        reached: list[str] = []
        for alt in alternatives:
            for symbol in alt:
                if not isinstance(symbol, str):
                    break
                reached.append(symbol)
                if symbol not in nullable:
                    break
        corners[name] = reached
    first: dict[str, Ranges] = {}
    for component in _components(corners):
        if len(component) > 1 or component[0] in corners[component[0]]:
            raise GrammarError(
                f"rule {_name(component[0])} is left-recursive (directly, or through parts "
                "that can be empty): matching it is not deterministic"
            )
        name = component[0]
        parts = [r for alt in rules[name] for r in _first_of(alt, first, nullable)[0]]
        first[name] = char_set(parts)
    # FOLLOW: what comes after a rule inside others, and what follows those that end
    # with it (`flows`: FOLLOW(a) flows into FOLLOW(b))
    own: dict[str, list[tuple[int, int]]] = {name: [] for name in rules}
    own[start].append((END, END))
    flows: dict[str, list[str]] = {name: [] for name in rules}
    for name, alternatives in rules.items():
        for alt in alternatives:
            suffix_empty = True
            suffix: list[tuple[int, int]] = []
            for symbol in reversed(alt):
                if isinstance(symbol, str):
                    own[symbol].extend(suffix)
                    if suffix_empty:
                        flows[name].append(symbol)
                    if symbol not in nullable:
                        suffix_empty = False
                        suffix = list(first[symbol])
                    else:
                        suffix = [*first[symbol], *suffix]
                else:
                    suffix_empty = False
                    suffix = list(symbol)
    into: dict[str, list[str]] = {name: [] for name in rules}
    for source, targets in flows.items():
        for target in targets:
            into[target].append(source)
    follow: dict[str, Ranges] = {}
    # a component's sources come before it in this order (components of `into`)
    for component in _components(into):
        members = set(component)
        parts = [r for m in component for r in own[m]]
        parts += [r for m in component for s in into[m] if s not in members for r in follow[s]]
        merged = char_set(parts)
        for member in component:
            follow[member] = merged
    # the LL(1) conditions, rule by rule
    for name, alternatives in rules.items():
        starts = [_first_of(alt, first, nullable) for alt in alternatives]
        empties = [i for i, (_, empty) in enumerate(starts) if empty]
        if len(empties) > 1:
            raise GrammarError(
                f"rule {_name(name)} can match the empty text in two ways (ambiguous)"
            )
        clash = _sweep_conflict([ranges for ranges, _ in starts])
        if clash is not None:
            raise GrammarError(
                f"rule {_name(name)} has two alternatives that can start with "
                f"{_show(clash[2])}: matching it is not deterministic"
            )
        if empties:
            others = char_set(r for i, (a, _) in enumerate(starts) if i not in empties for r in a)
            both = overlap(others, follow[name])
            if both is not None:
                raise GrammarError(
                    f"rule {_name(name)} may be empty, and {_show(both[0])} can both start it "
                    "and follow it: matching it is not deterministic"
                )


def _name(name: str) -> str:
    return "(a repetition or group)" if name.startswith("\x00") else repr(name)


# ---- xgrammar's EBNF --------------------------------------------------------------------
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "[": "[",
            "]": "]", "-": "-", "^": "^", "/": "/", "b": "\b", "f": "\f", "v": "\v",
            "0": "\0", "a": "\a", "e": "\x1b"}  # fmt: skip


class _EbnfReader:
    """A recursive-descent reader of xgrammar's EBNF into `Rules`."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.grammar = Rules()

    # -- lexing --
    def _skip(self, newlines: bool = True) -> None:
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            elif char in " \t\r" or (newlines and char == "\n"):
                self.pos += 1
            else:
                break

    def _error(self, message: str) -> GrammarError:
        line = self.text.count("\n", 0, self.pos) + 1
        return GrammarError(f"line {line}: {message}")

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _escape(self) -> int:
        """The code point of an escape after its backslash."""
        text = self.text
        if self.pos >= len(text):
            raise self._error("a backslash at the end")
        char = text[self.pos]
        self.pos += 1
        if char in _ESCAPES:
            return ord(_ESCAPES[char])
        digits = {"x": 2, "u": 4, "U": 8}.get(char)
        if digits is not None:
            hex_text = text[self.pos : self.pos + digits]
            if len(hex_text) != digits or not all(c in "0123456789abcdefABCDEF" for c in hex_text):
                raise self._error(f"a bad \\{char} escape")
            self.pos += digits
            point = int(hex_text, 16)
            if point > MAX_CODE_POINT:
                raise self._error("an escape beyond Unicode")
            return point
        raise self._error(f"an unknown escape \\{char}")

    # -- parsing --
    def read(self) -> Rules:
        while True:
            self._skip()
            if self.pos >= len(self.text):
                break
            match = _IDENT.match(self.text, self.pos)
            if match is None:
                raise self._error("expected a rule name")
            name = match.group()
            self.pos = match.end()
            self._skip(newlines=False)
            if not self.text.startswith("::=", self.pos):
                raise self._error(f"expected '::=' after {name!r}")
            self.pos += 3
            if name in self.grammar.rules:
                raise self._error(f"rule {name!r} defined twice")
            self.grammar.rules[name] = []  # reserved while its body is read
            self.grammar.add(name, self._alternatives(top=True))
        return self.grammar

    def _alternatives(self, top: bool) -> list[Sequence_]:
        alternatives = [self._sequence(top)]
        while True:
            self._skip(newlines=not top)
            if self._peek() != "|":
                return alternatives
            self.pos += 1
            alternatives.append(self._sequence(top))

    def _sequence(self, top: bool) -> Sequence_:
        """Symbols up to `|`, `)`, or (in a rule's body) the line that starts the next rule."""
        out: list[Symbol] = []
        while True:
            self._skip(newlines=not top)
            if top and self._peek() == "\n":
                # a body continues on the next line unless that line starts a new rule
                mark = self.pos
                self._skip()
                match = _IDENT.match(self.text, self.pos)
                after = self.pos if match is None else match.end()
                rest = self.text[after:].lstrip(" \t")
                if self.pos >= len(self.text) or (match and rest.startswith("::=")):
                    self.pos = mark
                    self._skip()
                    return tuple(out)
                continue
            char = self._peek()
            if char in ("", "|", ")"):
                return tuple(out)
            if top and char == "(" and self.text.startswith("(=", self.pos):
                raise self._error("lookahead assertions '(= ...)' are not checked")
            out.extend(self._postfix(self._atom()))

    def _atom(self) -> Sequence_:
        char = self._peek()
        if char in "\"'":
            return self._string(char)
        if char == "[":
            return (self._class(),)
        if char == "(":
            if self.text.startswith("(=", self.pos):
                raise self._error("lookahead assertions '(= ...)' are not checked")
            self.pos += 1
            alternatives = self._alternatives(top=False)
            self._skip()
            if self._peek() != ")":
                raise self._error("expected ')'")
            self.pos += 1
            if len(alternatives) == 1:
                return alternatives[0]
            return (self.grammar.fresh(alternatives),)
        if char == ".":
            self.pos += 1
            return (complement(((10, 10),)),)
        match = _IDENT.match(self.text, self.pos)
        if match is None:
            raise self._error(f"unexpected {char!r}")
        self.pos = match.end()
        if self._peek() == "(":
            raise self._error(f"built-in {match.group()}(...) is not checked")
        return (match.group(),)

    def _string(self, quote: str) -> Sequence_:
        self.pos += 1
        out: list[Symbol] = []
        while True:
            if self.pos >= len(self.text):
                raise self._error("an unterminated string")
            char = self.text[self.pos]
            self.pos += 1
            if char == quote:
                return tuple(out)
            point = self._escape() if char == "\\" else ord(char)
            out.append(((point, point),))

    def _class(self) -> Ranges:
        self.pos += 1
        negate = self._peek() == "^"
        if negate:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        while True:
            if self.pos >= len(self.text):
                raise self._error("an unterminated character class")
            char = self.text[self.pos]
            self.pos += 1
            if char == "]":
                break
            low = self._escape() if char == "\\" else ord(char)
            high = low
            if self._peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                char = self.text[self.pos]
                self.pos += 1
                high = self._escape() if char == "\\" else ord(char)
                if high < low:
                    raise self._error("a character range with its ends reversed")
            ranges.append((low, high))
        result = char_set(ranges)
        return complement(result) if negate else result

    def _postfix(self, body: Sequence_) -> Sequence_:
        grammar = self.grammar
        while True:
            self._skip(newlines=False)
            char = self._peek()
            if char == "*":
                self.pos += 1
                body = (grammar.star(body),)
            elif char == "+":
                self.pos += 1
                body = (*body, grammar.star(body))
            elif char == "?":
                self.pos += 1
                body = (grammar.fresh([body, ()]),)
            elif char == "{":
                end = self.text.find("}", self.pos)
                if end < 0:
                    raise self._error("an unterminated '{m,n}'")
                inside = self.text[self.pos + 1 : end].replace(" ", "")
                self.pos = end + 1
                match = re.fullmatch(r"(\d+)(,(\d*))?", inside)
                if match is None:
                    raise self._error(f"a bad repetition {{{inside}}}")
                low = int(match.group(1))
                if match.group(2) is None:
                    high: int | None = low
                else:
                    high = int(match.group(3)) if match.group(3) else None
                body = grammar.repeat(body, low, high)
                # a repetition of a repetition is fine: each is its own rule
                body = (grammar.fresh([body]),) if len(body) != 1 else body
            else:
                return body


def check_ebnf(text: str) -> None:
    """Raise GrammarError unless `text` is EBNF of the checked (LL(1)) class."""
    check_ll1(_EbnfReader(text).read())


# ---- regular expressions -----------------------------------------------------------
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


# ---- the deployment's rule -------------------------------------------------------------
OFF_REASON = (
    "grammars other than JSON schemas are off in this deployment (setting `grammars`); "
    "one such grammar can hold every step of the engine"
)
UNCHECKED_REASON = (
    "structural tags are served only with `grammars = on` (the proxy cannot bound what "
    "matching them costs)"
)
# Verdicts remembered (clients send the same grammar again): digests only, so the
# memory is bounded by the count, not by the grammars' size.
VERDICTS = 4096


class GrammarGate:
    """Whether a grammar may reach the engine under the deployment's policy: `off` (no
    grammar but JSON schemas), `checked` (`ebnf` and `regex` of the LL(1) class), `on`
    (all, unchecked). `reason` is None for a grammar that may go, else why not."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self._verdicts: dict[bytes, str | None] = {}

    def known(self, kind: str, text: str) -> tuple[bool, str | None]:
        """(whether the verdict is at hand without checking, the verdict)."""
        if self.policy == "on":
            return True, None
        if self.policy == "off":
            return True, OFF_REASON
        if kind not in ("ebnf", "regex"):
            return True, UNCHECKED_REASON
        key = self._key(kind, text)
        if key in self._verdicts:
            return True, self._verdicts[key]
        return False, None

    def reason(self, kind: str, text: str) -> str | None:
        """The verdict, checking the grammar if it was not seen (costs up to a few
        hundred milliseconds for a 64 KB grammar: call it off the event loop)."""
        found, verdict = self.known(kind, text)
        if found:
            return verdict
        try:
            (check_ebnf if kind == "ebnf" else check_regex)(text)
            verdict = None
        except GrammarError as exc:
            verdict = (
                f"{exc}; only grammars whose matching costs bounded time per token are "
                "served (`grammars = checked`: LL(1), docs/proxy.md)"
            )
        except RecursionError:
            verdict = "nested too deeply to check"
        key = self._key(kind, text)
        self._verdicts[key] = verdict
        while len(self._verdicts) > VERDICTS:
            del self._verdicts[next(iter(self._verdicts))]
        return verdict

    @staticmethod
    def _key(kind: str, text: str) -> bytes:
        return hashlib.blake2b(
            f"{kind}\x00{text}".encode("utf-8", "surrogatepass"), digest_size=16
        ).digest()
