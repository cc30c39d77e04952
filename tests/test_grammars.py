"""Grammars besides JSON schemas (`prism_proxy.api.grammars`): the LL(1) check that
bounds what matching a grammar costs the engine, and the deployment's policy through
real HTTP (the proxy in front of prism-sim): `off` refuses them, `checked` serves what
the check passes, `on` serves all."""

from __future__ import annotations

import random

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proxy_support import ProxyFactory, proxy_factory_fixture, sim_server

from prism_proxy.api.grammars.ebnf import check_ebnf
from prism_proxy.api.grammars.gate import GrammarGate
from prism_proxy.api.grammars.regex import check_regex
from prism_proxy.api.grammars.rules import GrammarError

sim = pytest.fixture(scope="module")(sim_server)
proxy_factory = pytest.fixture(proxy_factory_fixture)


def layered(depth: int, recursive: bool) -> str:
    """The attack's shape: nested nullable alternatives (xgrammar 0.2.7 took 17.5 s for
    one step of `layered(8, False)` at the tenth character, docs/proxy.md)."""
    head = 'root ::= r0 root | ""' if recursive else "root ::= r0 r0 r0"
    body = [f'r{k} ::= r{k + 1} r{k + 1} | r{k + 1} | ""' for k in range(depth)]
    return "\n".join([head, *body, f'r{depth} ::= [a-z] | ""'])


SERVED_EBNF = [
    # a JSON object with one numeric field, whitespace where JSON allows it
    'root ::= "{" ws "\\"a\\":" ws num ws "}"\nws ::= [ \\t\\n]*\nnum ::= "-"? [0-9]+',
    'root ::= ("yes" | "no")',
    'root ::= item ("," item)*\nitem ::= [a-z]+  # a comma-separated list',
    'root ::= "a"{2,4} "b"',
    'root ::= [^"]* "\\""',
    'root ::= "x" root | "y"',  # right recursion
    'root ::= date\ndate ::= [0-9]{4} "-" [0-9]{2} "-" [0-9]{2}',
    'root ::= "A"\n    "B" # a body continued on the next line\n  | "C"',
    'root ::= "\\u00e9t\\xe9" | [\\u4e00-\\u9fff]+',
]
REFUSED_EBNF = [
    (layered(8, False), "empty text in two ways"),
    (layered(3, True), "left-recursive"),
    ('root ::= r r r\nr ::= root | root root | [a-z] | ""', "left-recursive"),
    ('root ::= a\na ::= a "x" | "y"', "left-recursive"),
    ('root ::= a\na ::= b "x"\nb ::= a | "y"', "left-recursive"),
    ('root ::= ("yes" | "yo")', "start with 'y'"),
    ('root ::= [a-z]* "x"', "both start it and follow it"),
    ('root ::= x x\nx ::= "a" | ""', "both start it and follow it"),
    ("root ::= foo", "not defined"),
    ('root ::= "a"{2000}', "repetition count"),
    ('root ::= "a" (= "b")', "lookahead"),
    ("root ::= TagDispatch(x)", "built-in"),
    ('root ::= "open', "unterminated"),
    ('start ::= "a"', "no rule 'root'"),
]


@pytest.mark.parametrize("grammar", SERVED_EBNF)
def test_deterministic_grammars_pass_the_check(grammar: str) -> None:
    check_ebnf(grammar)


@pytest.mark.parametrize(("grammar", "why"), REFUSED_EBNF)
def test_ambiguous_and_unreadable_grammars_are_refused_with_the_reason(grammar, why) -> None:
    with pytest.raises(GrammarError, match=why):
        check_ebnf(grammar)


@pytest.mark.parametrize(
    "pattern",
    [r"[a-z]+@[a-z]+\.com", r"\d{3}-\d{4}", r"(yes|no)", r"\w+\s\w+", r"(\d+)\.(\d+)",
     r'[^"]*"', r"^[A-Z][a-z]*$", r"(a|ab)c"],
)  # fmt: skip
def test_deterministic_regexes_pass(pattern: str) -> None:
    # (a|ab)c passes: a common prefix is factored (the regex parser does it), which
    # bounds the lookahead by the prefix's length
    check_regex(pattern)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [(r"(a*)*", "left-recursive"), (r".*x", "follow it"), (r"(a?)*", "left-recursive"),
     (r"(?=a)b", "assert"), (r"(a)\1", "groupref"), (r"[a-z]+[a-c]", "follow it"),
     (r"(", "not a regular expression")],
)  # fmt: skip
def test_ambiguous_regexes_are_refused(pattern: str, why: str) -> None:
    with pytest.raises(GrammarError, match=why):
        check_regex(pattern)


# ---- generated grammars: the rule, on inputs nobody wrote by hand -------------------------
def dfa_grammar(rng: random.Random, states: int) -> str:
    """A random deterministic automaton over a-z as right-linear EBNF: every state's
    transitions take disjoint character ranges; an accepting state may also end. Such
    a grammar is LL(1) whatever the automaton."""
    lines = []
    for state in range(states):
        cuts = sorted(rng.sample(range(1, 26), rng.randint(0, 4)))
        bounds = list(zip([0, *cuts], [*cuts, 26], strict=True))
        alternatives = []
        for low, high in bounds:
            if rng.random() < 0.3:
                continue  # no transition on this range
            target = rng.randrange(states)
            name = "root" if target == 0 else f"s{target}"
            alternatives.append(f"[{chr(97 + low)}-{chr(96 + high)}] {name}")
        if rng.random() < 0.5 or not alternatives:
            alternatives.append('""')
        lines.append(f"{'root' if state == 0 else f's{state}'} ::= {' | '.join(alternatives)}")
    return "\n".join(lines)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12))
