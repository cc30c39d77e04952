"""Documents in a tool's result (an agent's retrieval), served in one order for the
whole session.

An agent that retrieves through a tool (an assistant tool call, then a `tool` message
holding the documents) re-sends that message in every later call of its session. The
proxy finds the documents of a tool message as it does in a user message
(`extraction.extract`: tags, numbered labels, headers; blank-line blocks only as the
units the client's evidence allows, `prompts.evidence`), or as a list of two or more
results that each hold a text field (`TEXT_FIELDS`): a JSON array, an array that is the
one such member of a JSON object (`{"query": ..., "results": [...]}`), or the same
written as a Python literal (what an agent SDK sends when a tool returns a list or a
dict: `str(value)`). A tool message whose content is two or more text parts (a tool
that returned several texts) has one document per part. Then:

* **The first time** a client sends a tool message, its documents are served most
  popular first (the documents seen in more tool results before, then a global hash
  order, as QAS's canonical ties): sessions that retrieved the same documents share the
  longest prefix in the engine's cache, whoever ran them.
* **Every later time** (the same client, the same content) they are served in the
  order chosen the first time (`arrangements`), so the session's history stays one
  cached prefix and the model reads the history it read before.

The text of each document never changes: only their order, and a numbered layout's
labels, which follow positions ("[1] " is always the first document served). What sits
between documents (a separator, a JSON comma) stays where it was. Both records (the
order of each tool message, how often each document was seen) are bounded in bytes
(`ByteLRU`); a forgotten order is chosen again, which costs reuse, never correctness.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from prism_proxy.prompts.evidence import BlockEvidence, ScopedEvidence, block_key
from prism_proxy.prompts.extraction import extract
from prism_proxy.qas.alignment import canonical_key
from prism_tokens.byte_lru import ByteLRU

# Fields of a JSON search result that hold its text (LangChain's `page_content`,
# LlamaIndex's `text`, most search APIs' `content` or `snippet`).
TEXT_FIELDS = ("text", "content", "page_content", "snippet", "body", "chunk")
MAX_DOCUMENTS = 256
KEY_BYTES = 16
LITERAL_MAX_CHARS = 1 << 20  # larger Python-literal text is not parsed (its tree's memory)


@dataclass(frozen=True, slots=True)
class Movable:
    """A text as fixed parts and documents that may trade places:

        head + label(1) + items[0] + gaps[0] + label(2) + items[1] + gaps[1] + ... + tail

    `gaps[k]` (what follows the k-th document) stays with position k; `label_format`
    ("[{n}] "), when set, labels each position."""

    head: str
    items: tuple[str, ...]
    gaps: tuple[str, ...]
    tail: str
    label_format: str | None = None

    @classmethod
    def of_spans(cls, text: str, spans: Sequence[tuple[int, int]]) -> Movable:
        """`text` with the items at `spans` (in order, apart); what lies between two
        stays with the position after the first."""
        gaps = tuple(text[end:begin] for (_, end), (begin, _) in pairwise(spans))
        return cls(
            head=text[: spans[0][0]],
            items=tuple(text[a:b] for a, b in spans),
            gaps=(*gaps, ""),
            tail=text[spans[-1][1] :],
        )

    def compose(self, order: Sequence[int]) -> str:
        parts = [self.head]
        for position, index in enumerate(order):
            if self.label_format is not None:
                parts.append(self.label_format.replace("{n}", str(position + 1)))
            parts.append(self.items[index])
            parts.append(self.gaps[position])
        parts.append(self.tail)
        return "".join(parts)


def result_documents(text: str) -> Movable | None:
    """The results of a tool's structured output (module doc), each kept as written:
    JSON first, else a Python literal; None when it is neither."""
    return json_documents(text) or json_member_documents(text) or literal_documents(text)


def json_member_documents(text: str) -> Movable | None:
    """A JSON object with exactly one member that `json_documents` reads, with that
    member's results; None otherwise."""
    start = len(text) - len(text.lstrip())
    if not text.startswith("{", start):
        return None
    decoder = json.JSONDecoder()
    found: tuple[Movable, int, int] | None = None  # the results, where their array is
    at = _skip_space(text, start + 1)
    try:
        while not text.startswith("}", at):
            name, at = decoder.raw_decode(text, at)
            at = _skip_space(text, at)
            if not isinstance(name, str) or not text.startswith(":", at):
                return None
            begin = _skip_space(text, at + 1)
            _, end = decoder.raw_decode(text, begin)
            member = json_documents(text[begin:end]) if text.startswith("[", begin) else None
            if member is not None:
                if found is not None:
                    return None  # two lists of results: which one is ambiguous
                found = (member, begin, end)
            at = _skip_space(text, end)
            if text.startswith(",", at):
                at = _skip_space(text, at + 1)
            elif not text.startswith("}", at):
                return None
    except (ValueError, RecursionError):
        return None
    if found is None or text[at + 1 :].strip():
        return None
    member, begin, end = found
    return replace(member, head=text[:begin] + member.head, tail=member.tail + text[end:])


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


