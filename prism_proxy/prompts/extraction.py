"""Documents inside one message's text, found from its layout (SPEC §1 "Requests without
hints are segmented by the proxy").

`extract(text)` returns the message cut into a preamble, documents and a suffix, or None
when no layout fits; `find_documents` makes what it finds a `SegmentedPrompt` (each
document's id from its text, what may move decided by the layout or the client's
evidence). It never changes the text: for every layout but `numbered`,

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
import hashlib
import re
from collections.abc import Collection, Sequence
from itertools import pairwise

from pydantic import ValidationError

from prism_proxy.api.segments import Segment, SegmentedPrompt
from prism_proxy.prompts.document_spans import (
    MAX_MARKUP_PER_DOCUMENT,
    Extraction,
    Finder,
    attach_separator,
    block_starts,
    close_last,
    texts_between,
    through_blank_lines,
)
from prism_proxy.prompts.evidence import BlockEvidence, ScopedEvidence
from prism_proxy.prompts.numbered_layout import find_numbered

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


_RULE = re.compile(r"^(?:-{3,}+|={3,}+|\*{3,}+)[^\S\n]*+$", re.M)  # possessive: no backtracking
# Each line-start pattern first checks the line's first character (a lookahead that
# costs one test per line), then tries its alternatives.
_MARKDOWN_LINE = re.compile(r"^(?=[`~#])(?:(?P<fence>```|~~~)|(?P<hashes>#{1,6})[ \t]+\S)", re.M)
_XML_TAG = re.compile(
    r"<(/?)(" + "|".join(sorted(XML_TAG_NAMES, key=len, reverse=True)) + r")(?=[\s/>])"
    r"([^<>]{0,4096})>"
)


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
        documents = list(texts_between(text, starts[:-1], starts[-1]))
        end = attach_separator(text, elements[-1][1], documents)
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
    documents = list(texts_between(text, starts[:-1], starts[-1]))
    shallower = next((s for s, lvl in headers[indices[-1] + 1 :] if lvl < level), None)
    end = close_last(text, starts[-1], documents) if shallower is None else shallower
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
    lead = through_blank_lines(text, inner_start, close)
    starts = block_starts(text, lead, close, max_documents)
    if starts is None or lead == close or len(starts) < min_documents:
        return None
    documents = texts_between(text, starts, close)
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
    lead = through_blank_lines(text, 0)
    starts = block_starts(text, lead, len(text), max_documents + 1)
    if starts is None or len(starts) - 1 < min_documents:
        return None
    documents = texts_between(text, starts[:-1], starts[-1])
    return Extraction("blank", text[:lead], documents, text[starts[-1] :], None, None, False)


_FINDERS: dict[str, Finder] = {
    "xml": _xml,
    "dashed": _dashed,
    "numbered": find_numbered,
    "markdown": _markdown,
    "blank": _blank,
}


def document_id(text: str) -> str:
    """A found document's segment id: derived from its text (the same document in any
    request, at any position, under any label, has the same id), in a namespace no
    client's segment id can enter (NUL first)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    return "\x00doc:" + digest


def find_documents(
    text: str,
    *,
    system: str | None,
    layouts: Collection[str],
    reorder: bool,
    evidence: BlockEvidence | ScopedEvidence,
    user: str | None = None,
) -> SegmentedPrompt | None:
    """The documents in one message's (or one prompt's) `text` as a `SegmentedPrompt`
    (its `layout` the one they were found in), or None when none are found (the request
    then goes as one private piece).
    `text` is the user message after `system`, or, with `user`, the system message
    before the user message `user`.

    The text inside each document is never changed: served in the client's order, the
    prompt reads exactly as the client wrote it. Documents may move where their
    boundaries are justified: by the layout itself (tags, numbered labels, headers),
    or, for blocks split at blank lines, by evidence across the client's requests
    (`prompts.evidence`): blocks move only as units, runs the evidence never saw apart
    (`glued`), so a document of several blocks is never split; leading units that only
    ever opened the list stay in front (`pinned`), trailing ones that only ever closed
    it at the end (`fixed`). A numbered layout's
    labels follow the positions served ("[1] " is always the first document the model
    reads), so the same document under another number is the same segment. Documents
    joined by one separator keep it between them as a `joiner`, so a document's tokens
    do not depend on where it lands.
    """
    if not layouts:
        return None
    found = extract(text, layouts)
    if found is None:
        return None
    if user is not None:
        # In the system message no question follows the documents: its last block is
        # one of them (LangChain's RAG tutorial: the instruction, then the documents).
        found = found.with_no_question()
    documents, joiner, suffix = list(found.documents), None, found.suffix
    trailing = [d[len(d.rstrip()) :] for d in documents]
    if len(set(trailing[:-1])) <= 1:
        # One separator between documents (the last's goes to the suffix): a joiner
        # tokenized on its own, so each document's tokens are the same at any position.
        joiner = trailing[0] if len(documents) > 1 else ""
        documents = [d.rstrip() for d in documents]
        suffix = trailing[-1] + suffix
    ids = [document_id(document.rstrip()) for document in documents]
    if len(set(ids)) != len(ids):
        return None  # a document repeated within the request: nothing to gain, and ambiguous
    fixed: list[str] = []
    pinned: list[str] = []
    glued: frozenset[str] = frozenset()
    if not found.certain:
        judged = evidence.judge(found.documents)
        glued = frozenset(i for i, g in zip(ids, judged.glued, strict=True) if g)
        lead, tail = judged.in_place()
        pinned = ids[:lead]
        fixed = pinned + ids[tail:]
    try:
        prompt = SegmentedPrompt(
            system=system,
            preamble=found.preamble,
            # ids of the proxy's own making, in the namespace clients' ids are refused
            segments=[
                Segment.model_construct(id=i, text=d) for i, d in zip(ids, documents, strict=True)
            ],
            suffix=suffix,
            separator="",
            joiner=joiner,
            label_format=found.label_format,
            reorder=reorder,
            fixed=frozenset(fixed),
            pinned=frozenset(pinned),
            glued=glued,
            user=user,
            layout=found.layout,
        )
    except ValidationError:
        return None  # beyond the limits of a segmented prompt: served as one piece
    return prompt
