"""Issue 37's over-seeds table (`bench.sessions_over_seeds`) reads one seed from several
runs of the same name (more lines run apart)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.sessions_over_seeds import load, report


def _row(line: str, p99: float, jct: float, hit: float) -> dict:
    summary = {"p99_ttft_ms": p99, "mean_jct_ms": jct, "hit_rate": hit}
    return {"rate": 0.5, "tool_scale": 1.0, "kv_fraction": 0.5, "line": line,
            "summary": summary, "belady_hit_rate": 0.9,
            "unlimited": {"mean_jct_ms": 50_000.0}}  # fmt: skip


def test_runs_of_one_seed_are_merged_and_compared(tmp_path: Path) -> None:
    first, second = tmp_path / "a" / "seed3", tmp_path / "b" / "seed3"
    for directory, rows in (
        (first, [_row("sglang-lru", 1000, 60_000, 0.80), _row("mine", 500, 55_000, 0.85)]),
        (second, [_row("continuum-style", 2000, 56_000, 0.86)]),
    ):
        directory.mkdir(parents=True)
        (directory / "results.json").write_text(json.dumps(rows))
    points = load([first, second])
    assert set(points[0.5, 1.0, 0.5]["seed3"]) == {"sglang-lru", "mine", "continuum-style"}
    text = report([first, second], "mine")
    # best native 60 s, never-evict 50 s: 5 of the 10 s recovered; P99 half LRU's
    assert "| seed3 | 0.850 | 0.900 | 0.860 (continuum-style) | 55.0 | 60.0 | 50.0 | 0.50 |" in text
    assert "P99 TTFT: / sglang-lru 0.50; / best other line 0.50 (largest 0.50)" in text


def test_lines_left_out_are_not_compared(tmp_path: Path) -> None:
    seed = tmp_path / "seed0"
    seed.mkdir()
    rows = [_row("sglang-lru", 1000, 60_000, 0.80), _row("mine", 500, 55_000, 0.85),
            _row("bigger-pool", 400, 52_000, 0.90)]  # fmt: skip
    (seed / "results.json").write_text(json.dumps(rows))
    assert "0.900 (bigger-pool)" in report([seed], "mine")
    text = report([seed], "mine", without={"bigger-pool"})
    assert "(left out: bigger-pool)" in text and "bigger-pool)" not in text.split("\n", 2)[2]
    assert "| seed0 | 0.850 | 0.900 | 0.800 (sglang-lru) |" in text