# Escapes: one that Python does not define makes text no Python literal an SDK wrote
# (and would make the parser warn).
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
_ESCAPED = frozenset("\\'\"abfnrtvxuUN01234567\n")


def literal_documents(text: str) -> Movable | None:
    """A Python literal list of two or more dicts that each hold a string under one of
    `TEXT_FIELDS`, or a dict with exactly one such list among its values (what
    `str(value)` writes), each element kept as written; None otherwise. The text is
    parsed (`ast.parse`), never evaluated."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{" or stripped[-1] not in "]}":
        return None
    if len(stripped) > LITERAL_MAX_CHARS or _nodes_past_bound(stripped):
        return None
    if any(match.group(1) not in _ESCAPED for match in _ESCAPE.finditer(text)):
        return None
    try:
        tree = ast.parse(stripped, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    lists = [tree] if isinstance(tree, ast.List) else []
    if isinstance(tree, ast.Dict):
        lists = [value for value in tree.values if isinstance(value, ast.List)]
    lists = [node for node in lists if _literal_results(node)]
    if len(lists) != 1:
        return None
    elements = lists[0].elts
    if len(elements) > MAX_DOCUMENTS:
        return None
    offset = len(text) - len(text.lstrip())
    encoded = stripped.encode("utf-8", "surrogatepass")
    line_starts = [0]  # the parser's lines (it reads "\r\n" and "\r" as "\n" too)
    for line in encoded.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    try:
        # byte offsets in `stripped` (the parser's columns are UTF-8 bytes), increasing
        marks = [
            line_starts[line - 1] + column
            for e in elements
            for line, column in ((e.lineno, e.col_offset), (e.end_lineno, e.end_col_offset))
            if line is not None and column is not None
        ]
        if len(marks) != 2 * len(elements) or marks != sorted(marks):
            return None
        chars, done, at = [], 0, 0
        for mark in marks:  # to characters, decoding each byte once
            done += len(encoded[at:mark].decode("utf-8", "surrogatepass"))
            chars.append(offset + done)
            at = mark
    except (UnicodeDecodeError, IndexError):
        return None
    spans = list(zip(chars[::2], chars[1::2], strict=True))
    if not all(text.startswith("{", a) and text.endswith("}", a, b) for a, b in spans):
        return None  # not the elements' text: never move what is not one
    return Movable.of_spans(text, spans)


def _nodes_past_bound(text: str) -> bool:
    """Whether `text` may parse to more nodes than results of at most `MAX_DOCUMENTS`
    elements need (so that no text makes the parser build a large tree for nothing):
    dicts and lists by their brackets, items by their commas (prose in strings has
    about one comma in 80 characters)."""
    brackets = text.count("{") + text.count("[")
    return brackets > 16 * MAX_DOCUMENTS or text.count(",") > 256 * MAX_DOCUMENTS


def _literal_results(node: ast.List) -> bool:
    """Two or more dicts, each with a string constant under a `TEXT_FIELDS` key."""

    def has_text(element: ast.expr) -> bool:
        if not isinstance(element, ast.Dict):
            return False
        return any(
            isinstance(key, ast.Constant)
            and key.value in TEXT_FIELDS
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
            for key, value in zip(element.keys, element.values, strict=True)
        )

    return len(node.elts) >= 2 and all(has_text(element) for element in node.elts)


def json_documents(text: str) -> Movable | None:
    """A JSON array of two or more objects that each hold a string under one of
    `TEXT_FIELDS`, each element kept as written; None otherwise."""
    start = len(text) - len(text.lstrip())
    if not text.startswith("[", start):
        return None
    decoder = json.JSONDecoder()
    spans: list[tuple[int, int]] = []
    at = start + 1
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at < len(text) and text[at] == "]" and not spans:
            return None  # empty
        try:
            value, end = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            return None
        if not isinstance(value, dict) or not any(
            isinstance(value.get(field), str) for field in TEXT_FIELDS
        ):
            return None
        spans.append((at, end))
        if len(spans) > MAX_DOCUMENTS:
            return None
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
        if at < len(text) and text[at] == ",":
            at += 1
            continue
        if at < len(text) and text[at] == "]":
            break
        return None
    if len(spans) < 2 or text[at + 1 :].strip():
        return None
    return Movable.of_spans(text, spans)


# How an uncertain layout's blocks were grouped the first time: the blocks kept in front,
# the first block of each movable unit, the blocks kept at the end.
Structure = tuple[int, tuple[int, ...], int]


def found_documents(
    text: str,
    layouts: Collection[str],
    evidence: BlockEvidence | ScopedEvidence | None,
    structure: Structure | None = None,
) -> tuple[Movable | None, Structure | None]:
    """The documents of a tool message's text in a layout `extract` knows, and, for
    blank-line blocks (an uncertain layout), how they were grouped: the units the
    evidence allows (the ones that only ever opened or closed the list kept in place),
    or the `structure` given (the grouping of the message's first sighting)."""
    found = extract(text, layouts)
    if found is None:
        return None, None
    found = found.with_no_question()  # no question follows a tool's documents
    documents = list(found.documents)
    bodies = [d.rstrip() for d in documents]
    gaps = [d[len(b) :] for d, b in zip(documents, bodies, strict=True)]
    if found.certain:  # numbered labels follow positions (`label_format`)
        movable = Movable(
            found.preamble, tuple(bodies), tuple(gaps), found.suffix, found.label_format
        )
        return movable, None
    if structure is None:
        if evidence is None:
            return None, None
        judged = evidence.judge(documents)
        lead, tail = judged.in_place()
        starts = tuple(u.start for u in judged.units() if lead <= u.start < tail)
        structure = (lead, starts, len(documents) - tail)
    lead, starts, tail = structure
    stops = (*starts[1:], len(documents) - tail)
    if len(starts) < 2 or lead > starts[0] or stops[-1] < starts[-1]:
        return None, structure
    units = [range(a, b) for a, b in zip(starts, stops, strict=True)]
    items = []
    for unit in units:
        written = "".join(documents[i] for i in unit)
        items.append(written[: len(written) - len(gaps[unit.stop - 1])])
    movable = Movable(
        head=found.preamble + "".join(documents[:lead]),
        items=tuple(items),
        gaps=tuple(gaps[u.stop - 1] for u in units),
        tail="".join(documents[len(documents) - tail :]) + found.suffix,
    )
    return movable, structure


def _size(key: bytes, value: Any) -> int:
    return sys.getsizeof(key) + sys.getsizeof(value)


@dataclass(frozen=True, slots=True)
class Served:
    """How a tool message was served the first time: its documents' order (None: as
    the client wrote it) and, for blank-line blocks, their grouping."""

    order: tuple[int, ...] | None
    structure: Structure | None


class ToolResults:
    """How each client's tool messages were first served, and how often each document
    was seen; bounded in bytes, thread-safe."""

    def __init__(self, capacity_bytes: int) -> None:
        self._served: ByteLRU[bytes, Served] = ByteLRU(capacity_bytes // 2, _size)
        self._seen: ByteLRU[bytes, int] = ByteLRU(capacity_bytes - capacity_bytes // 2, _size)
        self._lock = threading.Lock()
        self.arranged = 0
        self.repeated = 0

    def serve(
        self,
        scope: bytes,
        text: str,
        layouts: Collection[str],
        evidence: BlockEvidence | ScopedEvidence,
    ) -> str:
        """The text to serve for the tool message `text` of the client `scope`."""
        key = self._key(scope, text)
        with self._lock:
            served = self._served.get(key)
        if served is not None:
            if served.order is None:
                return text
            documents = result_documents(text)
            if documents is None:
                documents, _ = found_documents(text, layouts, None, served.structure)
            if documents is None or len(documents.items) != len(served.order):
                return text  # cannot happen for the same text: served as written
            with self._lock:
                self.repeated += 1
            return documents.compose(served.order)
        structure = None
        documents = result_documents(text)
        if documents is None:
            documents, structure = found_documents(text, layouts, evidence)
        if documents is None:
            with self._lock:
                self._served.put(key, Served(None, None))
            return text
        return documents.compose(self._first_order(key, documents.items, structure))

    def serve_parts(self, scope: bytes, texts: Sequence[str]) -> tuple[int, ...]:
        """The order to serve the text parts `texts` of a tool message of the client
        `scope` in, one document per part."""
        key = self._key(scope, "\x00parts\x00".join(["", *texts]))
        with self._lock:
            served = self._served.get(key)
            if served is not None and served.order is not None:
                self.repeated += 1
                return served.order
        return self._first_order(key, texts, None)

    @staticmethod
    def _key(scope: bytes, text: str) -> bytes:
        return hashlib.blake2b(
            text.encode("utf-8", "surrogatepass"), digest_size=KEY_BYTES, key=scope[:64]
        ).digest()

    def _first_order(
        self, key: bytes, items: Sequence[str], structure: Structure | None
    ) -> tuple[int, ...]:
        """The first sighting's order: most often seen first, then the canonical order;
        recorded under `key`, and each document counted."""
        keys = [block_key(item.lstrip()) for item in items]
        with self._lock:
            counts = [self._seen.get(k) or 0 for k in keys]
            order = tuple(
                sorted(
                    range(len(keys)),
                    key=lambda i: (-counts[i], canonical_key(items[i].strip())),
                )
            )
            for k, count in zip(keys, counts, strict=True):
                self._seen.put(k, count + 1)
            self._served.put(key, Served(order, structure))
            self.arranged += 1
        return order

    def stats(self) -> dict[str, int]:
        with self._lock:
            served, seen = self._served.stats(), self._seen.stats()
            return {
                "entries": served["entries"] + seen["entries"],
                "bytes": served["bytes"] + seen["bytes"],
                "capacity_bytes": served["capacity_bytes"] + seen["capacity_bytes"],
                "arranged": self.arranged,
                "repeated": self.repeated,
            }


def arrange_tool_messages(
    messages: list[dict[str, Any]],
    *,
    layouts: Collection[str],
    evidence: ScopedEvidence,
    results: ToolResults,
) -> None:
    """Serve the documents of every `tool` message with text content in its
    session's order (module doc), in place."""
    for message in messages:
        content = message.get("content")
        if message.get("role") != "tool" or not layouts:
            continue
        if isinstance(content, str):
            message["content"] = results.serve(evidence.scope, content, layouts, evidence)
        elif isinstance(content, list) and MAX_DOCUMENTS >= len(content) >= 2:
            texts = [_text_part(part) for part in content]
            if all(text is not None and text.strip() for text in texts):
                order = results.serve_parts(evidence.scope, [t or "" for t in texts])
                message["content"] = [content[i] for i in order]


def _text_part(part: Any) -> str | None:
    """The text of a content part that is only text, else None."""
    if not isinstance(part, dict) or part.get("type") != "text":
        return None
    text = part.get("text")
    return text if isinstance(text, str) else None
