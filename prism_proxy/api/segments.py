"""Segmented request model (SPEC §1): pydantic at the HTTP edge.

A PRISM request is a system prompt, an ordered list of reusable segments ``{id, text}``
and a private suffix, plus a ``reorder`` flag (may QAS move the segments? default yes,
for retrieved documents). A hint's prompt is checked against fixed bounds
(``MAX_SEGMENTS``, ``MAX_PIECE_CHARS``, ...), and ``format_validation_error`` turns a
``ValidationError`` into one line naming the field, e.g. ``segments: duplicate segment
id 'd7' at segments[1] (first at segments[0])``.
"""

from __future__ import annotations

from typing import Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from prism_wire import RESERVED_ID_START

# Bounds on one hint's prompt; every text piece is the system prompt, a segment's text,
# the suffix, a found prompt's preamble or user message.
MAX_SEGMENTS = 256
MAX_ID_CHARS = 256
MAX_PIECE_CHARS = 256_000
MAX_TOTAL_CHARS = 1_000_000
# What follows every segment's text unless the prompt says otherwise: position
# independent, so a segment's tokens never depend on where it lands (SPEC §1).
SEGMENT_SEPARATOR = "\n\n"


def _check_piece(value: str | None) -> str | None:
    if value is not None and len(value) > MAX_PIECE_CHARS:
        raise ValueError(f"too long: {len(value)} characters > limit {MAX_PIECE_CHARS}")
    return value


class Segment(BaseModel):
    """A reusable piece of prompt: its ``id`` is a stable control-plane hint (KV reuse
    still needs token-exact equality, so one id must always carry the same text)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    id: str
    text: str

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        if value.startswith(RESERVED_ID_START):
            # DART's owners of system heads start with NUL: a segment never shares one
            raise ValueError("must not start with a NUL character (reserved)")
        if len(value) > MAX_ID_CHARS:
            raise ValueError(f"too long: {len(value)} characters > limit {MAX_ID_CHARS}")
        return value

    _check_text = field_validator("text")(_check_piece)


class SegmentedPrompt(BaseModel):
    """System prompt, ordered segments, private suffix (SPEC §1).

    Segments found in an unmodified client's text (`prism_proxy.prompts.extraction`) say more
    about where they sit: `preamble` is text before the first segment (in the user
    message in chat mode, after the system text otherwise); `separator` follows every
    segment's text (an extracted document carries its own: ""); `label_format` prefixes
    each segment with its position's label (`"[{n}] "` gives "[1] ", "[2] " ...: a
    numbered layout renumbered in the order served); `joiner`, when set, goes between
    consecutive segments instead (after the first, before the label), tokenized on its
    own, so that documents a client joined with "\n\n" keep their own tokens at any
    position; `fixed` lists segments whose boundaries are not certain: they keep their
    relative order, after the others, but for the `pinned` ones (a leading run of fixed
    segments known to stay in front, such as an instruction), which stay in front;
    `glued` segments travel with the segment before them in request order (blocks of
    one document: served right after it, never split from it).
    `user`, when set (chat mode, no `system`), says the segments are in the system
    message (`preamble` and `suffix` its text before and after them), and is the user
    message that follows. `layout` names the layout the segments were found in
    (`prompts.extraction`: "xml", "numbered", ...; None: the client's hints).
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    system: str | None = None
    segments: list[Segment] = Field(default_factory=list)
    suffix: str = ""
    reorder: bool = True
    preamble: str = ""
    separator: str = SEGMENT_SEPARATOR
    label_format: str | None = None
    joiner: str | None = None
    fixed: frozenset[str] = frozenset()
    pinned: frozenset[str] = frozenset()
    glued: frozenset[str] = frozenset()
    user: str | None = None
    layout: str | None = None

    _check_system = field_validator("system", "suffix", "preamble", "user")(_check_piece)

    @field_validator("label_format")
    @classmethod
    def _check_label(cls, value: str | None) -> str | None:
        if value is not None and (value.count("{n}") != 1 or len(value) > 64):
            raise ValueError("must hold '{n}' exactly once, in at most 64 characters")
        return value

    @field_validator("segments")
    @classmethod
    def _check_segments(cls, value: list[Segment]) -> list[Segment]:
        if len(value) > MAX_SEGMENTS:
            raise ValueError(f"too many segments: {len(value)} > limit {MAX_SEGMENTS}")
        first: dict[str, int] = {}
        for index, segment in enumerate(value):
            if segment.id in first:
                raise ValueError(
                    f"duplicate segment id {segment.id!r} at segments[{index}] "
                    f"(first at segments[{first[segment.id]}])"
                )
            first[segment.id] = index
        return value

    @model_validator(mode="after")
    def _check_total(self) -> Self:
        limit = MAX_TOTAL_CHARS
        if self.user is not None and self.system is not None:
            raise ValueError("user: the documents are in the system message, so no system")
        total = len(self.system or "") + len(self.suffix) + len(self.preamble)
        total += len(self.user or "")
        total += sum(len(s.text) for s in self.segments)
        if total > limit:
            raise ValueError(f"prompt too long: {total} characters in total > limit {limit}")
        return self

    @property
    def segment_ids(self) -> list[str]:
        return [s.id for s in self.segments]

    def label(self, position: int) -> str:
        """The label of the segment served at `position` (1-based): "" without labels."""
        return "" if self.label_format is None else self.label_format.replace("{n}", str(position))


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})


def field_parts(loc: tuple[int | str, ...]) -> list[int | str]:
    """A validation error's location without the union member tags (``str``,
    ``list[str]``) that pydantic inserts into it: only field names and indices."""
    return [
        p
        for p in loc
        if isinstance(p, int)
        or (p not in _TYPE_TAGS and "[" not in p and not p.startswith("constrained-"))
    ]


def _field_path(loc: tuple[int | str, ...]) -> str:
    """``("segments", 2, "id")`` -> ``segments[2].id`` (see ``field_parts``)."""
    path = ""
    for part in field_parts(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def format_validation_error(err: ValidationError) -> str:
    """One line: ``<field path>: <message>`` for the most specific error (plus a count
    of the others), e.g. ``segments[2].id: must not be empty``."""
    errors = err.errors(include_url=False)
    if not errors:
        return "invalid request"
    paths = [_field_path(tuple(e["loc"])) for e in errors]
    best = max(range(len(errors)), key=lambda i: (paths[i].count(".") + paths[i].count("["), -i))
    message = str(errors[best]["msg"]).removeprefix("Value error, ")
    line = f"{paths[best] or 'request'}: {message}"
    others = len({p for p in paths if not paths[best].startswith(p)})
    if others:
        line += f" (and {others} more error{'s' if others > 1 else ''})"
    return " ".join(line.split())
