"""The simulated engine's time model and hardware/model profiles (SPEC §7).

    prefill batch time = c0 + uncached_tokens / R_pf + q · Σ_i extend_i · seq_i
    decode step time   = d0 + d1 · running_requests

`extend_i` is request i's uncached tokens in this batch and `seq_i` its sequence length
after the batch (the optional quadratic attention term, off when `q = 0`). A profile is a
JSON file: a name in `prism_sim/profiles/` or a path. The derivation of the default
`a800-qwen3-4b` numbers is in docs/simulated-engine.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

PROFILE_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "a800-qwen3-4b"


@dataclass(frozen=True)
class Profile:
    """Costs (seconds, tokens) of one model on one accelerator."""

    name: str
    model_name: str
    prefill_overhead_s: float
    prefill_tokens_per_s: float
    decode_overhead_s: float
    decode_per_request_s: float
    kv_capacity_tokens: int
    max_running_requests: int
    chunked_prefill_size: int | None
    prefill_attention_s_per_token2: float = 0.0
    kv_bytes_per_token: int = 0
    context_length: int = 32768
    hardware: str = ""

    def __post_init__(self) -> None:
        if self.prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be positive")
        if min(self.prefill_overhead_s, self.decode_overhead_s, self.decode_per_request_s) < 0:
            raise ValueError("time costs must be non-negative")
        if self.prefill_attention_s_per_token2 < 0:
            raise ValueError("prefill_attention_s_per_token2 must be non-negative")
        if self.kv_capacity_tokens <= 0 or self.max_running_requests <= 0:
            raise ValueError("kv_capacity_tokens and max_running_requests must be positive")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size <= 0:
            raise ValueError("chunked_prefill_size must be positive (or null to disable)")

    def with_overrides(self, **overrides: Any) -> Profile:
        """A copy with the non-None overrides applied (CLI flags)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


@dataclass(frozen=True)
class PrefillItem:
    """One request's share of a prefill batch."""

    extend_tokens: int
    seq_tokens: int


def load_profile(spec: str | None = None) -> Profile:
    """Load a profile by name (from `prism_sim/profiles/`) or from a JSON file path."""
    spec = spec or DEFAULT_PROFILE
    path = Path(spec)
    if not path.suffix:
        path = PROFILE_DIR / f"{spec}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.json")))
        raise FileNotFoundError(f"no profile {spec!r} (known: {known})")
    raw = json.loads(path.read_text())
    allowed = {f.name for f in fields(Profile)}
    unknown = set(raw) - allowed
    if unknown:
        raise ValueError(f"unknown profile fields in {path}: {sorted(unknown)}")
    return Profile(**raw)


def prefill_time_s(profile: Profile, items: Sequence[PrefillItem]) -> float:
    """Modeled duration of one prefill (extend) batch."""
    uncached = sum(item.extend_tokens for item in items)
    quadratic = sum(item.extend_tokens * item.seq_tokens for item in items)
    return (
        profile.prefill_overhead_s
        + uncached / profile.prefill_tokens_per_s
        + profile.prefill_attention_s_per_token2 * quadratic
    )


def decode_time_s(profile: Profile, running_requests: int) -> float:
    """Modeled duration of one decode step over `running_requests` sequences."""
    return profile.decode_overhead_s + profile.decode_per_request_s * running_requests
