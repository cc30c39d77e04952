"""Client API keys: who may use the proxy, under which account and limits (issue 36).

Keys come from a file (`api_keys_file`) and/or the environment (`PRISM_API_KEYS`),
never from the command line. The proxy keeps only their SHA-256 digests.

Key file, one key a line (`#` starts a comment, blank lines are skipped):

    sha256:<64 hex digits> [name=NAME] [max_inflight=N] [max_queued=N]
                           [tokens_per_minute=N] [weight=W]

`name` is the key's account (several keys may share one, e.g. while rotating a key,
when their limits agree); without it the account is `key-<first 8 hex digits>`. The
limits override the deployment's defaults for this account (0: no limit); `weight` is
its fair-share weight in admission (default 1). `PRISM_API_KEYS` holds keys separated
by commas or white space, each the key itself or `sha256:<hex>`, with the default
limits (a key may be in the file and the environment alike; the file's line wins).

Make a line from a key: `printf %s "$KEY" | sha256sum` → `sha256:<that hex>`.

Pure parsing and a lookup table; `edge.accounts` applies them to requests.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass

DIGEST_PREFIX = "sha256:"
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9._:@-]{1,64}")
MAX_KEYS = 10_000  # each lookup compares against every digest (constant time per key)
LIMIT_FIELDS = ("max_inflight", "max_queued", "tokens_per_minute")


class KeyFileError(ValueError):
    """A key file or `PRISM_API_KEYS` entry that cannot be read; names where."""


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """One account's own limits; None: the deployment's default (0 there: none)."""

    max_inflight: int | None = None
    max_queued: int | None = None
    tokens_per_minute: int | None = None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Account:
    """Who a request comes from: an account `name` and its own `limits`."""

    name: str
    limits: KeyLimits = KeyLimits()


@dataclass(frozen=True, slots=True)
class KeyEntry:
    digest: bytes  # SHA-256 of the key
    account: Account


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def _digest_field(text: str, where: str) -> bytes:
    hex_part = text[len(DIGEST_PREFIX) :].lower()
    if not _HEX_DIGEST.fullmatch(hex_part):
        raise KeyFileError(f"{where}: expected sha256:<64 hex digits>")
    return bytes.fromhex(hex_part)


def default_name(digest: bytes) -> str:
    return "key-" + digest.hex()[:8]


def parse_key_line(line: str, where: str) -> KeyEntry | None:
    """One line of a key file (None: blank or comment only); KeyFileError naming
    `where` when it is malformed. Never echoes the digest or any value back."""
    words = line.split("#", 1)[0].split()
    if not words:
        return None
    if not words[0].startswith(DIGEST_PREFIX):
        raise KeyFileError(f"{where}: a line starts with sha256:<hex digest of the key>")
    digest = _digest_field(words[0], where)
    name = default_name(digest)
    limits: dict[str, int | float] = {}
    for word in words[1:]:
        field, sep, value = word.partition("=")
        if not sep:
            raise KeyFileError(f"{where}: expected FIELD=VALUE after the digest")
        if field == "name":
            if not _NAME.fullmatch(value):
                raise KeyFileError(f"{where}: name: 1-64 of A-Z a-z 0-9 . _ : @ -")
            name = value
        elif field in LIMIT_FIELDS:
            if not value.isdigit():
                raise KeyFileError(f"{where}: {field}: expected a whole number >= 0")
            limits[field] = int(value)
        elif field == "weight":
            try:
                weight = float(value)
            except ValueError:
                weight = float("nan")
            if not 0.0 < weight <= 1e6:  # also refuses NaN
                raise KeyFileError(f"{where}: weight: expected a number in (0, 1e6]")
            limits[field] = weight
        else:
            known = ", ".join(("name", *LIMIT_FIELDS, "weight"))
            raise KeyFileError(f"{where}: unknown field {field!r}; known: {known}")
    return KeyEntry(digest, Account(name, KeyLimits(**limits)))  # type: ignore[arg-type]


def parse_key_file(text: str, source: str = "api_keys_file") -> list[KeyEntry]:
    """Every key of a key file's text, in file order."""
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = parse_key_line(line, f"{source} line {number}")
        if entry is not None:
            entries.append(entry)
    return entries


def parse_env_keys(text: str, source: str = "PRISM_API_KEYS") -> list[KeyEntry]:
    """`PRISM_API_KEYS`: keys (or `sha256:<hex>` digests) separated by commas or
    white space, each under its default account name and the default limits."""
    entries = []
    for index, word in enumerate(re.split(r"[,\s]+", text.strip())):
        if not word:
            continue
        where = f"{source} entry {index + 1}"
        digest = _digest_field(word, where) if word.startswith(DIGEST_PREFIX) else digest_of(word)
        entries.append(KeyEntry(digest, Account(default_name(digest))))
    return entries


class KeyTable:
    """The accepted keys' digests and their accounts.

    `lookup` hashes the presented key and compares it with every digest in constant
    time (`hmac.compare_digest`, no early exit), so the answer's timing does not tell
    which digest bytes matched."""

    def __init__(self, entries: list[KeyEntry]) -> None:
        by_digest: dict[bytes, Account] = {}
        accounts: dict[str, Account] = {}
        for entry in entries:
            account = entry.account
            if entry.digest in by_digest:
                continue  # listed twice (file and environment): the first line wins
            known = accounts.get(account.name)
            if known is not None and known != account:
                raise KeyFileError(f"account {account.name!r}: its keys give it different limits")
            accounts[account.name] = account
            by_digest[entry.digest] = account
        if len(by_digest) > MAX_KEYS:
            raise KeyFileError(f"more than {MAX_KEYS} keys")
        self._entries = list(by_digest.items())
        self.accounts = accounts

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: str) -> Account | None:
        """The account of `key`, or None when it is no accepted key."""
        presented = digest_of(key)
        found: Account | None = None
        for digest, account in self._entries:
            if hmac.compare_digest(digest, presented):
                found = account
        return found


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request presents: `Authorization: Bearer <key>` (OpenAI's clients),
    else `x-api-key` (Anthropic-style clients); None when neither holds one."""
    if authorization:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    if x_api_key and x_api_key.strip():
        return x_api_key.strip()
    return None


def weight_of(table: KeyTable | None) -> Callable[[str], float]:
    """The fair-share weight of an account name (1 unless its key file line says)."""
    accounts = table.accounts if table is not None else {}

    def weight(name: str) -> float:
        account = accounts.get(name)
        return account.limits.weight if account is not None else 1.0

    return weight
