"""The simulated engine's host-memory tier (SGLang's hierarchical cache, SPEC §7):
write-through copies, load-back at PCIe cost instead of recompute, a bounded host pool."""

from __future__ import annotations

import pytest
from sim_support import profile

from prism_sim.cli import build_parser, config_from_args
from prism_sim.engine import SimConfig, SimEngine
from prism_sim.host_tier import HostTier, HostTierConfig, host_capacity_tokens
from prism_sim.native_api import meta_info
from prism_sim.radix_cache import RadixCache
from prism_sim.request import SimRequest
from prism_sim.scheduler import Batch, Scheduler, SchedulerConfig

FILLER = [900, 901, 902]
BYTES_PER_TOKEN = 1000
BANDWIDTH = 1e6  # bytes/s: 1000 tokens/s, as fast as this profile's prefill


def scheduler(kv_tokens: int, host_tokens: int | None) -> Scheduler:
    p = profile(kv_capacity_tokens=kv_tokens, kv_bytes_per_token=BYTES_PER_TOKEN)
    clock = iter(range(1, 10**9))
    cache = RadixCache("lru", clock=lambda: float(next(clock)))
    host = None
    if host_tokens is not None:
        config = HostTierConfig(host_tokens, BYTES_PER_TOKEN, BANDWIDTH)
        host = HostTier(config, cache)
    return Scheduler(SchedulerConfig.from_profile(p), p, cache, FILLER, host_tier=host)


def run(s: Scheduler, rid: str, ids: list[int], now: float) -> tuple[SimRequest, list[Batch]]:
    """Serve one request to its end; the request and its batches."""
    r = SimRequest(rid, ids, 2, now)
    s.add_request(r, now)
    batches = []
    while (batch := s.next_batch(now)) is not None:
        now += batch.duration_s
        s.complete_batch(batch, now)
        batches.append(batch)
    return r, batches


A = list(range(1, 301))  # a 300-token history
B = list(range(1001, 1301))  # another one that pushes A off a 400-token device pool
A2 = [*A, 7, 8]  # A's continuation


def test_a_prefix_evicted_from_the_device_is_loaded_from_host_not_recomputed() -> None:
    s = scheduler(kv_tokens=400, host_tokens=1000)
    run(s, "a", A, 0.0)
    run(s, "b", B, 10.0)
    # A's tokens are gone from the device tree but kept on host
    assert s.cache.match_prefix(A[:-1]).prefix_len < len(A) - 1
    assert s.host_tier is not None and s.host_tier.match(A[:-1]) == len(A) - 1
    device_len = s.cache.match_prefix(A2).prefix_len
    r, batches = run(s, "a2", A2, 20.0)
    host_hit = len(A) - device_len
    assert host_hit > 0
    # cached_tokens counts the host hit, as SGLang's does; the separate counter too
    assert r.cached_tokens == len(A)
    assert r.host_hit_tokens == host_hit
    assert s.stats.host_hit_tokens_total == host_hit
    # the prefill computes the 2 new tokens and pays the copy: c0 + 2/R + h·bytes/bw
    prefill = batches[0]
    assert prefill.kind == "prefill" and prefill.parts[0].extend_tokens == 2
    expected = 0.01 + 2 / 1000.0 + host_hit * BYTES_PER_TOKEN / BANDWIDTH
    assert prefill.duration_s == pytest.approx(expected)
    assert s.stats.host_load_s_total == pytest.approx(host_hit * BYTES_PER_TOKEN / BANDWIDTH)
    # the loaded tokens are device-resident again, and no KV slot leaked
    assert s.cache.match_prefix(A).prefix_len == len(A)
    assert s.held_tokens_total == 0 and s.stats.kv_overcommit_tokens == 0
    assert s.used_tokens <= 400


def test_without_the_host_tier_the_same_request_is_recomputed() -> None:
    s = scheduler(kv_tokens=400, host_tokens=None)
    run(s, "a", A, 0.0)
    run(s, "b", B, 10.0)
    device_len = s.cache.match_prefix(A2).prefix_len
    r, batches = run(s, "a2", A2, 20.0)
    assert r.cached_tokens == device_len and r.host_hit_tokens == 0
    extend = len(A) + 2 - device_len
    assert batches[0].duration_s == pytest.approx(0.01 + extend / 1000.0)


