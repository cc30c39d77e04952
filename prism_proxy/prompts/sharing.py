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

Prefixes a client sent itself are also found exactly, to the token, in a radix tree of
its prompts with their generated tokens (`OwnPrefixes`): the engine caches what it
generated for a client too, and a multi-turn chat re-sends it, so a client is told all
of its own reuse, not only up to the last boundary.

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

    def sent(self, prefixes: Sequence[tuple[int, int]]) -> int:
        """Tokens of the longest of `prefixes` that some client sent before (what the
        engine may hold cached); records nothing. 0 when nothing is recorded
        (`min_clients` 1 keeps no record)."""
        senders = self._senders
        for end, digest in reversed(prefixes):
            if digest in senders:
                return end
        return 0

    def __len__(self) -> int:
        return len(self._senders)

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._senders), "bytes": RECORD_BYTES * len(self._senders),
                "capacity_bytes": RECORD_BYTES * self.capacity}  # fmt: skip


def common_prefix(a: bytes, b: bytes, width: int = 4) -> int:
    """Tokens two prompts (ids packed `width` bytes each) have in common at their start:
    a binary search of slice comparisons, each at memcmp speed."""
    low, high = 0, min(len(a), len(b)) // width
    while low < high:
        mid = (low + high + 1) // 2
        if a[: mid * width] == b[: mid * width]:
            low = mid
        else:
            high = mid - 1
    return low


def pack(ids: Sequence[int]) -> bytes:
    """Token ids as 4-byte integers (ids of any real vocabulary fit)."""
    return array("i", ids).tobytes()


# What a radix node costs besides its tokens (the object, its dict, the LRU entry).
NODE_BYTES = 320


class _Node:
    __slots__ = ("children", "client", "key", "parent")

    def __init__(self, key: bytes, parent: _Node | None, client: str) -> None:
        self.key = key  # packed token ids after the parent's
        self.parent = parent
        self.client = client
        self.children: dict[bytes, _Node] = {}


class OwnPrefixes:
    """Every prompt each client sent, with what was generated for it, as one radix tree
    over token ids per client (sans-IO, bounded in bytes: the least recently added leaf
    goes first). `own_prefix` is exact to the token: the engine caches what it generated
    for a client too, and a multi-turn chat re-sends it."""

    def __init__(self, capacity_bytes: int = 16 << 20) -> None:
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._roots: dict[str, _Node] = {}
        self._leaves: OrderedDict[_Node, None] = OrderedDict()

    def own_prefix(self, client: str, ids: Sequence[int]) -> int:
        """The longest start of `ids` that the client sent (or was generated for it)."""
        node = self._roots.get(client)
        if node is None:
            return 0
        packed, pos = pack(ids), 0
        while pos < len(packed):
            child = node.children.get(packed[pos : pos + 4])
            if child is None:
                break
            matched = common_prefix(packed[pos : pos + len(child.key)], child.key)
            pos += 4 * matched
            if 4 * matched < len(child.key):
                break
            node = child
        return pos // 4

    def record(self, client: str, ids: Sequence[int]) -> None:
        """Add a prompt (or a prompt with its generated tokens)."""
        packed = pack(ids)
        node = self._roots.get(client)
        if node is None:
            node = self._roots[client] = _Node(b"", None, client)
            self.size_bytes += NODE_BYTES
        pos = 0
        while pos < len(packed):
            child = node.children.get(packed[pos : pos + 4])
            if child is None:
                leaf = _Node(packed[pos:], node, client)
                if not node.children and node.parent is not None:
                    self._leaves.pop(node, None)  # no longer a leaf
                node.children[packed[pos : pos + 4]] = leaf
                self._leaves[leaf] = None
                self.size_bytes += NODE_BYTES + len(leaf.key)
                break
            matched = 4 * common_prefix(packed[pos : pos + len(child.key)], child.key)
            if matched < len(child.key):
                if pos + matched == len(packed):
                    self._touch(child)
                    break
                child = self._split(child, matched)
            pos += matched
            node = child
        else:
            self._touch(node)
        while self.size_bytes > self.capacity_bytes and self._leaves:
            self._evict(next(iter(self._leaves)))

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut `child` after `at` bytes; returns the new upper node."""
        parent = child.parent
        assert parent is not None
        upper = _Node(child.key[:at], parent, child.client)
        parent.children[child.key[:4]] = upper
        child.key = child.key[at:]
        child.parent = upper
        upper.children[child.key[:4]] = child
        self.size_bytes += NODE_BYTES
        return upper

    def _touch(self, node: _Node) -> None:
        while node.children:  # the most recently added leaf under it
            node = next(reversed(node.children.values()))
        if node in self._leaves:
            self._leaves.move_to_end(node)

    def _evict(self, leaf: _Node) -> None:
        del self._leaves[leaf]
        parent = leaf.parent
        assert parent is not None
        del parent.children[leaf.key[:4]]
        self.size_bytes -= NODE_BYTES + len(leaf.key)
        if parent.children:
            return
        if parent.parent is None:  # a client with nothing left
            del self._roots[parent.client]
            self.size_bytes -= NODE_BYTES
        else:
            self._leaves[parent] = None
            self._leaves.move_to_end(parent, last=False)  # old: it goes next

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._leaves), "bytes": self.size_bytes,
                "capacity_bytes": self.capacity_bytes}  # fmt: skip


def tenant_key(client: str, chosen: str | None = None) -> str:
    """The engine cache partition (`extra_key`) of a client's requests the proxy cannot
    name by token ids; a partition the client chose is kept, inside its own."""
    tag = hashlib.blake2b(client.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    return f"prism-client:{tag}" if chosen is None else f"prism-client:{tag}:{chosen}"
