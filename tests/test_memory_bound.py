"""Distinct segments uploaded through the proxy (a real subprocess in front of prism-sim)
grow its RSS by no more than its caches' configured bytes plus a constant:
before the caches were bounded in bytes, each MB of distinct segments kept ~11 MB."""

from __future__ import annotations

from bench.memory_bound import SEGMENT_CHARS, SEGMENTS_PER_REQUEST, measure

# Heap the proxy may hold beyond its caches: a request's transient allocations (a 1 MB
# body, its texts and token lists) that the allocator keeps for reuse, and fragmentation.
SLACK_MB = 64
UPLOAD_MB = 64


def test_uploading_distinct_segments_keeps_rss_within_the_cache_bounds(tmp_path) -> None:
    run = measure(megabytes=UPLOAD_MB, cache_mib=4, log_dir=tmp_path)
    requests = int(UPLOAD_MB * 1e6 // (SEGMENTS_PER_REQUEST * SEGMENT_CHARS))
    assert run.statuses == {400: requests}  # each tokenized, forwarded, refused by the engine
    assert run.cache_held_mb <= run.cache_capacity_mb
    assert run.growth_mb <= run.cache_capacity_mb + SLACK_MB, run
