"""The sweep (fresh engine + proxy per point, real subprocesses) and its report."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from loadgen.cli import main
from loadgen.reports.report import (
    comparison_table,
    load_results,
    load_runs,
    over_seeds,
    paired,
    t_interval,
    t_quantile_975,
    write_report,
)
from loadgen.stack.lines import spec_lines

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_line_specs() -> None:
    specs = "fifo,prism,sglang-lpm,prism[eviction=lru],prism[eviction=lru+active],"
    specs += "prism[q_cold=0],prism[q_cold=4],prism[qas=paper],"
    specs += "fifo[prefill_batch=16],prism[prefill_batch=16;q_cold=2]"
    lines = spec_lines(specs.split(","))
    assert [
        (v.label, v.policy, v.eviction, v.qas_overrides, v.schedule_policy, v.prefill_batch, v.qas)
        for v in lines
    ] == [
        ("fifo", "fifo", "lru", (), "fcfs", None, None),
        ("prism", "prism", "dart", (), "fcfs", None, None),
        ("sglang-lpm", None, "lru", (), "lpm", None, None),  # native: no proxy
        ("prism[eviction=lru]", "prism", "lru", (), "fcfs", None, None),
        ("prism[eviction=lru+active]", "prism", "lru+active", (), "fcfs", None, None),
        ("prism[q_cold=0]", "prism", "dart", (("q_cold", 0),), "fcfs", None, None),
        ("prism[q_cold=4]", "prism", "dart", (("q_cold", 4),), "fcfs", None, None),
        ("prism[qas=paper]", "prism", "dart", (), "fcfs", None, "paper"),
        ("fifo[prefill_batch=16]", "fifo", "lru", (), "fcfs", 16, None),
        ("prism[prefill_batch=16;q_cold=2]", "prism", "dart", (("q_cold", 2),), "fcfs", 16, None),
    ]
    for spec, error in [
        ("lifo", "unknown policy"),
        ("prism[b=16]", "unknown b"),
        ("fifo[q_cold=4]", "prism's"),
        ("sglang-lpm[prefill_batch=8]", "needs a proxy line"),
        ("prism[qas=nope]", "unknown QAS variant"),
        ("prism[q_cold=4", "expected name"),
    ]:
        with pytest.raises(ValueError, match=error):
            spec_lines([spec])


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
    # Each run records the settings the proxy says it ran with ...
    prism = docs["prism_qps40.json"]["variant"]["proxy_settings"]
    assert prism["policy"] == "prism" and prism["qas_variant"] == "full"
    assert prism["residency"] == "dart" and prism["control_rpc"] is True
    assert prism["window_ms"] == 2.5  # 10 ms of modeled time at speed 4
    assert prism["prefill_batch"]["mode"] == "auto" and prism["prefill_batch"]["value"] >= 1
    fifo = docs["fifo_qps40.json"]["variant"]["proxy_settings"]
    assert fifo["residency"] == "none" and fifo["control_rpc"] is False
    assert docs["sglang-hrrn_qps40.json"]["variant"]["proxy_settings"] is None
    assert all(doc["variant"]["seed"] == 3 for doc in docs.values())
    # ... the manifest the settings each line was set to, and the report lists them.
    assert manifest["seeds"] == [3] and manifest["settings"]["prism"]["prefill_batch"] == "auto"
    assert manifest["settings"]["prism"]["qas"]["w_c"] == 1e4
    report = (out / "report.md").read_text()
    commit = manifest["git_commit"]  # None outside a git checkout
    assert "## Settings" in report and (commit is None or f"at commit `{commit}`" in report)
    assert "| prism | full | auto (" in report and "| 10 | dart | on | dart | prism |" in report
    assert "| sglang-hrrn | no proxy | — | — | — | — | off | lru (hrrn) | native |" in report


def _t_half_width(values: list[float], t: float) -> float:
    """The 95 % t half-width computed independently: t · s / √n with statistics.stdev."""
    return t * statistics.stdev(values) / math.sqrt(len(values))


def test_t_interval_against_hand_computation() -> None:
    values = [1.0, 2.0, 4.0]  # mean 7/3, s = √(7/3) = 1.5275, t_{0.975,2} = 4.303
    interval = t_interval(values)
    assert interval is not None and interval.n == 3
    assert interval.mean == pytest.approx(7 / 3)
    assert interval.half_width == pytest.approx(_t_half_width(values, 4.303))
    assert interval.half_width == pytest.approx(3.7949, abs=1e-4)  # 4.303 · √7 / 3, by hand
    assert (interval.low, interval.high) == pytest.approx((7 / 3 - 3.7949, 7 / 3 + 3.7949), 1e-4)
    five = [10.0, 12.0, 9.0, 11.0, 13.0]
    assert t_interval(five).half_width == pytest.approx(_t_half_width(five, 2.776))
    one = t_interval([5.0, None])  # missing values are left out; one value: no interval
    assert one is not None and (one.mean, one.half_width, one.low, one.n) == (5.0, None, None, 1)
    assert t_interval([None]) is None
    # Beyond the table: t_{0.975,40} = 2.0211, t_{0.975,60} = 2.0003, t_{0.975,120} = 1.9799.
    for df, t in ((1, 12.706), (30, 2.042), (40, 2.0211), (60, 2.0003), (120, 1.9799)):
        assert t_quantile_975(df) == pytest.approx(t, abs=2e-4)


def _seeded(p99_s: float, hit: float, throughput: float) -> dict:
    return {**_summary(p99_s, hit), "request_throughput": throughput}


def test_aggregation_over_seeds_and_paired_ratios() -> None:
    runs = {
        "prism": {40.0: {0: _seeded(1.0, 0.5, 30.0), 1: _seeded(2.0, 0.4, 31.0),
                         2: _seeded(3.0, 0.6, 32.0)}},
        "fifo": {40.0: {0: _seeded(2.0, 0.2, 29.0), 1: _seeded(4.0, 0.3, 30.0),
                        2: _seeded(4.0, 0.1, 28.0)}},
    }  # fmt: skip
    cells = over_seeds(runs)["prism"][40.0]
    p99 = cells["p99_ttft_ms"]
    assert p99["values"] == {"0": 1000.0, "1": 2000.0, "2": 3000.0} and p99["n"] == 3
    assert p99["mean"] == pytest.approx(2000.0)
    assert p99["half_width"] == pytest.approx(_t_half_width([1000.0, 2000.0, 3000.0], 4.303))
    assert p99["half_width"] == pytest.approx(2484.34, abs=0.01)  # 4.303 · 1000 / √3
    assert cells["mean_ttft_ms"]["mean"] == pytest.approx(800.0)  # _summary: p99 · 400
    assert cells["hit_rate"]["mean"] == pytest.approx(0.5)
    assert cells["hit_rate"]["half_width"] == pytest.approx(_t_half_width([0.5, 0.4, 0.6], 4.303))
    assert cells["request_throughput"]["low"] == pytest.approx(31.0 - 4.303 / math.sqrt(3))
    # Paired by seed: prism / fifo of P99 = 0.5, 0.5, 0.75.
    ratio = paired(runs)["fifo"][40.0]["p99_ttft_ratio"]
    assert ratio["values"] == pytest.approx({"0": 0.5, "1": 0.5, "2": 0.75})
    assert ratio["mean"] == pytest.approx(0.5833333)
    assert ratio["half_width"] == pytest.approx(_t_half_width([0.5, 0.5, 0.75], 4.303))
    assert paired(runs)["fifo"][40.0]["mean_ttft_ratio"]["mean"] == pytest.approx(0.5833333)
    # Only seeds both lines ran are paired; without prism there is nothing to pair.
    runs["fifo"][40.0].pop(2)
    assert paired(runs)["fifo"][40.0]["p99_ttft_ratio"]["values"] == {"0": 0.5, "1": 0.5}
    assert paired({"fifo": runs["fifo"]}) == {}


def test_report_over_seeds(tmp_path: Path) -> None:
    """Result files of three seeds: means in the tables, intervals and the paired
    comparison in their own section, one detail row per seed, all in summaries.json."""
    results = tmp_path / "results"
    results.mkdir()
    table = {
        "fifo": [(2.0, 0.2), (4.0, 0.3), (4.0, 0.1)],
        "prism": [(1.0, 0.5), (2.0, 0.4), (3.0, 0.6)],
    }
    for label, per_seed in table.items():
        for seed, (p99, hit) in enumerate(per_seed):
            doc = {"variant": {"label": label, "qps": 40.0, "seed": seed},
                   "summary": _summary(p99, hit)}  # fmt: skip
            (results / f"{label}_qps40_seed{seed}.json").write_text(json.dumps(doc))
    assert sorted(load_runs(results)["prism"][40.0]) == [0, 1, 2]
    means = load_results(results)  # a line and QPS: the mean over its seeds
    assert means["fifo"][40.0]["p99_ttft_ms"] == pytest.approx(10000 / 3)
    assert means["fifo"][40.0]["hot"]["hit_rate"] == pytest.approx(0.3)
    paths = write_report(results, out_dir=tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "**Over 3 seeds (0, 1, 2): mean ± half-width of the 95 % Student-t interval**" in report
    assert "| prism | 40 | 3 | 2.00 ± 2.48 | 0.80 ± 0.99 | 50.0% ± 24.8 | 9.5 ± 0.0 |" in report
    assert "| fifo | 40 | 0.58 [0.22, 0.94] | 0.50, 0.50, 0.75 | 0.58 [0.22, 0.94] |" in report
    assert "**P99 TTFT (s) by offered QPS, mean over 3 seeds**" in report
    assert "| prism | 2.00 | 2.00 | -40.0% | -40.0% |" in report  # vs fifo's 3.33 s
    assert "| prism | 40 | 2 | 10 | 0 | 9.5 | 1.20 |" in report  # seed 2's detail row
    assert paths.table_text.startswith("**Over 3 seeds")
    assert "## Settings" not in report  # these results carry none
    compact = json.loads((tmp_path / "summaries.json").read_text())
    assert compact["seeds"] == [0, 1, 2] and compact["confidence"] == 0.95
    line = compact["lines"]["prism"]["40"]
    assert line["seeds"]["1"]["p99_ttft_ms"] == 2000.0
    assert line["over_seeds"]["p99_ttft_ms"]["mean"] == pytest.approx(2000.0)
    assert line["over_seeds"]["hit_rate"]["values"] == {"0": 0.5, "1": 0.4, "2": 0.6}
    against = compact["paired"]["against"]["fifo"]["40"]["p99_ttft_ratio"]
    assert compact["paired"]["reference"] == "prism"
    assert against["mean"] == pytest.approx(0.5833333) and against["n"] == 3


def test_twin_over_two_seeds_through_the_cli(tmp_path: Path) -> None:
    """`simulate --seed 0,1`: a full sweep per seed on its own trace, results named by
    seed, each with its TwinSetup; the report and summaries.json aggregate them. A
    single `--seed` keeps the old names and summaries.json."""
    out = tmp_path / "twin"
    argv = ["simulate", "--out", str(out), "--qps", "40", "--num-requests", "60"]
    assert main([*argv, "--policies", "fifo,prism", "--seed", "0,1"]) == 0
    names = sorted(p.name for p in (out / "results").glob("*.json"))
    assert names == [f"{lb}_qps40_seed{k}.json" for lb in ("fifo", "prism") for k in (0, 1)]
    traces = sorted(p.name for p in (out / "traces").glob("*.jsonl"))
    assert traces == ["rag_n60_qps40_seed0.jsonl", "rag_n60_qps40_seed1.jsonl"]
    docs = {p.stem: json.loads(p.read_text()) for p in (out / "results").glob("*.json")}
    for stem, doc in docs.items():
        seed = int(stem[-1])
        assert doc["variant"]["seed"] == doc["trace"]["seed"] == seed
        assert doc["variant"]["twin_setup"]["seed"] == seed
    setup = docs["prism_qps40_seed1"]["variant"]["twin_setup"]
    assert setup["policy"] == "prism" and setup["qas"]["w_c"] == 1e4
    assert setup["prefill_batch"] is None  # automatic
    assert docs["prism_qps40_seed1"]["proxy_state"]["residency"] == "dart"
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["seeds"] == [0, 1] and manifest["settings"]["prism"]["qas_variant"] == "full"
    assert manifest["settings"]["fifo"]["control_rpc"] is False
    assert manifest["settings"]["prism"]["control_rpc"] is True
    compact = json.loads((out / "summaries.json").read_text())
    p99 = [docs[f"prism_qps40_seed{k}"]["summary"]["p99_ttft_ms"] for k in (0, 1)]
    cell = compact["lines"]["prism"]["40"]["over_seeds"]["p99_ttft_ms"]
    assert cell["values"] == {"0": p99[0], "1": p99[1]}
    assert cell["mean"] == pytest.approx(sum(p99) / 2)
    assert cell["half_width"] == pytest.approx(_t_half_width(p99, 12.706))
    fifo = [docs[f"fifo_qps40_seed{k}"]["summary"]["p99_ttft_ms"] for k in (0, 1)]
    ratio = compact["paired"]["against"]["fifo"]["40"]["p99_ttft_ratio"]
    assert ratio["values"] == pytest.approx({"0": p99[0] / fifo[0], "1": p99[1] / fifo[1]})
    report = (out / "report.md").read_text()
    assert "**Over 2 seeds (0, 1)" in report and "## Settings" in report
    assert "| prism | full | auto (" in report
    # One seed: the old layout.
    single = tmp_path / "single"
    assert (
        main(["simulate", "--out", str(single), *argv[3:], "--policies", "fifo", "--seed", "3"])
        == 0
    )
    assert [p.name for p in (single / "results").glob("*.json")] == ["fifo_qps40.json"]
    assert json.loads((single / "summaries.json").read_text())["fifo"]["40"]["completed"] == 60
    assert "Over " not in (single / "report.md").read_text()
