"""Documents inside one message's text, found from its layout (SPEC §1 "Requests without
hints are segmented by the proxy").

`extract(text)` returns the message cut into a preamble, documents and a suffix, or None
when no layout fits. It never changes the text: for every layout but `numbered`,

    preamble + "".join(documents) + suffix == text

and for `numbered` each document is the text after its label (kept in `labels`, with
`label_format.format(n=i) == labels[i - 1]`), so that the same document under another
number has the same text:

    preamble + "".join(label + doc for label, doc in zip(labels, documents)) + suffix == text

A document's text ends with its separator (the whitespace after it), so reordering
documents moves each with its own separator.

Layouts, tried in this order (the first that fits wins):

* `xml`: two or more sibling elements `<T ...>...</T>` of one known tag name T (case
  matters), with only whitespace between them. T's tags must alternate open, close, open,
  close over the whole text (unbalanced or nested same-name tags: not T). Tags of another
  known name that are balanced must not cross a document's boundary (overlap: not T);
  unbalanced ones (HTML's void `<source>`, a stray `<doc>` quoted in prose) are text.
  Any wrapping (`<documents>...</documents>`) goes to the preamble and the suffix. When
  several names qualify, the one whose first element starts first (the outermost) wins.
  Else one element of a known name that wraps the documents (`<context>`, as LangChain's
  retrieval-QA chat prompt writes it) holds them as a dashed block does (below).
* `dashed`: the first line made of 3+ of one of `-`, `=`, `*` opens a block; the last
  line identical to it closes it (LlamaIndex's text-QA template). The preamble runs
  through the opening rule's newline, the suffix starts at the closing rule. Inside, a
  certain layout (xml, numbered, markdown) that covers the whole block is used as such;
  otherwise the documents are the block's blank-line blocks (certain=False), or one
  document (certain) when it has no blank line.
* `numbered`: lines starting (after at most 16 spaces or tabs, as a template's loop
  indents them) with a label numbered 1, 2, 3, ... in one format: a
  number, bare (`n. `, `n) `, `n: `), in brackets (`[n]`, `(n)`, `<n>`, `#n`) or
  after a word naming a document (`Document n:`, `Source [n]`, `Search result n -`,
  `Chunk #n`: `DOCUMENT_NOUNS`, any case, an optional word before it; such a named
  label may itself be in brackets, `[Document n]`), optionally in markdown emphasis
  (`**Document n:**`, `**Document n**:`), followed by a space or the line's end (a
  label on its own line). Families are tried in order: a document word or a bracket,
  then a parenthesis, then a bare number (so a numbered list of instructions before
  `[1]` documents stays text). In the first family with two or more labels of one
  format, the formats numbered exactly 1..k compete and the one that starts first
  (the outermost list) wins; if none is, there is a numbering collision (None). A
  document runs from after its label to the next label's line.
* `markdown`: ATX headers `## `..`###### ` outside fenced code; the documents are the
  headers of one level L, each running to the next. L is the level with the most headers
  among those with no shallower header (`# ` included) between their first and last;
  ties go to the deeper level. A shallower header after the last document ends it.
* `blank`: blocks separated by blank lines (a run of blank lines is one separator, kept
  in the preceding document). The last block is the suffix; the preamble holds only
  the blank lines before the first block, which may be an instruction: evidence across
  requests (`prism_proxy.prompts.evidence`) tells it apart.

Where the last document ends (numbered, and markdown without a shallower header after
it), with "paragraph" meaning text between blank lines:

    earlier documents single-paragraph -> at the first blank line after its label
                                          (none: at the end of its label's line if every
                                          earlier document is one line, else at the end)
    earlier documents multi-paragraph  -> before the text's final paragraph, which is
                                          the suffix (the question), or at the end

Then it takes a separator: the one every earlier document ends with, when the text
continues with it (so "[1] a\n[2] b\n[3] c\n\nQ?" gives "c\n" and the suffix "\nQ?",
and reordering keeps the list well formed); otherwise the blank lines that follow it.

Fewer than `min_documents` or more than `max_documents` documents: the layout does not
fit ("nothing found" rather than a guess), and so does a text with more than
`MAX_MARKUP_PER_DOCUMENT` known tags (or headers) per allowed document. Every finder is
a constant number of linear passes: `str.find`/`rfind`, and regular expressions
anchored at line starts or at a literal character whose repetitions cannot backtrack
over more than one line or one tag (`python -m bench.extraction` prints ms per MB).
Whitespace is Python's (`str.isspace`); lines end at "\n".
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

ALL_LAYOUTS = ("xml", "dashed", "numbered", "markdown", "blank")
XML_TAG_NAMES = (
    "document",
    "doc",
    "context",
    "source",
    "passage",
    "result",
    "chunk",
    "article",
    "search_result",
    "snippet",
    "file",
)


@dataclass(frozen=True, slots=True)
class Extraction:
    """One message's text as preamble, documents and suffix (invariants: module doc)."""

    layout: str  # "xml" | "numbered" | "markdown" | "dashed" | "blank"
    preamble: str  # text before the first document (instructions, an opening rule ...)
    documents: tuple[str, ...]  # each with its trailing separator ("</doc>\n", "\n\n")
    suffix: str  # everything after the last document's separator (the question ...)
    labels: tuple[str, ...] | None  # numbered only: each label as written ("[3] ")
    label_format: str | None  # numbered only: the label with "{n}" ("[{n}] ")
    certain: bool  # the layout fixes the boundaries (not blank-line blocks)

    def with_no_question(self) -> Extraction:
        """This extraction of a text that no question follows (documents in a system
        message, a tool's result): blank-line blocks' last block is a document too."""
        if self.layout != "blank" or not self.suffix.strip():
            return self
        return replace(self, documents=(*self.documents, self.suffix), suffix="")


