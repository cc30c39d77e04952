"""The `numbered` layout of `prompts.extraction`: documents under numbered labels
("[1] ", "Document 2:", "(3)", "**Source 4**:"), each label one of a family counted
1, 2, 3, ... in one format.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from itertools import pairwise

from prism_proxy.prompts.document_spans import Extraction, close_last

_NUMBER = "[1-9][0-9]{0,5}"
# Nouns that name a retrieved document in a numbered label ("Document 1:", "Search
# result [2]", "Chunk #3"); sequences whose order means something (steps, questions,
# examples, rules) are deliberately not among them.
DOCUMENT_NOUNS = (
    "document",
    "doc",
    "source",
    "passage",
    "context",
    "chunk",
    "result",
    "reference",
    "ref",
    "excerpt",
    "snippet",
    "article",
    "citation",
    "evidence",
    "record",
    "entry",
    "page",
    "file",
    "node",
    "text",
    "fact",
    "paragraph",
    "content",
    "information",
)
_NUMBERED_MARKER = re.compile(
    r"^[ \t]{0,16}+(?=[\[(#<*_0-9A-Za-z])"  # indented as a template's loop writes it
    r"(?P<em>\*\*|__|\*)?"
    r"(?P<outer>[\[(](?=[A-Za-z]))?"  # brackets around a named label: "[Document 1]"
    r"(?P<word>(?:[A-Za-z]{1,24}+ )?(?i:" + "|".join(DOCUMENT_NOUNS) + r")s?[ \t]?)?"
    r"(?P<open>[\[(#<])?"
    rf"(?P<number>{_NUMBER})"
    r"(?(open)(?P<close>[\])>])?)"
    r"(?(outer)(?P<outer_close>[\])])?)"
    r"(?P<em1>\*\*|__|\*)?"  # emphasis closed before the punctuation: "**Source 1**:"
    r"(?P<punct>[:.)]|[ \t]?[-–—](?=[ \t]))?"
    r"(?P<em2>\*\*|__|\*)?"
    r"(?:[ \t]+|(?=\n)|\Z)",
    re.M,
)
_PAIRS = {"[": "]", "(": ")", "<": ">", "#": None, None: None}


def _marker_family(marker: re.Match[str]) -> int | None:
    """How strongly a label says "document": 0 a document noun or a bracket ("Source
    1:", "[1]", "#1"), 1 a parenthesis ("(1)"), 2 a bare number ("1.", "1)"); None when
    the label is not well formed (unpaired brackets or emphasis, a bare number without
    punctuation)."""
    opened, closed = marker.group("open"), marker.group("close")
    outer = marker.group("outer")
    em_closes = [em for em in (marker.group("em1"), marker.group("em2")) if em]
    if _PAIRS[opened] != closed or len(em_closes) > 1:
        return None
    if marker.group("em") != (em_closes[0] if em_closes else None):
        return None
    if outer is not None and (
        not marker.group("word") or _PAIRS[outer] != marker.group("outer_close")
    ):
        return None
    if marker.group("word") or opened in ("[", "#", "<"):
        return 0
    if opened == "(":
        return 1
    return 2 if marker.group("punct") in (".", ")", ":") else None


def find_numbered(
    text: str, min_documents: int, max_documents: int, _: Collection[str]
) -> Extraction | None:
    # label format (the label with "{n}") -> its markers, by family
    families: list[dict[str, list[re.Match[str]]]] = [{}, {}, {}]
    for marker in _NUMBERED_MARKER.finditer(text):
        family = _marker_family(marker)
        if family is None:
            continue
        start, (number_start, number_end) = marker.start(), marker.span("number")
        label = marker.group(0)
        form = label[: number_start - start] + "{n}" + label[number_end - start :]
        found = families[family].setdefault(form, [])
        if len(found) <= max_documents:  # one more tells "too many"
            found.append(marker)
    for formats in families:
        listed = {
            form: markers
            for form, markers in formats.items()
            if len(markers) >= 2 or (markers and min_documents == 1)
        }
        if not listed:
            continue  # a lone marker is text
        numbered = [
            (markers[0].start(), form, markers)
            for form, markers in listed.items()
            if min_documents <= len(markers) <= max_documents
            and all(m.group("number") == str(i) for i, m in enumerate(markers, 1))
        ]
        if not numbered:
            return None  # a number skipped or repeated, or too many: a collision
        _, form, markers = min(numbered, key=lambda item: item[0])  # the outermost list
        documents = [
            text[marker.end() : following.start()] for marker, following in pairwise(markers)
        ]
        end = close_last(text, markers[-1].end(), documents)
        documents.append(text[markers[-1].end() : end])
        if any(not doc.strip() for doc in documents):
            return None
        labels = tuple(marker.group(0) for marker in markers)
        preamble = text[: markers[0].start()]
        return Extraction("numbered", preamble, tuple(documents), text[end:], labels, form, True)
    return None
