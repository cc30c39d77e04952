"""Time model and profiles of the simulated engine (SPEC §7), on hand-computed cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_support import profile

from prism_sim.time_model import (
    PrefillItem,
    decode_time_s,
    load_profile,
    prefill_time_s,
)


def test_prefill_is_overhead_plus_uncached_over_rate() -> None:
    # 0.01 + (300 + 200) / 1000 = 0.51 s; cached tokens cost nothing without q.
    items = [PrefillItem(300, 1000), PrefillItem(200, 200)]
    assert prefill_time_s(profile(), items) == pytest.approx(0.51)


def test_prefill_quadratic_term() -> None:
    # q · Σ extend·seq = 1e-6 · (300·1000 + 200·200) = 0.34 s on top of 0.51 s.
    p = profile(prefill_attention_s_per_token2=1e-6)
    items = [PrefillItem(300, 1000), PrefillItem(200, 200)]
    assert prefill_time_s(p, items) == pytest.approx(0.85)


def test_decode_is_overhead_plus_per_request() -> None:
    # 0.005 + 0.001 · 40 = 0.045 s
    assert decode_time_s(profile(), 40) == pytest.approx(0.045)
    assert decode_time_s(profile(), 0) == pytest.approx(0.005)


def test_default_profile_matches_qwen3_4b_on_a800() -> None:
    p = load_profile()
    assert p.name == "a800-qwen3-4b"
    # 2 (K,V) · 36 layers · 8 KV heads · 128 head_dim · 2 bytes (bf16)
    assert p.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456
    # SGLang 0.5.23 on an 81,920 MiB GPU: chunked_prefill_size 8192, decode graph bs 256,
    # reserved = 512 + 1.5·8192 + 1024/8 + 2·256 = 13,440 MiB,
    # mem_fraction_static = round((81920 − 13440) / 81920, 3) = 0.836;
    # KV = 81920 MiB · 0.836 − 4.022e9 params · 2 B, over 147,456 B/token, floor to 1000.
    gpu_mib = 81920
    fraction = round((gpu_mib - (512 + 1.5 * 8192 + 1024 / 8 + 2 * 256)) / gpu_mib, 3)
    assert fraction == 0.836
    kv_bytes = gpu_mib * 2**20 * fraction - 4.022e9 * 2
    assert p.kv_capacity_tokens == int(kv_bytes / p.kv_bytes_per_token) // 1000 * 1000
    assert p.chunked_prefill_size == 8192 and p.max_running_requests == 2048


def test_profile_from_path_and_overrides(tmp_path: Path) -> None:
    data = json.loads(
        (Path(__file__).parents[1] / "prism_sim/profiles/a800-qwen3-4b.json").read_text()
    )
    data["name"] = "custom"
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(data))
    p = load_profile(str(path)).with_overrides(kv_capacity_tokens=1234, max_running_requests=None)
    assert (p.name, p.kv_capacity_tokens) == ("custom", 1234)
    assert p.max_running_requests == data["max_running_requests"]


def test_bad_profiles_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_profile("no-such-profile")
    with pytest.raises(ValueError):
        profile(prefill_tokens_per_s=0)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "typo_field": 1}))
    with pytest.raises(ValueError):
        load_profile(str(bad))