# Whitespace is Python's (`str.isspace`, regex `\s`); lines end at "\n" only.
# A blank-line separator: from the newline that ends a line through the newline that
# ends the last of the whitespace-only lines after it (`\s*` backtracks at most over
# the next line's indentation).
_SEPARATOR = re.compile(r"\n\s*\n")
_SPACES = re.compile(r"\s*")
_RULE = re.compile(r"^(?:-{3,}+|={3,}+|\*{3,}+)[^\S\n]*+$", re.M)  # possessive: no backtracking
# Each line-start pattern first checks the line's first character (a lookahead that
# costs one test per line), then tries its alternatives.
_MARKDOWN_LINE = re.compile(r"^(?=[`~#])(?:(?P<fence>```|~~~)|(?P<hashes>#{1,6})[ \t]+\S)", re.M)
_XML_TAG = re.compile(
    r"<(/?)(" + "|".join(sorted(XML_TAG_NAMES, key=len, reverse=True)) + r")(?=[\s/>])"
    r"([^<>]{0,4096})>"
)
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


# Known tags or headers per allowed document past which a text is not a layout.
MAX_MARKUP_PER_DOCUMENT = 64

Finder = Callable[[str, int, int, Collection[str]], Extraction | None]


def extract(
    text: str,
    layouts: Collection[str] = ALL_LAYOUTS,
    *,
    min_documents: int = 2,
    max_documents: int = 256,
) -> Extraction | None:
    """The documents of `text` in the first of `layouts` (in `ALL_LAYOUTS` order) that
    fits, or None."""
    unknown = set(layouts) - set(ALL_LAYOUTS)
    if unknown:
        raise ValueError(f"unknown layouts: {sorted(unknown)}")
    if not 1 <= min_documents <= max_documents:
        raise ValueError("need 1 <= min_documents <= max_documents")
    for name in ALL_LAYOUTS:
        if name in layouts:
            found = _FINDERS[name](text, min_documents, max_documents, layouts)
            if found is not None:
                return found
    return None


def _ends_with(doc: str) -> str:
    return doc[len(doc.rstrip()) :]


def _attach_separator(text: str, content_end: int, earlier: Sequence[str]) -> int:
    """The end of the last document whose content ends at `content_end`: the separator
    all earlier documents end with if the text continues with it, else the whitespace
    lines that follow."""
    separators = {_ends_with(doc) for doc in earlier}
    if len(separators) == 1:
        separator = separators.pop()
        if separator and text.startswith(separator, content_end):
            return content_end + len(separator)
    return _through_blank_lines(text, content_end)


def _close_last(text: str, start: int, earlier: Sequence[str]) -> int:
    """Where the last document, starting at `start`, ends (module doc)."""
    interiors = [doc.rstrip() for doc in earlier]
    text_end = len(text.rstrip())
    if any(_SEPARATOR.search(interior) for interior in interiors):
        content_end = text_end
        for final in _SEPARATOR.finditer(text, start, text_end):
            content_end = final.start()
    else:
        blank = _SEPARATOR.search(text, start)
        if blank is not None:
            content_end = blank.start()
        elif all("\n" not in interior for interior in interiors):
            line_end = text.find("\n", start)
            content_end = len(text) if line_end < 0 else line_end
        else:
            content_end = text_end
    return _attach_separator(text, content_end, earlier)


