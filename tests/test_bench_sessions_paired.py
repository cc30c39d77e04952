"""`bench.sessions_paired`: two lines of the same results files, seed by seed."""

from __future__ import annotations

import json
from pathlib import Path

from bench.sessions_paired import main
from prism_proxy.admission.reprefill import Cause


def _row(line: str, hit: float, jct_s: float, p99_s: float, late: int) -> dict:
    causes = {c.value: 0 for c in Cause} | {"late": late}
    return {
        "rate": 1.0, "tool_scale": 1.0, "kv_fraction": 0.5, "line": line,
        "summary": {"hit_rate": hit, "mean_jct_ms": jct_s * 1e3, "p99_ttft_ms": p99_s * 1e3,
                    "reprefill_tokens": causes | {"total": late}},
    }  # fmt: skip


def test_pairs_are_compared_within_each_seed(tmp_path: Path, capsys) -> None:
    for seed, (jct, late) in enumerate([(50.0, 1000), (200.0, 3000)]):
        directory = tmp_path / f"seed{seed}"
        directory.mkdir()
        rows = [_row("a", 0.5, jct, 1.0, late), _row("b", 0.52, jct * 0.9, 2.0, 0)]
        (directory / "results.json").write_text(json.dumps(rows))
    assert main([str(tmp_path / "seed0"), str(tmp_path / "seed1"), "--pair", "a,b"]) == 0
    out = capsys.readouterr().out
    assert "`b` against `a`" in out
    assert "| seed1 | 0.500 → 0.520 | 1.00 → 2.00 | 200.0 → 180.0 | 3,000 → 0 |" in out
    # over seeds: +2 points each; JCT 0.9 and P99 2.0 on both; late summed over seeds
    assert "hit 2.00 ± 0.00 points; mean JCT ratio 0.900 [0.900, 0.900]; P99 ratio 2.000" in out
    assert "late 4,000 → 0" in out
