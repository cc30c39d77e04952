"""Serializer: segmented prompt -> token ids + anchors, exactly as SPEC §1.

Each piece is tokenized on its own and the pieces' ids are concatenated::

    z = tok(head) ++ tok(r_1 + SEP) ++ ... ++ tok(r_m + SEP) ++ tok(tail)
        |-- head --|                                            |- tail -|
                   ^ system anchor   ^ segment anchors ...               ^ private anchor

so two requests that serialize the same pieces in the same order share a token prefix
exactly, whatever follows. ``SEP`` (``"\\n\\n"``) follows every segment's text whatever
its position, so a segment's tokens never depend on where it lands (reordering keeps
reuse).

* Chat mode: the chat template is rendered once per system prompt with the system
  message (if any) and a user message whose content is a sentinel; ``head`` is the text
  before the sentinel and ``tail`` is the suffix followed by the text after it.
* Chat mode with the documents in the system message (``SegmentedPrompt.user`` set): the
  template is rendered with a system message ending in a sentinel and a user message
  that is another; ``head`` is the text before the first, ``tail`` the suffix (the rest
  of the system message), the text between the sentinels, the user message and the
  text after the second.
* Non-chat mode (completions / generate): ``head`` is the system text (may be empty),
  ``tail`` is the suffix.

An anchor is the token offset where a piece ends. A piece with no tokens has no anchor
(an empty head, an empty tail in non-chat mode, or a blank segment under a tokenizer that
drops whitespace), so anchor offsets strictly increase and the last one, if any, is
``len(input_ids)``.
Segment ids are cached by (id, content hash), heads by the system prompt's hash, in
LRUs bounded in bytes.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from prism_proxy.api.segments import SEGMENT_SEPARATOR, SegmentedPrompt
from prism_tokens.byte_lru import ByteLRU
from prism_tokens.tokenizer import Tokenizer
from prism_wire import Anchor, AnchorKind

SENTINEL = "PRISMSEGMENTSENTINEL0x5f3759df"
USER_SENTINEL = "PRISMUSERSENTINEL0x1badb002"


class SerializationError(ValueError):
    """The request cannot be serialized (bad ``order``, unusable chat template)."""


@dataclass(frozen=True, slots=True)
class SerializedPrompt:
    """Token ids of a request plus where each piece ends (`prism_wire.Anchor`, as the
    wire carries them).

    ``segment_tokens`` maps each segment id to its token count, ``order`` is the segment
    order serialized, ``prefix_key`` a stable hash of the head's token ids (requests with
    equal keys share the head tokens)."""

    input_ids: list[int]
    anchors: list[Anchor]
    segment_tokens: dict[str, int]
    head_tokens: int
    prefix_key: str
    order: tuple[str, ...] = ()
    tail_tokens: int = 0


@dataclass(frozen=True, slots=True)
class _Frame:
    """A system prompt's rendering: head ids, the text that ends the tail (with the
    documents in the system message: the text up to the user message's, and after it,
    `user_tail`), head hash."""

    head_ids: array[int]
    tail_text: str
    prefix_key: str
    user_tail: str = ""


# Default capacities of the serializer's caches (the proxy's settings
# `segment_cache_bytes` and `head_cache_bytes` override them).
SEGMENT_CACHE_BYTES = 64 * 1024 * 1024
HEAD_CACHE_BYTES = 16 * 1024 * 1024

_SegmentKey = tuple[str, bytes]  # (segment id, content hash of its piece)
_HeadKey = tuple[bytes, bytes, bool, bool]  # (system hash, preamble hash, chat, in system)
_LABEL = "\x00label"  # the segment cache's id for position labels (no client id starts so)


def _segment_size(key: _SegmentKey, ids: array[int]) -> int:
    return sys.getsizeof(key) + sys.getsizeof(key[0]) + sys.getsizeof(key[1]) + sys.getsizeof(ids)


def _head_size(key: _HeadKey, frame: _Frame) -> int:
    owned = (key, key[0], key[1], frame, frame.head_ids, frame.tail_text, frame.prefix_key)
    owned += (frame.user_tail,)
    return sum(map(sys.getsizeof, owned))


def prefix_key_of(ids: Sequence[int]) -> str:
    """Stable (cross-machine, cross-process) hash of a token id sequence."""
    return hashlib.blake2b(",".join(map(str, ids)).encode(), digest_size=8).hexdigest()


def _content_hash(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class Serializer:
    """Serializes ``SegmentedPrompt`` for one tokenizer, with token caches bounded in
    bytes (keys hold hashes, not the texts; ids are 4-byte arrays)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        segment_cache_bytes: int = SEGMENT_CACHE_BYTES,
        head_cache_bytes: int = HEAD_CACHE_BYTES,
    ) -> None:
        self.tokenizer = tokenizer
        self._segments: ByteLRU[_SegmentKey, array[int]] = ByteLRU(
            segment_cache_bytes, _segment_size
        )
        self._frames: ByteLRU[_HeadKey, _Frame] = ByteLRU(head_cache_bytes, _head_size)

    def segment_ids(
        self, segment_id: str, text: str, separator: str = SEGMENT_SEPARATOR
    ) -> array[int]:
        """Token ids of one segment's piece (its text and separator), from the (id,
        content hash) cache. A changed text under the same id is a different key, so it
        is never served stale."""
        return self._pieces([(segment_id, text + separator)])[0]

    def _pieces(self, pieces: Sequence[tuple[str, str]]) -> list[array[int]]:
        """Token ids of each (segment id, piece text), each piece tokenized on its own:
        the prompt's distinct pieces looked up in the cache in one pass (one lock for a
        whole prompt), those it lacks tokenized once and kept. An empty position label
        is no piece (no lookup)."""
        keys = [
            (segment_id, _content_hash(text)) if text or segment_id != _LABEL else None
            for segment_id, text in pieces
        ]
        distinct = list(dict.fromkeys(key for key in keys if key is not None))
        known = dict(zip(distinct, self._segments.get_many(distinct), strict=True))
        made: dict[_SegmentKey, array[int]] = {}
        found: list[array[int]] = []
        for (_, text), key in zip(pieces, keys, strict=True):
            if key is None:
                found.append(array("I"))
                continue
            ids = known[key]
            if ids is None:
                ids = known[key] = made[key] = array("I", self.tokenizer.encode(text))
            found.append(ids)
        if made:
            self._segments.put_many(made.items())
        return found

    def _placed(
        self, prompt: SegmentedPrompt, order: Sequence[str]
    ) -> list[tuple[array[int], array[int], array[int]]]:
        """For each segment of `order`: the ids of what precedes it (the joiner, after
        the first; its position's label) and of its own piece."""
        by_id = {s.id: s for s in prompt.segments}
        pieces: list[tuple[str, str]] = []
        for position, segment_id in enumerate(order, 1):
            pieces.append((_LABEL, (prompt.joiner or "") if position > 1 else ""))
            pieces.append((_LABEL, prompt.label(position)))
            pieces.append((segment_id, by_id[segment_id].text + prompt.separator))
        ids = self._pieces(pieces)
        return [(ids[n], ids[n + 1], ids[n + 2]) for n in range(0, len(ids), 3)]

    def skeleton_lengths(self, prompt: SegmentedPrompt) -> dict[str, int]:
        """Token count of each segment (request order; its label at its place in the
        request's own order), before choosing an order."""
        placed = self._placed(prompt, prompt.segment_ids)
        return {
            segment_id: len(joiner) + len(label) + len(piece)
            for segment_id, (joiner, label, piece) in zip(prompt.segment_ids, placed, strict=True)
        }

    def head_tokens(
        self, system: str | None, chat: bool = True, preamble: str = "", *, in_system: bool = False
    ) -> int:
        """Token count of the head (cached per system prompt and preamble)."""
        return len(self._frame(system, chat, preamble, in_system).head_ids)

    def prefix_key(
        self, system: str | None, chat: bool = True, preamble: str = "", *, in_system: bool = False
    ) -> str:
        """The ``prefix_key`` every request with this system prompt and preamble gets."""
        return self._frame(system, chat, preamble, in_system).prefix_key

    def _frame(
        self, system: str | None, chat: bool, preamble: str = "", in_system: bool = False
    ) -> _Frame:
        # None and "" render differently (no system message vs an empty one).
        digest = b"" if system is None else _content_hash(system)
        key = (digest, _content_hash(preamble) if preamble else b"", chat, in_system)
        return self._frames.get_or_make(
            key, lambda: self._render(system, chat, preamble, in_system)
        )

    def _render(self, system: str | None, chat: bool, preamble: str, in_system: bool) -> _Frame:
        if not chat:
            head, tail, user_tail = (system or "") + preamble, "", ""
        elif in_system:  # the documents in the system message, the user message after
            messages = [
                {"role": "system", "content": preamble + SENTINEL},
                {"role": "user", "content": USER_SENTINEL},
            ]
            text = self.tokenizer.render_chat(messages, add_generation_prompt=True)
            if text.count(SENTINEL) != 1 or text.count(USER_SENTINEL) != 1:
                raise SerializationError(
                    f"chat template of {self.tokenizer.name!r} does not render the system "
                    "and user messages verbatim exactly once; cannot split head and tail"
                )
            head, rest = text.split(SENTINEL)
            if USER_SENTINEL not in rest:
                raise SerializationError("the user message is rendered before the system one")
            tail, user_tail = rest.split(USER_SENTINEL)
        else:
            messages = [] if system is None else [{"role": "system", "content": system}]
            messages.append({"role": "user", "content": preamble + SENTINEL})
            text = self.tokenizer.render_chat(messages, add_generation_prompt=True)
            if text.count(SENTINEL) != 1:
                raise SerializationError(
                    f"chat template of {self.tokenizer.name!r} does not render the user "
                    "message verbatim exactly once; cannot split head and tail"
                )
            head, tail = text.split(SENTINEL)
            user_tail = ""
        head_ids = array("I", self.tokenizer.encode(head) if head else ())
        return _Frame(head_ids, tail, prefix_key_of(head_ids), user_tail)

    def _check_order(self, prompt: SegmentedPrompt, order: Sequence[str]) -> tuple[str, ...]:
        chosen = tuple(order)
        ids = prompt.segment_ids
        if len(chosen) != len(ids) or set(chosen) != set(ids) or len(set(chosen)) != len(ids):
            raise SerializationError(
                f"order: must be a permutation of the request's segment ids {ids}, got "
                f"{list(chosen)}"
            )
        if not prompt.reorder and list(chosen) != ids:
            raise SerializationError("order: the request does not allow reordering")
        if prompt.fixed:
            kept = [s for s in chosen if s in prompt.fixed]
            if kept != [s for s in ids if s in prompt.fixed]:
                raise SerializationError("order: fixed segments must keep their order")
        if prompt.glued:
            previous = {b: a for a, b in pairwise(ids)}
            served_next = dict(pairwise(chosen))
            if any(served_next.get(previous.get(s)) != s for s in prompt.glued):
                raise SerializationError("order: a glued segment must follow the segment before it")
        return chosen

    def serialize(
        self, prompt: SegmentedPrompt, order: Sequence[str] | None = None, chat: bool = True
    ) -> SerializedPrompt:
        """Serialize ``prompt`` with its segments in ``order`` (a permutation of the
        request's segment ids chosen by the scheduler; default: request order)."""
        chosen = tuple(prompt.segment_ids) if order is None else self._check_order(prompt, order)
        frame = self._frame(prompt.system, chat, prompt.preamble, prompt.user is not None)
        input_ids = list(frame.head_ids)
        anchors: list[Anchor] = []
        if input_ids:
            # the head's id is its prefix_key: DART ranks each head as its own owner by
            # the demand the proxy pushes for it, never by its kind
            anchors.append(Anchor(AnchorKind.SYSTEM, frame.prefix_key, len(input_ids)))
        segment_tokens: dict[str, int] = {}
        for segment_id, (joiner, label, piece) in zip(
            chosen, self._placed(prompt, chosen), strict=True
        ):
            start = len(input_ids)
            input_ids.extend(joiner)
            input_ids.extend(label)
            input_ids.extend(piece)
            segment_tokens[segment_id] = len(input_ids) - start
            if len(input_ids) > start:
                anchors.append(Anchor(AnchorKind.SEGMENT, segment_id, len(input_ids)))
        tail_text = prompt.suffix + frame.tail_text
        if prompt.user is not None:
            tail_text += prompt.user + frame.user_tail
        tail_ids = self.tokenizer.encode(tail_text) if tail_text else []
        input_ids.extend(tail_ids)
        if tail_ids:
            anchors.append(Anchor(AnchorKind.PRIVATE, None, len(input_ids)))
        return SerializedPrompt(
            input_ids=input_ids,
            anchors=anchors,
            segment_tokens=segment_tokens,
            head_tokens=len(frame.head_ids),
            prefix_key=frame.prefix_key,
            order=chosen,
            tail_tokens=len(tail_ids),
        )

    def cache_stats(self) -> dict[str, dict[str, int]]:
        """Entries, bytes, capacity, hits and misses of the ``segments`` and ``heads``
        caches."""
        return {"segments": self._segments.stats(), "heads": self._frames.stats()}