def test_the_host_pool_is_bounded_and_evicts_copies_no_longer_on_the_device() -> None:
    s = scheduler(kv_tokens=400, host_tokens=700)
    histories = [list(range(k * 1000 + 1, k * 1000 + 301)) for k in range(4)]
    for n, ids in enumerate(histories):
        run(s, f"h{n}", ids, 10.0 * n)
        assert s.host_tier is not None
        assert s.host_tier.size_tokens() <= 700
    host = s.host_tier
    assert host is not None and host.host_evicted_tokens_total > 0
    # the oldest history went from the host; the newest is on the device and on host
    assert host.match(histories[0][:-1]) == 0
    assert s.cache.match_prefix(histories[3]).prefix_len == len(histories[3])
    assert host.match(histories[3]) == len(histories[3])


def test_host_eviction_keeps_copies_of_what_is_still_on_the_device() -> None:
    device = RadixCache("lru", clock=iter(range(1, 10**6)).__next__)
    host = HostTier(HostTierConfig(600, BYTES_PER_TOKEN, BANDWIDTH), device)
    old, gone, new = (list(range(k, k + 300)) for k in (1, 1001, 2001))
    device.insert(old)
    host.backup(old)
    host.backup(gone)  # a copy whose device slots were evicted since
    device.insert(new)
    host.backup(new)
    # `old` is the least recently used copy but still on the device: `gone` goes
    assert host.size_tokens() == 600 and host.host_evicted_tokens_total == 300
    assert host.match(old) == len(old) and host.match(gone) == 0
    assert host.failed_backup_tokens_total == 0


def test_with_no_device_eviction_the_host_tier_changes_no_timing() -> None:
    """Write-through costs no forward time and nothing is ever loaded back."""

    def timeline(host_tokens: int | None) -> list[tuple[float | None, float | None, int]]:
        s = scheduler(kv_tokens=100_000, host_tokens=host_tokens)
        out = []
        for n, ids in enumerate([A, B, A2, [*B, 5], A]):
            r, _ = run(s, f"r{n}", ids, 10.0 * n)
            out.append((r.first_token_s, r.finish_s, r.cached_tokens))
        assert s.stats.host_hit_tokens_total == 0
        return out

    assert timeline(1000) == timeline(None)


def test_off_by_default_and_the_flags_mirror_sglang() -> None:
    args = build_parser().parse_args([])
    config = config_from_args(args)
    assert config.enable_hierarchical_cache is False
    assert config.host_tier_config(config.resolved_profile()) is None
    args = build_parser().parse_args(["--enable-hierarchical-cache", "--hicache-ratio", "1.5"])
    config = config_from_args(args)
    host = config.host_tier_config(config.resolved_profile())
    assert host is not None and host.write_policy == "write_through"
    assert host.capacity_tokens == int(1.5 * config.resolved_profile().kv_capacity_tokens)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--hicache-write-policy", "write_back"])


@pytest.mark.parametrize(
    "bad",
    [
        {"hicache_ratio": 0.0},
        {"hicache_bandwidth_gbps": 0.0},
        {"hicache_write_policy": "write_back"},
        {"kv_capacity_tokens": 100, "profile": "cpu-smollm2", "hicache_size": 1e-9},
    ],
)
def test_bad_host_tier_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        config = SimConfig(enable_hierarchical_cache=True, **bad)  # type: ignore[arg-type]
        config.host_tier_config(config.resolved_profile())


def test_hicache_size_overrides_the_ratio() -> None:
    assert host_capacity_tokens(1000, 2.0, 0.0, 100) == 2000
    assert host_capacity_tokens(1000, 2.0, 1.0, 100_000) == 10_000


def test_the_engine_reports_host_hits_as_sglang_does() -> None:
    """`meta_info.cached_tokens_details` and `sglang:cached_tokens{cache_source}`."""
    engine = SimEngine(SimConfig(kv_capacity_tokens=400, enable_hierarchical_cache=True))
    s = engine.scheduler
    run(s, "a", A, 0.0)
    run(s, "b", B, 10.0)
    r, _ = run(s, "a2", A2, 20.0)
    assert r.host_hit_tokens > 0
    details = meta_info(engine, r)["cached_tokens_details"]
    assert details == {"device": len(A) - r.host_hit_tokens, "host": r.host_hit_tokens}
    sample = engine.metrics.registry.get_sample_value
    labels = {"model_name": engine.model_name}
    host = sample("sglang:cached_tokens_total", {**labels, "cache_source": "host"})
    assert host == r.host_hit_tokens
    assert "cached_tokens_details" not in meta_info(SimEngine(SimConfig()), r)