def test_every_deterministic_automaton_passes(seed: int, states: int) -> None:
    check_ebnf(dfa_grammar(random.Random(seed), states))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 12))
def test_an_automaton_with_two_ways_on_one_character_is_refused(seed: int, states: int) -> None:
    rng = random.Random(seed)
    grammar = dfa_grammar(rng, states)
    char = chr(rng.randrange(97, 123))
    # a second way out of the start state on a character it may already take
    lines = grammar.splitlines()
    lines[0] = lines[0] + f' | "{char}" root | "{char}"'
    with pytest.raises(GrammarError, match="deterministic"):
        check_ebnf("\n".join(lines))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.booleans())
def test_every_layered_nullable_grammar_is_refused(depth: int, recursive: bool) -> None:
    with pytest.raises(GrammarError):
        check_ebnf(layered(depth, recursive))


def test_a_large_grammar_is_bounded_by_its_expanded_size() -> None:
    with pytest.raises(GrammarError, match="too large"):
        check_ebnf("root ::= " + " ".join(["[a-z]{999}"] * 60))
    # a repetition of a group repeats one reference to it: linear, served
    check_ebnf('root ::= ("a" [b-z]{900}){100}')


def test_the_gate_remembers_verdicts_by_digest_and_stays_bounded() -> None:
    gate = GrammarGate("checked")
    assert gate.known("ebnf", 'root ::= "a"') == (False, None)
    assert gate.reason("ebnf", 'root ::= "a"') is None
    assert gate.known("ebnf", 'root ::= "a"') == (True, None)
    for i in range(5000):
        gate.reason("regex", f"a{i}")
    assert len(gate._verdicts) <= 4096
    assert GrammarGate("off").reason("regex", "a") is not None
    assert GrammarGate("on").reason("ebnf", layered(8, False)) is None
    assert "grammars = on" in (GrammarGate("checked").reason("structural_tag", "{}") or "")


# ---- the policy through real HTTP ---------------------------------------------------------
COMPLETION = {"model": "m", "prompt": "Answer:", "max_tokens": 4}
ANSWERS = [
    ("/v1/completions", {**COMPLETION, "ebnf": 'root ::= ("yes" | "no")'}, "ebnf"),
    ("/v1/completions", {**COMPLETION, "regex": r"\d{3}"}, "regex"),
    (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
         "ebnf": 'root ::= [a-z]+ "."'},
        "ebnf",
    ),
    (
        "/generate",
        {"text": "Answer:", "sampling_params": {"max_new_tokens": 4, "regex": "(yes|no)"}},
        "sampling_params.regex",
    ),
]  # fmt: skip
AMBIGUOUS = [
    ("/v1/completions", {**COMPLETION, "ebnf": layered(8, False)}, "ebnf"),
    (
        "/generate",
        {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 4, "ebnf": layered(4, True)}},
        "sampling_params.ebnf",
    ),
    (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}],
         "response_format": {"type": "structural_tag", "structures": [], "triggers": []}},
        "response_format",
    ),
]  # fmt: skip


async def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as r:
        return r.status, await r.json()


async def test_grammars_are_refused_by_default(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory()
    for path, body, param in ANSWERS + AMBIGUOUS:
        status, answer = await post(proxy.url, path, body)
        assert status == 400, (path, answer)
        assert answer["error"]["param"] == param
        assert "setting `grammars`" in answer["error"]["message"] or param == "response_format"
    # JSON schemas are not grammars of this kind: still served
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "string"}}}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, _ = await post(proxy.url, "/v1/chat/completions", {**chat, "response_format": schema})
    assert status == 200


async def test_checked_serves_deterministic_grammars_and_refuses_the_rest(
    proxy_factory: ProxyFactory,
) -> None:
    proxy = await proxy_factory(grammars="checked")
    for path, body, _ in ANSWERS:
        status, answer = await post(proxy.url, path, body)
        assert status == 200, (path, answer)
    for path, body, param in AMBIGUOUS:
        status, answer = await post(proxy.url, path, body)
        assert status == 400, (path, answer)
        assert answer["error"]["param"] == param
    # a large grammar is judged off the event loop, then remembered
    big = "root ::= " + " | ".join(f'"{chr(0x4E00 + i)}" [a-z]{{1,3}}' for i in range(600))
    for _ in range(2):
        status, answer = await post(proxy.url, "/v1/completions", {**COMPLETION, "ebnf": big})
        assert status == 200, answer


async def test_on_serves_every_grammar(proxy_factory: ProxyFactory) -> None:
    proxy = await proxy_factory(grammars="on")
    status, answer = await post(proxy.url, *AMBIGUOUS[0][:2])
    assert status == 200, answer
