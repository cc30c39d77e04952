"""One message's text cut into preamble, documents and suffix (`Extraction`, its
invariants in `prompts.extraction`), and the rules every layout shares for where a
document ends: its separator, the last document's end, blank-line blocks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise


@dataclass(frozen=True, slots=True)
class Extraction:
    """One message's text as preamble, documents and suffix (invariants: `prompts.extraction`)."""

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


# Known tags or headers per allowed document past which a text is not a layout.
MAX_MARKUP_PER_DOCUMENT = 64

Finder = Callable[[str, int, int, Collection[str]], Extraction | None]


def _ends_with(doc: str) -> str:
    return doc[len(doc.rstrip()) :]


def attach_separator(text: str, content_end: int, earlier: Sequence[str]) -> int:
    """The end of the last document whose content ends at `content_end`: the separator
    all earlier documents end with if the text continues with it, else the whitespace
    lines that follow."""
    separators = {_ends_with(doc) for doc in earlier}
    if len(separators) == 1:
        separator = separators.pop()
        if separator and text.startswith(separator, content_end):
            return content_end + len(separator)
    return through_blank_lines(text, content_end)


def close_last(text: str, start: int, earlier: Sequence[str]) -> int:
    """Where the last document, starting at `start`, ends (`prompts.extraction`)."""
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
    return attach_separator(text, content_end, earlier)


def block_starts(text: str, start: int, end: int, max_blocks: int) -> list[int] | None:
    """Where the blank-line blocks of text[start:end] start (`start` begins a non-blank
    line); blank lines after the last block stay in it. None past `max_blocks`."""
    content_end = start + len(text[start:end].rstrip())
    starts = [start]
    for separator in _SEPARATOR.finditer(text, start, content_end):
        starts.append(separator.end())
        if len(starts) > max_blocks:
            return None
    return starts


def through_blank_lines(text: str, start: int, end: int | None = None) -> int:
    """The end of the whitespace after `start` up to its last newline (`start` if none)."""
    spaces_end = _SPACES.match(text, start, len(text) if end is None else end).end()
    return text.rfind("\n", start, spaces_end) + 1 or start


def texts_between(text: str, starts: Sequence[int], end: int) -> tuple[str, ...]:
    bounds = [*starts, end]
    return tuple(text[a:b] for a, b in pairwise(bounds))