def _block_starts(text: str, start: int, end: int, max_blocks: int) -> list[int] | None:
    """Where the blank-line blocks of text[start:end] start (`start` begins a non-blank
    line); blank lines after the last block stay in it. None past `max_blocks`."""
    content_end = start + len(text[start:end].rstrip())
    starts = [start]
    for separator in _SEPARATOR.finditer(text, start, content_end):
        starts.append(separator.end())
        if len(starts) > max_blocks:
            return None
    return starts


def _through_blank_lines(text: str, start: int, end: int | None = None) -> int:
    """The end of the whitespace after `start` up to its last newline (`start` if none)."""
    spaces_end = _SPACES.match(text, start, len(text) if end is None else end).end()
    return text.rfind("\n", start, spaces_end) + 1 or start


def _spans(text: str, starts: Sequence[int], end: int) -> tuple[str, ...]:
    bounds = [*starts, end]
    return tuple(text[a:b] for a, b in pairwise(bounds))


def _xml(
    text: str, min_documents: int, max_documents: int, layouts: Collection[str]
) -> Extraction | None:
    tags: dict[str, list[tuple[int, bool]]] = {}  # name -> [(start, is_close)]
    ends: dict[int, int] = {}
    for count, match in enumerate(_XML_TAG.finditer(text)):
        if count > MAX_MARKUP_PER_DOCUMENT * max_documents:
            return None
        is_close = match.group(1) == "/"
        if not is_close and match.group(3).endswith("/"):
            continue  # self-closing: no content
        tags.setdefault(match.group(2), []).append((match.start(), is_close))
        ends[match.start()] = match.end()
    balanced: dict[str, list[tuple[int, bool]]] = {}
    for name, found in tags.items():
        # open, close, open, close ...: balanced and never nested in itself
        if len(found) % 2 == 0 and all(close == (i % 2 == 1) for i, (_, close) in enumerate(found)):
            balanced[name] = found
    for name in sorted(balanced, key=lambda n: balanced[n][0][0]):
        found = balanced[name]
        elements = [(found[i][0], ends[found[i + 1][0]]) for i in range(0, len(found), 2)]
        if not min_documents <= len(elements) <= max_documents:
            continue
        if any(
            text[end:start] and not text[end:start].isspace()
            for (_, end), (start, _) in pairwise(elements)
        ):
            continue
        if _crosses(elements, {n: t for n, t in balanced.items() if n != name}):
            continue
        starts = [start for start, _ in elements]
        documents = list(_spans(text, starts[:-1], starts[-1]))
        end = _attach_separator(text, elements[-1][1], documents)
        documents.append(text[starts[-1] : end])
        return Extraction("xml", text[: starts[0]], tuple(documents), text[end:], None, None, True)
    # One element of a known name wrapping the documents (`<context>` around documents
    # joined by blank lines, as LangChain's retrieval-QA chat prompt writes them).
    for name in sorted(balanced, key=lambda n: balanced[n][0][0]):
        found = balanced[name]
        if len(found) != 2:
            continue
        inner_start = ends[found[0][0]]
        if text.startswith("\n", inner_start):
            inner_start += 1
        inside = [layout for layout in layouts if layout != "xml"]
        wrapped = _inside(
            text, inner_start, found[1][0], min_documents, max_documents, inside, "xml"
        )
        if wrapped is not None:
            return wrapped
    return None


def _crosses(
    elements: Sequence[tuple[int, int]], others: dict[str, list[tuple[int, bool]]]
) -> bool:
    """Whether a balanced element of another name crosses a document's boundary: the
    other name's tags inside a document must start with an open and end with a close
    (they alternate, so that is balance)."""
    for found in others.values():
        positions = [start for start, _ in found]
        for start, end in elements:
            i = bisect.bisect_left(positions, start)
            j = bisect.bisect_left(positions, end)
            if i < j and (found[i][1] or not found[j - 1][1]):
                return True
    return False


