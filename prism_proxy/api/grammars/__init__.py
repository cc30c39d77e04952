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

Modules: `rules` (character sets and the desugared grammar both readers build), `ll1`
(the check), `ebnf` and `regex` (the readers, `check_ebnf` and `check_regex`), `gate`
(the deployment's policy, `GrammarGate`).
"""
