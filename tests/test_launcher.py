"""The launcher (`loadgen.stack.processes`): settings become command lines that the
servers' own parsers read back as those settings, and a line spec `name[key=value;...]`
is read in one place. No server is started: each command line goes through the real
parser of the server it is for."""

from __future__ import annotations

import pytest

import prism_sim.cli
import sglang_cpu.serve
from loadgen.stack.processes import engine_args, parse_line, parse_settings, proxy_args
from prism_proxy.config_sources import parse_serve_args


def test_proxy_settings_reach_the_proxys_config_by_flag_or_set() -> None:
    args = proxy_args(
        {
            "backend": "http://127.0.0.1:9",
            "policy": "prism",
            "qas": "paper",  # the file key of `qas_variant`, a flag of its own
            "window_ms": 2.5,
            "q_cold": 4,  # no flag of its own: `--set`
            "sessions": False,
            "prefill_batch": None,  # left out: the proxy's default stays
            "log_level": "warning",
        }
    )
    assert args[0] == "serve"
    assert args[3:5] == ["--policy", "prism"] and "--set" in args
    config = parse_serve_args(args[1:], environ={})
    default = parse_serve_args([], environ={})
    assert config.backend == "http://127.0.0.1:9"
    assert config.policy == "prism" and config.qas_variant == "paper"
    assert config.window_ms == 2.5 and config.qas.q_cold == 4
    assert config.sessions is False and config.log_level == "warning"
    assert config.prefill_batch == default.prefill_batch


def test_prism_sim_reads_its_settings_back() -> None:
    args = engine_args(
        {"speed": 4.0, "kv_capacity_tokens": 900, "eviction": "dart", "control_port": None}
    )
    assert args == ["--speed", "4", "--kv-capacity-tokens", "900", "--eviction", "dart"]
    parsed = prism_sim.cli.build_parser().parse_args(args)
    assert parsed.speed == 4.0 and parsed.kv_capacity_tokens == 900
    assert parsed.control_port is None


def test_sglangs_own_settings_go_through_its_passthrough() -> None:
    settings = {"schedule_policy": "lpm", "incremental_streaming_output": True, "x": False}
    args = engine_args({"model": "tiny", "max_total_tokens": 4096, "sglang": settings})
    parsed = sglang_cpu.serve.build_parser().parse_args(args)
    assert parsed.max_total_tokens == 4096
    assert parsed.sglang_arg == ["--schedule-policy lpm", "--incremental-streaming-output"]


def test_a_line_spec_is_a_name_and_its_settings() -> None:
    assert parse_line("prism[prefill_batch=16;q_cold=4]") == (
        "prism",
        {"prefill_batch": "16", "q_cold": "4"},
    )
    assert parse_line("direct") == ("direct", {})
    assert parse_line("fifo[]") == ("fifo", {})
    assert parse_settings(["a=1", "", "b=x=y"]) == {"a": "1", "b": "x=y"}
    for bad in ("prism[q_cold=4", "prism[q_cold]", "prism[=4]"):
        with pytest.raises(ValueError):
            parse_line(bad)


def test_peer_settings_become_their_command_lines() -> None:
    """smg, sglang-router and ContextPilot get the flags they were always given."""
    from loadgen.stack.peer_lines import CONTEXTPILOT_REAL, HOST
    from loadgen.stack.peers_launch import SglangRouter, Smg
    from loadgen.stack.processes import peer_args

    args = peer_args({"a_b": ["u1", "u2"], "on": True, "off": False, "none": None, "n": 0}, ["go"])
    assert args == ["go", "--a-b", "u1", "u2", "--on", "--n", "0"]

    def without_port(args: list[str]) -> list[str]:
        at = args.index("--prometheus-port")
        assert args[at + 1].isdigit()
        return args[:at] + args[at + 2 :]

    smg = without_port(Smg().args("http://e", served_model="s", client_model="c"))
    assert smg == [
        "launch", "--host", HOST, "--worker-urls", "http://e", "--disable-tokenizer-autoload",
        "--prometheus-host", HOST, "--log-level", "warn", "--policy", "round_robin",
        "--disable-retries", "--disable-circuit-breaker", "--disable-load-monitoring",
        "--load-monitor-interval", "3600", "--max-concurrent-requests", "0",
        "--model-alias", "c=s",
    ]  # fmt: skip
    assert without_port(Smg(defaults=True).args("http://e")) == smg[:10]
    router = without_port(SglangRouter().args("http://e"))
    assert router == [
        "--host", HOST, "--worker-urls", "http://e", "--prometheus-host", HOST,
        "--log-level", "warn", "--policy", "round_robin", "--disable-retries",
        "--disable-circuit-breaker",
    ]  # fmt: skip
    assert CONTEXTPILOT_REAL.args("http://e") == [
        "--host", HOST, "--infer-api-url", "http://e", "--log-level", "warning",
    ]  # fmt: skip
