"""Which cached prefixes a client may see: its own, and those several clients sent.

An engine's prefix cache is shared by every client, and SGLang reports how much of a
prompt it found cached (`cached_tokens`). That number is an oracle: probing guesses of
another client's prompt one token at a time, a client recovered a 6-digit code from
another's system prompt in 512 probes (issue 34). The engine may keep sharing what it
holds (that is the reuse PRISM exists for); what a client is *told* is bounded here:

    visible(client, prefix) = the client sent this exact prefix itself before, or at
                              least `min_clients` distinct clients sent it before

A prompt's prefixes are taken at its anchors (where each piece ends, SPEC §1) and at
every `BLOCK_TOKENS` tokens; each is named by a digest chained over the token ids up to
it, so equal digests mean equal prefixes. The tokens a client is told are cached are
capped at the longest visible prefix. Decisions use only what was recorded before the
request, then the request is recorded: a correct guess of another client's prompt looks
exactly like a wrong one to its sender (both are its own from then on). An attacker who
controls more than `min_clients` identities can test one guess of a whole prefix per
request (docs/proxy.md, "What clients share").

What the proxy cannot name by token ids (a prompt the engine renders or tokenizes
itself, or one in a cache partition the client chose) goes to a partition of its own
client's instead (`tenant_key`), so nothing it matches there was sent by anyone else.

Bounded: at most `capacity_bytes` of records (least recently used dropped first); a
forgotten prefix is merely reported as not cached, never as cached.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence

BLOCK_TOKENS = 64
# What one record costs: an int key, a small value, the ordered dict's node.
RECORD_BYTES = 160
SHARED = -1  # the value of a prefix sent by `min_clients` clients or more


def prefix_digests(input_ids: Sequence[int], offsets: Iterable[int]) -> list[tuple[int, int]]:
    """(end offset, digest) of the prompt's prefixes at `offsets` and every
    `BLOCK_TOKENS` tokens, shortest first; the digest chains over all ids before."""
    length = len(input_ids)
    blocks = range(BLOCK_TOKENS, length + 1, BLOCK_TOKENS)
    ends = sorted({o for o in offsets if 0 < o <= length} | set(blocks))
    out: list[tuple[int, int]] = []
    state = b""
    start = 0
    for end in ends:
        piece = array("q", input_ids[start:end]).tobytes()
        state = hashlib.blake2b(state + piece, digest_size=8).digest()
        out.append((end, int.from_bytes(state, "little")))
        start = end
    return out


class SharedPrefixes:
    """Who sent which prompt prefix (sans-IO, bounded in bytes)."""

    def __init__(self, min_clients: int = 2, capacity_bytes: int = 32 << 20) -> None:
        if min_clients < 1:
            raise ValueError("min_clients must be >= 1")
        self.min_clients = min_clients
        self.capacity = max(1, capacity_bytes // RECORD_BYTES)
        # digest -> SHARED, or the tuple of the (fewer than min_clients) clients who sent it
        self._senders: OrderedDict[int, int | tuple[int, ...]] = OrderedDict()

    @staticmethod
    def _client_id(client: str) -> int:
        digest = hashlib.blake2b(client.encode("utf-8", "surrogatepass"), digest_size=8)
        return int.from_bytes(digest.digest(), "little") >> 1  # never SHARED

    def see(self, client: str, prefixes: Sequence[tuple[int, int]]) -> int:
        """Tokens of the prompt whose prefix `prefixes` (from `prefix_digests`) this
        client may be told are cached; then record that it sent them."""
        if self.min_clients == 1:
            return prefixes[-1][0] if prefixes else 0
        me = self._client_id(client)
        visible = 0
        senders = self._senders
        for end, digest in prefixes:
            known = senders.get(digest)
            if known is None:
                senders[digest] = (me,)
            else:
                senders.move_to_end(digest)
                if known == SHARED or me in known:  # type: ignore[operator]
                    visible = end
                else:
                    grown = (*known, me)  # type: ignore[misc]
                    senders[digest] = SHARED if len(grown) >= self.min_clients else grown
        while len(senders) > self.capacity:
            senders.popitem(last=False)
        return visible

    def __len__(self) -> int:
        return len(self._senders)

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._senders), "bytes": RECORD_BYTES * len(self._senders),
                "capacity_bytes": RECORD_BYTES * self.capacity}  # fmt: skip


def tenant_key(client: str, chosen: str | None = None) -> str:
    """The engine cache partition (`extra_key`) of a client's requests the proxy cannot
    name by token ids; a partition the client chose is kept, inside its own."""
    tag = hashlib.blake2b(client.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    return f"prism-client:{tag}" if chosen is None else f"prism-client:{tag}:{chosen}"