def _numbered(
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
        end = _close_last(text, markers[-1].end(), documents)
        documents.append(text[markers[-1].end() : end])
        if any(not doc.strip() for doc in documents):
            return None
        labels = tuple(marker.group(0) for marker in markers)
        preamble = text[: markers[0].start()]
        return Extraction("numbered", preamble, tuple(documents), text[end:], labels, form, True)
    return None


def _markdown(
    text: str, min_documents: int, max_documents: int, _: Collection[str]
) -> Extraction | None:
    headers: list[tuple[int, int]] = []  # (line start, level) outside fenced code
    fence = None
    for line in _MARKDOWN_LINE.finditer(text):
        marker = line.group("fence")
        if marker is not None:
            if fence is None:
                fence = marker  # a code block opens
            elif fence == marker:
                fence = None  # and closes with the same marker
        elif fence is None:
            headers.append((line.start(), len(line.group("hashes"))))
            if len(headers) > MAX_MARKUP_PER_DOCUMENT * max_documents:
                return None
    best: tuple[tuple[int, int], list[int]] | None = None
    for level in range(2, 7):
        indices = [i for i, (_, lvl) in enumerate(headers) if lvl == level]
        if len(indices) < 2 and not (indices and min_documents == 1):
            continue
        if any(headers[i][1] < level for i in range(indices[0], indices[-1])):
            continue  # the headers are not siblings
        if best is None or (len(indices), level) > best[0]:
            best = ((len(indices), level), indices)
    if best is None or not min_documents <= len(best[1]) <= max_documents:
        return None
    (_, level), indices = best
    starts = [headers[i][0] for i in indices]
    documents = list(_spans(text, starts[:-1], starts[-1]))
    shallower = next((s for s, lvl in headers[indices[-1] + 1 :] if lvl < level), None)
    end = _close_last(text, starts[-1], documents) if shallower is None else shallower
    documents.append(text[starts[-1] : end])
    return Extraction("markdown", text[: starts[0]], tuple(documents), text[end:], None, None, True)


def _dashed(
    text: str, min_documents: int, max_documents: int, layouts: Collection[str]
) -> Extraction | None:
    opening = _RULE.search(text)
    if opening is None or opening.end() >= len(text):
        return None
    rule, inner_start = opening.group(0), opening.end() + 1
    close = _find_line(text, rule, inner_start)
    if close is None:
        return None
    return _inside(text, inner_start, close, min_documents, max_documents, layouts, "dashed")


def _inside(
    text: str,
    inner_start: int,
    close: int,
    min_documents: int,
    max_documents: int,
    layouts: Collection[str],
    layout: str,
) -> Extraction | None:
    """The documents of the block text[inner_start:close] between two markers (rules,
    a wrapping element): a certain layout that covers the whole block, else its
    blank-line blocks (certain only when there is one), reported as `layout`."""
    head, tail, inner = text[:inner_start], text[close:], text[inner_start:close]
    for name in ("xml", "numbered", "markdown"):
        if name not in layouts:
            continue
        found = _FINDERS[name](inner, min_documents, max_documents, layouts)
        if found is not None and not found.preamble.strip() and not found.suffix.strip():
            return Extraction(
                found.layout,
                head + found.preamble,
                found.documents,
                found.suffix + tail,
                found.labels,
                found.label_format,
                True,
            )
    lead = _through_blank_lines(text, inner_start, close)
    starts = _block_starts(text, lead, close, max_documents)
    if starts is None or lead == close or len(starts) < min_documents:
        return None
    documents = _spans(text, starts, close)
    return Extraction(layout, text[:lead], documents, tail, None, None, len(documents) == 1)


def _find_line(text: str, line: str, start: int) -> int | None:
    """Where the last whole line equal to `line` that begins at or after `start` begins."""
    if text.endswith("\n" + line) and len(text) - len(line) >= start:
        return len(text) - len(line)
    at = text.rfind("\n" + line + "\n", start - 1)
    return None if at < 0 else at + 1


def _blank(
    text: str, min_documents: int, max_documents: int, _: Collection[str]
) -> Extraction | None:
    lead = _through_blank_lines(text, 0)
    starts = _block_starts(text, lead, len(text), max_documents + 1)
    if starts is None or len(starts) - 1 < min_documents:
        return None
    documents = _spans(text, starts[:-1], starts[-1])
    return Extraction("blank", text[:lead], documents, text[starts[-1] :], None, None, False)


_FINDERS: dict[str, Finder] = {
    "xml": _xml,
    "dashed": _dashed,
    "numbered": _numbered,
    "markdown": _markdown,
    "blank": _blank,
}
