"""One type of a line (`loadgen.stack.lines.Line`): every experiment's named lines are of
it, and both the twin's setup and the real stack's command lines come from it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loadgen.experiments.session_lines import LINES, REAL_LINES
from loadgen.experiments.session_real import stack_settings
from loadgen.experiments.sweep import SweepConfig, proxy_command, sim_command
from loadgen.stack.lines import (
    ALL_POLICIES,
    KNOWN_LINES,
    SESSION_TIMES,
    Line,
    line_engine_settings,
    line_proxy_settings,
    spec_line,
)
from loadgen.stack.processes import engine_args, proxy_args
from loadgen.twin.line_setup import session_features, twin_setup
from prism_proxy.admission.sessions import SessionParams
from prism_proxy.config_sources import parse_serve_args
from prism_proxy.qas.params import qas_params

# The names results files and docs refer to.
SESSION_NAMES = (
    "sglang-lru", "sglang-lpm", "sglang-hrrn", "sglang-slru", "sglang-tlru", "fifo",
    "continuum-style",
    "prism", "prism+sessions", "prism+sessions+returns", "prism+sessions+returns+precedence",
    "prism+sessions+returns+backlog", "prism+sessions+returns+backlog/cap16",
    "prism+sessions+returns/call", "prism+sessions+returns+backlog/call",
    "prism+sessions+returns/lpm-unpaced", "prism+sessions+returns/hrrn-unpaced",
    "prism+sessions+returns/lpm", "prism+sessions+returns+backlog/lpm",
    "prism+sessions/lru", "prism+sessions+precedence",
    "prism+precedence", "sglang-lru+host", "prism+sessions+returns+host",
    "prism+sessions+returns/unpaced+host", "prism+sessions+returns/lru+host",
    "prism+sessions+returns/lpm-unpaced+host", "prism+sessions+returns+backlog+host",
    "sglang-lru+host/ratio1", "sglang-lru+host/8gbps",
    "sglang-lru+host/ratio4", "prism+sessions+returns+host/ratio4",
    "prism+sessions+returns+host/ttl300", "prism+sessions+returns+host/ratio4/q99",
    "prism+sessions+returns+host/q99",
    "prism+sessions+known", "prism+sessions+known+host", "prism+sessions+known+host/ttl3600",
    "prism+sessions+known+host/ratio4", "prism+sessions+known+host/ratio4/ttl3600",
)  # fmt: skip
REAL_NAMES = (
    "sglang-lru", "sglang-lpm", "sglang-hrrn", "prism", "prism+sessions",
    "prism+sessions+returns", "prism+sessions+returns+backlog",
    "prism+sessions+returns/lpm-unpaced", "prism+sessions+returns/hrrn-unpaced",
    "continuum-style", "sglang-lru+host", "prism+sessions+returns+host",
)  # fmt: skip


def test_every_named_line_is_a_line_of_its_name() -> None:
    assert tuple(LINES) == SESSION_NAMES and tuple(REAL_LINES) == REAL_NAMES
    for table in (LINES, REAL_LINES):
        assert all(isinstance(line, Line) and line.label == name for name, line in table.items())
    assert all(REAL_LINES[name] is LINES[name] for name in REAL_LINES)  # the twin's own
    for name in (*KNOWN_LINES, "prism[q_cold=4]", "fifo[prefill_batch=16]"):
        assert isinstance(spec_line(name), Line) and spec_line(name).label == name
    assert set(ALL_POLICIES) <= set(KNOWN_LINES)


def test_the_real_stack_args_of_a_line_come_from_it() -> None:
    line = REAL_LINES["prism+sessions+returns+backlog"]
    sim, proxy = stack_settings(line, 5000, 4.0, 31001)
    assert engine_args(sim) == [
        "--kv-capacity-tokens", "5000", "--speed", "4", "--log-level", "warning",
        "--eviction", "dart", "--control-port", "31001",
    ]  # fmt: skip
    assert proxy is not None
    assert proxy_args(proxy) == [
        "serve", "--control-url", "http://127.0.0.1:31001", "--window-ms", "2.5",
        "--log-level", "warning", "--policy", "prism", "--qas", "full",
        "--set", "sessions=true", "--set", "session_rank=predicted",
        # the session table's times, in the engine's time as in the twin
        "--set", "session_max_ttl_s=15", "--set", "session_min_ttl_s=0.125",
        "--set", "session_default_ttl_s=2.5", "--set", "session_credit_half_life_s=15",
        "--set", "backlog_ms=250", "--set", "age_cap_ms=2000",
        "--set", "cold_deadline_ms=500",  # the variant's 2 s deadline, in the engine's time
    ]  # fmt: skip
    assert "cold_deadline_ms" not in stack_settings(line, 5000, 1.0, 31001)[1]  # the variant's
    # the proxy those args start keeps a paused session as long in the engine's time as
    # the twin's table does (its clock runs at a quarter of the engine's)
    table = parse_serve_args(proxy_args(proxy)[1:], environ={}).session_params()
    twin = SessionParams()
    for name in ("max_ttl_s", "min_ttl_s", "default_ttl_s", "credit_half_life_s"):
        assert getattr(table, name) * 4.0 == getattr(twin, name), name
    at_speed_1 = stack_settings(line, 5000, 1.0, 31001)[1]
    assert at_speed_1 is not None and not any(name in at_speed_1 for name in SESSION_TIMES)
    # another line, other args: each setting is the line's
    other = replace(line, eviction="lru", session_rank="recent", qas_overrides=())
    sim, proxy = stack_settings(other, 5000, 4.0, 31001)
    assert "dart" not in engine_args(sim) and proxy is not None
    assert proxy["session_rank"] == "recent" and "backlog_ms" not in proxy
    # no proxy: the engine alone, no control RPC
    sim, proxy = stack_settings(REAL_LINES["sglang-lru"], 5000, 4.0, None)
    assert proxy is None and "--control-port" not in engine_args(sim)
    # the engine's own order over every request: its policy, and B past any queue
    sim, proxy = stack_settings(REAL_LINES["prism+sessions+returns/lpm-unpaced"], 5000, 4.0, 31001)
    assert engine_args(sim)[-4:] == ["--schedule-policy", "lpm", "--control-port", "31001"]
    assert proxy is not None and proxy_args(proxy)[-2:] == ["--prefill-batch", "1024"]
    # the host tier is prism-sim's (SGLang's flag), under the proxy's line too
    sim, proxy = stack_settings(REAL_LINES["prism+sessions+returns+host"], 5000, 4.0, 31001)
    assert engine_args(sim)[-5:] == [
        "--eviction", "dart", "--enable-hierarchical-cache", "--control-port", "31001"
    ] and proxy is not None  # fmt: skip
    sim, proxy = stack_settings(REAL_LINES["sglang-lru+host"], 5000, 4.0, None)
    assert engine_args(sim)[-1] == "--enable-hierarchical-cache" and proxy is None
    # continuum-style retains paused sessions: DART's control RPC without P̂_t
    continuum = REAL_LINES["continuum-style"]
    assert continuum.control_rpc and not continuum.pushes_priorities


def test_every_session_line_runs_in_the_twin_and_the_real_ones_on_the_stack() -> None:
    for name, line in LINES.items():
        setup = twin_setup(line, kv_capacity_tokens=1000)
        assert (setup.policy, setup.eviction, setup.schedule_policy) == (
            line.policy,
            line.eviction,
            line.schedule_policy,
        ), name
        assert setup.kv_capacity_tokens == 1000 and setup.hicache == line.hicache
    for line in REAL_LINES.values():
        stack_settings(line, 1000, 4.0, 31001)
    with pytest.raises(ValueError, match="detects and retains together"):
        line_proxy_settings(LINES["prism+precedence"])  # the twin alone separates them
    with pytest.raises(ValueError, match="has no proxy"):
        line_proxy_settings(LINES["sglang-lru"])


def test_the_twin_setup_of_a_line() -> None:
    backlog = LINES["prism+sessions+returns+backlog/cap16"]
    setup = twin_setup(backlog, kv_capacity_tokens=1000)
    assert setup.qas == qas_params("full", {"backlog_ms": 1000.0, "age_cap_ms": 16_000.0})
    features = session_features(backlog)
    assert features is not None and features.detect and features.retain
    assert (features.params.rank, features.params.retain_from) == ("predicted", "end")
    at_call = session_features(LINES["prism+sessions+returns/call"])
    assert at_call is not None and at_call.params.retain_from == "call"
    precedence = session_features(LINES["prism+precedence"])
    assert precedence is not None and precedence.detect and not precedence.retain
    tlru = twin_setup(LINES["sglang-tlru"])
    assert tlru.eviction_config == {"threshold": 2048, "next_prompt_estimate": 700}
    ratio = twin_setup(LINES["sglang-lru+host/ratio1"])
    assert ratio.hicache and ratio.hicache_ratio == 1.0
    for name in ("sglang-lru+host/ratio4", "prism+sessions+returns+host/ratio4"):
        assert twin_setup(LINES[name]).hicache_ratio == 4.0
    # a line's session settings: the twin's table in modeled time, the proxy's times in
    # its own (divided by the speed), its other settings as they are
    longer = LINES["prism+sessions+returns+host/ttl300"]
    features = session_features(longer)
    assert features is not None and features.params.max_ttl_s == 300.0
    assert line_proxy_settings(longer)["session_max_ttl_s"] == 300.0
    assert line_proxy_settings(longer, speed=4.0)["session_max_ttl_s"] == 75.0
    q99 = LINES["prism+sessions+returns+host/q99"]
    features = session_features(q99)
    assert features is not None and features.params.ttl_quantile == 0.99
    assert line_proxy_settings(q99, speed=4.0)["session_ttl_quantile"] == 0.99
    assert "session_max_ttl_s" not in line_proxy_settings(q99)
    assert "session_max_ttl_s" not in line_proxy_settings(LINES["prism+sessions+returns+host"])
    with pytest.raises(ValueError, match="the proxy has no session_min_samples"):
        line_proxy_settings(replace(q99, session_overrides=(("min_samples", 4),)))
    # the known-returns bound: the twin's table ranks by its return model, which knows;
    # no proxy can run it
    known = LINES["prism+sessions+known+host/ttl3600"]
    features = session_features(known)
    assert features is not None and features.known_returns and features.params.rank == "predicted"
    assert features.params.max_ttl_s == 3600.0 and twin_setup(known).hicache
    assert not session_features(LINES["prism+sessions+returns+host"]).known_returns  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="knows return times"):
        line_proxy_settings(known)
    assert session_features(spec_line("prism")) is None  # the sweep's lines set none
    # the sweep's QAS variant and `--set qas.NAME=X` reach prism lines only
    overrides = (("cold_deadline_ms", 500.0),)
    prism = twin_setup(spec_line("prism[q_cold=4]"), qas="paper", qas_overrides=overrides)
    assert prism.qas == qas_params("paper", {"cold_deadline_ms": 500.0, "q_cold": 4})
    assert twin_setup(spec_line("fifo"), qas="paper", qas_overrides=overrides).qas == qas_params(
        "paper"
    )


def test_host_tier_and_eviction_config_reach_the_engine() -> None:
    settings = line_engine_settings(LINES["sglang-lru+host/8gbps"], at_defaults=False)
    assert settings == {"enable_hierarchical_cache": True, "hicache_bandwidth_gbps": 8.0}
    tlru = engine_args(line_engine_settings(LINES["sglang-tlru"], at_defaults=False))
    assert tlru == [
        "--eviction", "tlru", "--radix-eviction-policy-config",
        '{"threshold": 2048, "next_prompt_estimate": 700}',
    ]  # fmt: skip


def test_the_sweep_commands_of_a_spec_line() -> None:
    config = SweepConfig(out=Path("x"), lines=(), speed=2.0, qas_overrides=(("w_c", 0.0),))
    line = spec_line("prism[q_cold=4;prefill_batch=8]")
    assert sim_command(config, line, 31001) == [
        "--profile", "a800-qwen3-4b", "--speed", "2", "--eviction", "dart",
        "--schedule-policy", "fcfs", "--seed", "0", "--tokenizer", "builtin",
        "--control-port", "31001",
    ]  # fmt: skip
    assert proxy_command(config, line, "http://b", 31001) == [
        "serve", "--backend", "http://b", "--policy", "prism", "--tokenizer", "builtin",
        "--window-ms", "5", "--log-level", "warning",
        "--control-url", "http://127.0.0.1:31001", "--qas", "full",
        # and the session table's times
        "--set", "session_max_ttl_s=30", "--set", "session_min_ttl_s=0.25",
        "--set", "session_default_ttl_s=5", "--set", "session_credit_half_life_s=30",
        "--set", "w_c=0", "--set", "q_cold=4",
        # at speed 2 the QAS times in force are halved (the variant's 2 s deadline, the
        # default 8 s age cap)
        "--set", "cold_deadline_ms=1000", "--set", "age_cap_ms=4000", "--prefill-batch", "8",
    ]  # fmt: skip
