"""Rendered chats tokenized piece by piece, the pieces between special tokens cached.

A multi-turn client (an agent) sends its whole history with every turn, and the proxy
tokenizes what it renders (SPEC §1: it sends ``input_ids``). At ~250 ns per character
that is the one cost of the proxy that grows with the prompt: 6 ms of CPU for a
24k-character history, on the event loop's core, for every turn.

A ``tokenizers`` tokenizer first cuts the text at its added tokens (``<|im_start|>``,
``<|im_end|>``...), then normalizes, pre-tokenizes and encodes each piece between them
on its own. So the ids of a text are the concatenation of the ids of those pieces, and a
piece seen before (a system prompt, every message of the history) need not be encoded
again. ``ChatPieces`` cuts exactly where the library does and keeps the pieces' ids in a
bounded LRU; each turn then encodes only what is new.

That equality holds only for some tokenizers, so ``ChatPieces.for_tokenizer`` returns
None (the caller encodes whole texts) unless:
* every added token is matched on the raw text as written (not ``normalized``, no
  ``lstrip``/``rstrip``/``single_word``), so a regex finds the same cuts as the library;
* the tokenizer does not encode special tokens as text (``encode_special_tokens``);
* no ``Metaspace`` pre-tokenizer prepends only to the text's first piece
  (``prepend_scheme: first``, which depends on where a piece sits in the text);
* and a probe text around every added token encodes to the same ids both ways.
"""

from __future__ import annotations

import json
import re
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from prism_tokens.byte_lru import ByteLRU

# The cache holds at most this many bytes of pieces and their ids (`sys.getsizeof`):
# about 8M characters of ASCII text, 4M of other BMP text.
DEFAULT_CAPACITY_BYTES = 32 * 1024 * 1024
_PROBE_TEXT = " Hello,\n world  ünïcödé 漢字 🙂 1234 "


def _size(piece: str, ids: array[int]) -> int:
    """What an entry holds: the text and the ids."""
    return sys.getsizeof(piece) + sys.getsizeof(ids)


def _metaspace_first(config: Any) -> bool:
    """Whether a tokenizer.json component tree holds a Metaspace that prepends only to
    the first piece."""
    if isinstance(config, dict):
        if config.get("type") == "Metaspace" and config.get("prepend_scheme") == "first":
            return True
        return any(_metaspace_first(value) for value in config.values())
    if isinstance(config, list):
        return any(_metaspace_first(value) for value in config)
    return False


class ChatPieces:
    """Token ids of texts, cut at the added tokens, each piece's ids cached (LRU)."""

    def __init__(
        self,
        backend: HFTokenizer,
        splitter: re.Pattern[str],
        added: dict[str, int],
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
    ) -> None:
        self._backend = backend
        self._splitter = splitter
        self._added = added
        self._pieces: ByteLRU[str, array[int]] = ByteLRU(capacity_bytes, _size)

    @property
    def capacity_bytes(self) -> int:
        return self._pieces.capacity_bytes

    @classmethod
    def for_tokenizer(
        cls, backend: HFTokenizer, capacity_bytes: int = DEFAULT_CAPACITY_BYTES
    ) -> ChatPieces | None:
        """A cache for `backend`, or None when cutting outside the library could give
        other ids (see the module docstring)."""
        if getattr(backend, "encode_special_tokens", False):
            return None
        pre_tokenizer = backend.pre_tokenizer
        if pre_tokenizer is not None and _metaspace_first(json.loads(pre_tokenizer.__getstate__())):
            return None
        added: dict[str, int] = {}
        for token_id, token in backend.get_added_tokens_decoder().items():
            if token.normalized or token.lstrip or token.rstrip or token.single_word:
                return None
            added[token.content] = token_id
        if not added:
            splitter = re.compile(r"(?!)")  # matches nothing: the text is one piece
        else:
            # Longest first: at one position the library takes the longest added token.
            alternatives = sorted(added, key=len, reverse=True)
            splitter = re.compile("|".join(map(re.escape, alternatives)))
        pieces = cls(backend, splitter, added, capacity_bytes)
        probe = _PROBE_TEXT + _PROBE_TEXT.join(added) + _PROBE_TEXT
        whole = backend.encode_batch_fast([probe], add_special_tokens=False)[0].ids
        if pieces.encode(probe) != whole:
            return None
        pieces.clear()
        return pieces

    def encode(self, text: str) -> list[int]:
        """The ids ``encode(text)`` gives, from cached pieces where it can."""
        return self.encode_cut(text, ())[0]

    def encode_cut(self, text: str, cuts: Sequence[int]) -> tuple[list[int], list[int | None]]:
        """``encode(text)`` and, for each character position in `cuts`, the number of ids
        before it: where the library cuts the text too (at either edge of an added
        token); None for a position inside a piece, whose ids depend on both sides."""
        ids: list[int] = []
        edges: dict[int, int] = {0: 0}
        start = 0
        for match in self._splitter.finditer(text):
            if match.start() > start:
                ids.extend(self._piece(text[start : match.start()]))
            edges[match.start()] = len(ids)
            ids.append(self._added[match.group()])
            start = match.end()
            edges[start] = len(ids)
        if start < len(text):
            ids.extend(self._piece(text[start:]))
        edges[len(text)] = len(ids)
        return ids, [edges.get(cut) for cut in cuts]

    def _piece(self, piece: str) -> array[int]:
        cached = self._pieces.get(piece)
        if cached is not None:
            return cached
        ids = array("I", self._backend.encode_batch_fast([piece], add_special_tokens=False)[0].ids)
        self._pieces.put(piece, ids)
        return ids

    def clear(self) -> None:
        self._pieces.clear()

    def info(self) -> dict[str, int]:
        """Entries, bytes held, the capacity, hits and misses."""
        return self._pieces.stats()
