"""The sweep (fresh engine + proxy per point, real subprocesses) and its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.cli import main
from loadgen.report import comparison_table, load_results, write_report
from loadgen.variants import make_variants

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_variants() -> None:
    variants = make_variants(
        ["fifo", "prism", "sglang-lpm"], ["lru", "lru+active", "dart"], [0, 4], [16]
    )
    assert [
        (v.label, v.policy, v.eviction, v.q_cold, v.schedule_policy, v.prefill_batch)
        for v in variants
    ] == [
        ("fifo", "fifo", "lru", None, "fcfs", None),
        ("prism", "prism", "dart", None, "fcfs", None),
        ("sglang-lpm", None, "lru", None, "lpm", None),  # native: no proxy
        ("prism[lru]", "prism", "lru", None, "fcfs", None),
        ("prism[lru+active]", "prism", "lru+active", None, "fcfs", None),
        ("prism[q_cold=0]", "prism", "dart", 0, "fcfs", None),
        ("prism[q_cold=4]", "prism", "dart", 4, "fcfs", None),
        ("fifo[B=16]", "fifo", "lru", None, "fcfs", 16),
        ("prism[B=16]", "prism", "dart", None, "fcfs", 16),
    ]
    with pytest.raises(ValueError, match="unknown policy"):
        make_variants(["lifo"], [], [])


def _summary(p99_s: float, hit: float) -> dict:
    return {
        "completed": 10,
        "failed": 0,
        "request_throughput": 9.5,
        "mean_ttft_ms": p99_s * 400,
        "median_ttft_ms": p99_s * 300,
        "p90_ttft_ms": p99_s * 800,
        "p95_ttft_ms": p99_s * 900,
        "p99_ttft_ms": p99_s * 1000,
        "hit_rate": hit,
        "hot": {"hit_rate": hit + 0.1},
        "cold": {"hit_rate": hit - 0.1},
    }


def test_report_from_results(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    table = {"fifo": (4.0, 0.2), "klpm": (2.0, 0.3), "prism": (1.5, 0.5)}
    for label, (p99, hit) in table.items():
        for qps, factor in ((40.0, 1.0), (80.0, 2.0)):
            doc = {"variant": {"label": label, "qps": qps}, "summary": _summary(p99 * factor, hit)}
            (results / f"{label}_{qps:g}.json").write_text(json.dumps(doc))
    loaded = load_results(results)
    assert sorted(loaded) == ["fifo", "klpm", "prism"] and sorted(loaded["prism"]) == [40, 80]
    text = comparison_table(loaded)
    # prism's mean P99 is (1.5+3)/2 = 2.25 s; klpm's (2+4)/2 = 3 s: −25 %; fifo's 6 s: −62.5 %.
    assert "| prism | 1.50 | 3.00 | 2.25 | -25.0% | -62.5% |" in text
    assert "Strongest baseline (lowest mean P99 TTFT): klpm." in text
    assert "**Winner on mean P99 TTFT: prism** (2.25 s)." in text
    assert "prism's mean P99 TTFT is 62.5 % lower than fifo's (2.25 s vs 6.00 s)." in text
    assert "prism's mean P99 TTFT is 25.0 % lower than klpm's" in text
    assert "| prism | 50.0% | 50.0% | 50.0% |" in text
    paths = write_report(results, out_dir=tmp_path)
    names = sorted(p.name for p in paths.files)
    assert names == sorted(
        [
            "report.md",
            "summaries.json",
            "p99_ttft_vs_qps.png",
            "hit_rate_vs_qps.png",
            "throughput_vs_qps.png",
        ]
    )
    compact = json.loads((tmp_path / "summaries.json").read_text())
    assert compact["klpm"]["80"]["p99_ttft_ms"] == 4000.0
    for path in paths.files:
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == PNG_MAGIC
    assert "![p99_ttft_vs_qps](p99_ttft_vs_qps.png)" in (tmp_path / "report.md").read_text()
    # Rebuilt in place (the default output dir): its own summaries.json is not a result.
    again = write_report(results)
    assert (results / "summaries.json") in again.files
    assert json.loads((results / "summaries.json").read_text()) == compact


def test_small_sweep_end_to_end(tmp_path: Path) -> None:
    """Two proxy policies and native SGLang × one QPS on fresh engines (and proxies),
    then the report."""
    out = tmp_path / "sweep"
    argv = ["sweep", "--out", str(out), "--policies", "fifo,prism,sglang-hrrn", "--qps", "40"]
    assert main([*argv, "--num-requests", "24", "--speed", "4", "--seed", "3"]) == 0
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["command"].startswith("prism-loadgen ") and manifest["speed"] == 4.0
    docs = {p.name: json.loads(p.read_text()) for p in (out / "results").glob("*.json")}
    assert sorted(docs) == ["fifo_qps40.json", "prism_qps40.json", "sglang-hrrn_qps40.json"]
    for name, doc in docs.items():
        assert doc["summary"]["completed"] == 24, name
        assert doc["config"]["time_scale"] == 4.0
        assert doc["config"]["api"] == ("native" if name.startswith("sglang") else "prism")
    native = docs["sglang-hrrn_qps40.json"]["variant"]
    assert (
        native["proxy_args"] == []
        and native["sim_args"][native["sim_args"].index("--schedule-policy") + 1] == "hrrn"
    )
    assert docs["prism_qps40.json"]["variant"]["eviction"] == "dart"
    assert docs["fifo_qps40.json"]["variant"]["eviction"] == "lru"
    assert "--control-url" in docs["prism_qps40.json"]["variant"]["proxy_args"]
    assert docs["prism_qps40.json"]["engine_state"]["radix_eviction_policy"] == "dart"
    # One trace per QPS, shared by both policies.
    assert len(list((out / "traces").glob("*.jsonl"))) == 1
    assert (out / "report.md").exists() and (out / "p99_ttft_vs_qps.png").exists()
