"""The sweep harness with a real model on the CPU server: the server's
arguments, the tokenizer that follows the model, and the twin-vs-real table's numbers.
No server is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.experiments.sweep import SweepConfig, model_tokenizer, sglang_cpu_command
from loadgen.experiments.twin_vs_real import comparison_table, point_metrics, tpot_ms
from loadgen.stack.cpu_models import CPU_MODELS
from loadgen.stack.lines import base_line


def test_smollm2_server_gets_its_model_pool_and_memory_fraction() -> None:
    config = SweepConfig(out=Path("x"), lines=(), backend="sglang-cpu", model="smollm2")
    args = sglang_cpu_command(config, base_line("fifo"), 0)
    assert args[:2] == ["--model", "smollm2"]
    assert "--sglang-arg=--mem-fraction-static 0.3" in args
    assert args[args.index("--max-total-tokens") + 1] == "131072"
    assert args[args.index("--eviction") + 1] == "stock"
    prism = sglang_cpu_command(config, base_line("prism"), 31001)
    assert prism[prism.index("--eviction") + 1] == "dart"
    assert prism[prism.index("--control-port") + 1] == "31001"


def test_tiny_keeps_its_pool_and_the_builtin_tokenizer() -> None:
    config = SweepConfig(out=Path("x"), lines=(), backend="sglang-cpu", kv_capacity_tokens=900)
    args = sglang_cpu_command(config, base_line("fifo"), 0)
    assert args[:2] == ["--model", "tiny"]
    assert args[args.index("--max-total-tokens") + 1] == "900"
    assert CPU_MODELS["tiny"].kv_tokens == 65536
    assert model_tokenizer("tiny", "builtin", "unused") == "builtin"
    assert model_tokenizer("smollm2", "/some/dir", "unused") == "/some/dir"


def _request(ttft: float, e2e: float, tokens: int, ok: bool = True) -> dict:
    return {"success": ok, "ttft_ms": ttft, "e2e_latency_ms": e2e, "completion_tokens": tokens}


def test_tpot_is_the_median_decode_time_per_token() -> None:
    # (1000-100)/9 = 100, (2100-300)/9 = 200, (900-0)/3 = 300; failures and 1-token answers out
    requests = [
        _request(100, 1000, 10),
        _request(300, 2100, 10),
        _request(0, 900, 4),
        _request(50, 60, 1),
        _request(10, 99999, 10, ok=False),
    ]
    assert tpot_ms(requests) == pytest.approx(200.0)
    assert tpot_ms([]) is None


def test_comparison_rows_and_ratios() -> None:
    summary = {
        "median_ttft_ms": 500.0,
        "p90_ttft_ms": 1000.0,
        "p99_ttft_ms": 2000.0,
        "request_throughput": 0.8,
        "hit_rate": 0.2,
    }
    real = point_metrics({"summary": summary, "requests": [_request(100, 1000, 10)]})
    twin = {**real, "P99 TTFT": 3.0}
    table = comparison_table([("fifo", 0.5, real, twin)]).splitlines()
    assert table[2] == "| fifo | 0.5 | real | 0.50 | 1.00 | 2.00 | 0.80 | 20.0 % | 100 |"
    assert table[4] == "| fifo | 0.5 | twin/real | 1.00 | 1.00 | 1.50 | 1.00 | 1.00 | 1.00 |"


def test_idle_arrivals_are_those_with_nothing_in_flight() -> None:
    from loadgen.experiments.twin_vs_real import idle_arrivals
    from prism_sim.time_model import load_profile

    def req(arrival: float, e2e_s: float, ttft_s: float, cached: int) -> dict:
        return {
            "success": True,
            "arrival_s": arrival,
            "e2e_latency_ms": 1000 * e2e_s,
            "ttft_ms": 1000 * ttft_s,
            "prompt_tokens": 764,
            "cached_tokens": cached,
        }

    # The second arrives while the first is in flight; the third finds the engine idle.
    requests = [req(0.0, 2.0, 0.9, 0), req(1.0, 2.0, 3.0, 0), req(10.0, 1.0, 0.5, 330)]
    profile = load_profile("cpu-smollm2")
    count, ttft, model = idle_arrivals(requests, profile)
    assert count == 2
    assert ttft == pytest.approx(0.7)
    assert model > 0
