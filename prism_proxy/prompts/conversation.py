"""Message structure as segments (SPEC §1): a chat without hints is a chain of turns.

A multi-turn chat, or an agent loop that re-sends its history with every call, is cut
where each message ends in the rendered prompt. The first piece (the system turn, with
the `tools` a template writes there) is the request's head; each later message but the
last is a segment; the rest (the last message and the generation prompt) is private.
With `last_message` (the proxy's session features) the last message is a segment too,
so the end of each call's messages has an id that the next call repeats
(`admission.sessions`). A piece's id hashes every token before its end: equal ids mean
equal prefixes whatever the cuts before them, and the next call of an agent loop
repeats the ids of the call before at every cut they share. Nothing is reordered.

Cuts are found without knowing the template: the chat rendered up to message k (no
generation prompt) must be a prefix of the whole rendering, and the position must be
one where the tokenizer cuts the text too (an edge of an added token,
`ChatPieces.encode_cut`), so the pieces' ids are exactly the ids of the whole text.
At most `MAX_CUTS` are looked for (`_candidates`): the first message ends, every
stride-th, and the last two.
"""

from __future__ import annotations

import hashlib
import itertools
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prism_proxy.prompts.jobs import Dispatch, TokenJob
from prism_proxy.prompts.serializer import prefix_key_of
from prism_tokens.chat import content_format, template_messages
from prism_tokens.tokenizer import ChatTemplateError, Tokenizer
from prism_wire import Anchor, AnchorKind, anchor_check

MAX_CUTS = 16
TURN_ID_PREFIX = "\x00turn:"


# --- cuts and the job -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Turns:
    """A rendered chat's ids and the token offsets where its messages end (strictly
    increasing, each inside the prompt)."""

    ids: list[int]
    cuts: tuple[int, ...]


def _candidates(count: int, last_assistant: int | None = None) -> list[int]:
    """Message counts whose rendering may end a piece: 0 (what a template writes before
    the first message: tools), 1 and 2, every multiple of a stride, the last two, and
    `last_assistant` (the messages before the latest assistant turn: what the previous
    call of an agent loop sent, however many tool results followed it).
    The stride is the smallest power of two that keeps them within `MAX_CUTS`: the cuts
    of a growing history stay where they were (until the stride doubles), so the next
    call of an agent loop repeats the ids of the call before up to its last stride cut."""
    extra = {last_assistant} if last_assistant is not None and last_assistant < count else set()
    if count <= MAX_CUTS:
        return sorted({*range(count), *extra})
    stride = 1
    while (count - 1) // stride > MAX_CUTS - 5 - len(extra):
        stride *= 2
    middle = range(stride * (3 // stride + 1), count - 2, stride)
    return sorted({0, 1, 2, *middle, count - 2, count - 1, *extra})


def find_turns(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    last_message: bool = False,
) -> Turns:
    """Render `messages` (with `tools`) and cut at message ends (with `last_message`,
    at the last one's too); raises `ChatTemplateError` when the template cannot render
    the chat."""
    full = tokenizer.render_chat(messages, add_generation_prompt=True, tools=tools)
    pieces = tokenizer.chat_pieces
    if pieces is None:
        return Turns(tokenizer.encode(full), ())
    ends: list[int] = []
    count = len(messages)
    if last_message:
        roles = [m.get("role") for m in messages]
        assistants = [i for i in range(count) if roles[i] == "assistant"]
        last_assistant = assistants[-1] if assistants else None
        candidates = [*_candidates(count, last_assistant), count]
    else:
        candidates = _candidates(count)
    for k in candidates:
        try:
            text = tokenizer.render_chat(messages[:k], add_generation_prompt=False, tools=tools)
        except ChatTemplateError:
            continue  # e.g. a template that needs a user message first
        if (not ends or len(text) > ends[-1]) and len(text) < len(full) and full.startswith(text):
            ends.append(len(text))
    ids, offsets = pieces.encode_cut(full, ends)
    cuts: list[int] = []
    for offset in offsets:
        if offset is not None and (cuts[-1] if cuts else 0) < offset < len(ids):
            cuts.append(offset)
    return Turns(ids, tuple(cuts))


def turns_job(turns: Turns) -> TokenJob:
    """The token job of a cut chat: head = the first piece, segment ids for the later
    pieces (each the hash of every token up to its end), the rest private (a chat
    without cuts is one private piece: origin `none`)."""
    ids, cuts = turns.ids, turns.cuts
    anchors: list[Anchor] = []
    segments: list[str] = []
    lengths: list[int] = []
    head_key = ""
    if cuts:
        head_key = prefix_key_of(ids[: cuts[0]])
        anchors.append(Anchor(AnchorKind.SYSTEM, head_key, cuts[0]))
        running = hashlib.blake2b(array("I", ids[: cuts[0]]).tobytes(), digest_size=12)
        for start, end in itertools.pairwise(cuts):
            running.update(array("I", ids[start:end]).tobytes())
            segments.append(TURN_ID_PREFIX + running.copy().hexdigest())
            lengths.append(end - start)
            anchors.append(Anchor(AnchorKind.SEGMENT, segments[-1], end))
    if ids:  # a piece with no tokens has no anchor
        anchors.append(Anchor(AnchorKind.PRIVATE, None, len(ids)))
    dispatch = Dispatch({"input_ids": ids}, anchors)
    return TokenJob(
        segments=tuple(segments),
        reorder=False,
        prefix_key=head_key,
        head_tokens=cuts[0] if cuts else 0,
        segment_tokens=tuple(lengths) if cuts else None,
        build=lambda _order: dispatch,
        origin="turns" if cuts else "none",
        layout="messages" if cuts else "",
    )


def dispatch_check(dispatch: Dispatch) -> str:
    """The `anchor_check` of a dispatch's prompt and anchors (for an engine that renders
    and tokenizes the prompt itself)."""
    return anchor_check(dispatch.prompt_fields["input_ids"], [a.offset for a in dispatch.anchors])


class RenderingCheck:
    """Which chats of the token path are also measured against the engine's own
    rendering (`rendering_drift`): every `every`-th (0: none)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self._seen = 0

    def sampled(self) -> bool:
        if self.every <= 0:
            return False
        self._seen += 1
        return self._seen % self.every == 0


def rendering_drift(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], piecewise: Sequence[int]
) -> tuple[bool, int]:
    """How far the token path's prompt is from the engine's own rendering of the same
    chat (SGLang renders the whole template, then tokenizes it in one piece; the proxy
    tokenizes piece by piece, so a token may form differently across a boundary):
    whether the token path's ids of a chat (`piecewise`) differ from the engine's
    own rendering of `messages` (the whole template, tokenized in one piece), and how
    many more tokens they have (negative: fewer)."""
    given = template_messages(messages, content_format(tokenizer.chat_template))
    whole = tokenizer.encode_chat(tokenizer.render_chat(given))
    return list(piecewise) != whole, len(piecewise) - len(whole)
