"""The LL(1) check over characters (`check_ll1`): every rule's alternatives start with
disjoint characters, at most one may be empty, and an empty one's rule is not followed
by a character another alternative starts with (the package docstring says why).
"""

from __future__ import annotations

from prism_proxy.api.grammars.rules import (
    END,
    GrammarError,
    Ranges,
    Rules,
    Sequence_,
    char_set,
    overlap,
)


def _show(point: int) -> str:
    return "the end" if point == END else repr(chr(point))


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
