"""Documents in a tool's result (an agent's retrieval), served in one order for the
whole session.

An agent that retrieves through a tool (an assistant tool call, then a `tool` message
holding the documents) re-sends that message in every later call of its session. The
proxy finds the documents of a tool message as it does in a user message
(`extraction.extract`: tags, numbered labels, headers; blank-line blocks only as the
units the client's evidence allows, `prompts.evidence`), or as a JSON array of two or
more objects that each hold a text field (`TEXT_FIELDS`). Then:

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

import hashlib
import json
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

    def compose(self, order: Sequence[int]) -> str:
        parts = [self.head]
        for position, index in enumerate(order):
            if self.label_format is not None:
                parts.append(self.label_format.replace("{n}", str(position + 1)))
            parts.append(self.items[index])
            parts.append(self.gaps[position])
        parts.append(self.tail)
        return "".join(parts)


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
    gaps = tuple(text[end:begin] for (_, end), (begin, _) in pairwise(spans))
    return Movable(
        head=text[: spans[0][0]],
        items=tuple(text[a:b] for a, b in spans),
        gaps=(*gaps, ""),
        tail=text[spans[-1][1] :],
    )


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
    if found.layout == "blank" and found.suffix.strip():
        # no question follows a tool's documents: the last block is one of them
        found = replace(found, documents=(*found.documents, found.suffix), suffix="")
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
        key = hashlib.blake2b(
            text.encode("utf-8", "surrogatepass"), digest_size=KEY_BYTES, key=scope[:64]
        ).digest()
        with self._lock:
            served = self._served.get(key)
        if served is not None:
            if served.order is None:
                return text
            documents = json_documents(text)
            if documents is None:
                documents, _ = found_documents(text, layouts, None, served.structure)
            if documents is None or len(documents.items) != len(served.order):
                return text  # cannot happen for the same text: served as written
            with self._lock:
                self.repeated += 1
            return documents.compose(served.order)
        structure = None
        documents = json_documents(text)
        if documents is None:
            documents, structure = found_documents(text, layouts, evidence)
        if documents is None:
            with self._lock:
                self._served.put(key, Served(None, None))
            return text
        keys = [block_key(item.lstrip()) for item in documents.items]
        with self._lock:
            counts = [self._seen.get(k) or 0 for k in keys]
            order = tuple(
                sorted(
                    range(len(keys)),
                    key=lambda i: (-counts[i], canonical_key(documents.items[i].strip())),
                )
            )
            for k, count in zip(keys, counts, strict=True):
                self._seen.put(k, count + 1)
            self._served.put(key, Served(order, structure))
            self.arranged += 1
        return documents.compose(order)

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
        if message.get("role") == "tool" and isinstance(content, str) and layouts:
            message["content"] = results.serve(evidence.scope, content, layouts, evidence)
