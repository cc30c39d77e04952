"""xgrammar's EBNF dialect read into `Rules` and checked (`check_ebnf`): rules
`name ::= ...`, `"strings"`, `[classes]`, groups, `| * + ? {m,n}`, `#` comments; the
start rule is `root`.
"""

from __future__ import annotations

import re

from prism_proxy.api.grammars.ll1 import check_ll1
from prism_proxy.api.grammars.rules import (
    MAX_CODE_POINT,
    GrammarError,
    Ranges,
    Rules,
    Sequence_,
    Symbol,
    char_set,
    complement,
)

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
