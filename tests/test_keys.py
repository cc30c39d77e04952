"""Client API keys (issue 36): the key file and `PRISM_API_KEYS` parsed, the lookup
table, and the per-account usage table behind the per-key limits. Pure."""

from __future__ import annotations

import hashlib

import pytest

from prism_proxy.config import ConfigError
from prism_proxy.config_sources import build_config, parse_serve_args
from prism_proxy.edge.account_limits import AccountUsage, Limits
from prism_proxy.edge.keys import (
    Account,
    KeyFileError,
    KeyLimits,
    KeyTable,
    parse_env_keys,
    parse_key_file,
    presented_key,
)


def _hex(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_key_file_lines_give_accounts_and_limits() -> None:
    text = f"""
# team keys
sha256:{_hex("alpha-secret")} name=alpha max_inflight=4 tokens_per_minute=1000 weight=2
sha256:{_hex("beta-secret").upper()}   # no name: key-<8 hex>

"""
    first, second = parse_key_file(text)
    assert first.account == Account("alpha", KeyLimits(4, None, 1000, 2.0))
    assert second.account == Account("key-" + _hex("beta-secret")[:8], KeyLimits())
    table = KeyTable([first, second])
    assert table.lookup("alpha-secret") == first.account
    assert table.lookup("beta-secret") == second.account
    assert table.lookup("alpha-secret ") is None
    assert table.lookup("") is None


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("alpha-secret", "starts with sha256:"),
        ("sha256:abc", "64 hex digits"),
        (f"sha256:{_hex('k')} max_inflight=-1", "whole number"),
        (f"sha256:{_hex('k')} weight=0", "weight"),
        (f"sha256:{_hex('k')} weight=nan", "weight"),
        (f"sha256:{_hex('k')} colour=red", "unknown field"),
        (f"sha256:{_hex('k')} name", "FIELD=VALUE"),
        (f"sha256:{_hex('k')} name=a/b", "name"),
    ],
)
def test_bad_lines_are_named_by_line(line: str, complaint: str) -> None:
    with pytest.raises(KeyFileError, match=complaint) as caught:
        parse_key_file(f"# header\n{line}\n")
    assert "line 2" in str(caught.value)
    assert _hex("k") not in str(caught.value)  # no digest echoed


def test_env_keys_take_plain_keys_and_digests() -> None:
    entries = parse_env_keys(f"one-key, sha256:{_hex('two-key')}\nthree-key")
    table = KeyTable(entries)
    assert len(table) == 3
    assert all(table.lookup(k) is not None for k in ("one-key", "two-key", "three-key"))


def test_one_account_cannot_have_two_sets_of_limits() -> None:
    text = f"sha256:{_hex('a')} name=team max_queued=1\nsha256:{_hex('b')} name=team\n"
    with pytest.raises(KeyFileError, match="different limits"):
        KeyTable(parse_key_file(text))
    rotating = f"sha256:{_hex('a')} name=team\nsha256:{_hex('b')} name=team\n"
    table = KeyTable(parse_key_file(rotating))
    assert table.lookup("a") == table.lookup("b") == Account("team")


@pytest.mark.parametrize(
    ("authorization", "x_api_key", "key"),
    [
        ("Bearer sk-1", None, "sk-1"),
        ("bearer  sk-1 ", None, "sk-1"),
        ("Basic abc", None, None),
        ("Bearer ", "sk-2", "sk-2"),
        (None, "sk-2", "sk-2"),
        (None, None, None),
    ],
)
def test_presented_key(authorization: str | None, x_api_key: str | None, key: str | None) -> None:
    assert presented_key(authorization, x_api_key) == key


def test_api_keys_never_from_the_command_line() -> None:
    with pytest.raises(ConfigError, match="PRISM_API_KEYS"):
        parse_serve_args(["--set", "api_keys=sk-secret"], environ={})
    config = build_config({}, {"PRISM_API_KEYS": "sk-secret", "PRISM_KEY_MAX_QUEUED": "3"})
    assert config.api_keys == "sk-secret" and config.key_max_queued == 3
    assert "sk-secret" not in repr(config)


def test_usage_counts_in_flight_and_queued() -> None:
    usage = AccountUsage()
    limits = Limits(max_inflight=2, max_queued=1)
    assert usage.open("a", limits, 0.0) is None
    assert usage.queue("a", limits, 0.0) is None
    assert usage.open("a", limits, 0.0) is None  # 2 in flight
    refusal = usage.queue("a", limits, 0.0)  # one queued already
    assert refusal is not None and "max_queued 1" in refusal.message
    refusal = usage.open("a", limits, 0.0, retry_after_s=3)
    assert refusal is not None and "max_inflight 2" in refusal.message
    assert refusal.retry_after_s == 3
    assert usage.open("b", limits, 0.0) is None  # another account is not held
    usage.unqueue("a", 1.0)  # released
    assert usage.holding("a") == (2, 0)
    usage.close("a", 1.0)
    usage.close("a", 1.0)
    assert usage.holding("a") == (0, 0)
    assert len(usage) == 1  # a holds nothing: forgotten; b still in flight


def test_tokens_per_minute_bucket_refills() -> None:
    """60 tokens per minute refill at 1 a second. An answer of 90 tokens leaves the
    bucket at 60 - 90 = -30: refused for ceil((1 + 30) / 1) = 31 s, then admitted."""
    usage = AccountUsage()
    limits = Limits(tokens_per_minute=60)
    assert usage.open("a", limits, 0.0) is None
    usage.charge("a", 90, 60, 0.0)
    usage.close("a", 0.0)
    refusal = usage.open("a", limits, 0.0)
    assert refusal is not None and refusal.retry_after_s == 31
    assert usage.open("a", limits, 30.0) is not None  # -30 + 30 = 0: still empty
    assert usage.open("a", limits, 31.0) is None
